#!/usr/bin/env bash
# The hot paths' instruction counts under callgrind, paceline beside governor (and
# tower-governor for the HTTP layer, whose own cost is reported as `http_layer`), checked
# against benches/instructions.baseline: a paceline count more than TOLERANCE percent
# above its baseline fails (instruction counts do not drift with machine load the way
# times do), and so does a refusal that costs the HTTP layer more than REFUSAL_RATIO times
# what an admission costs it. `bash benches/instructions.sh --update` writes the baseline
# anew.
set -euo pipefail
cd "$(dirname "$0")/.."
TOLERANCE=${PACELINE_INSTRUCTIONS_TOLERANCE:-5}
ITERATIONS=20000
baseline=benches/instructions.baseline

command -v valgrind >/dev/null || { apt-get update >/dev/null && apt-get install -y valgrind >/dev/null; }
# One binary per family of workloads (benches/instructions/harness.rs says why).
families="direct keyed http proxied tonic"
for family in $families; do examples+=(--example "instructions_$family"); done
cargo build --locked --profile instructions -p paceline-benches "${examples[@]}" 2>&1 | tail -1

declare -A count
printf '%-34s %12s\n' "workload" "instructions"
# Counts every workload of the binary instructions_$1.
measure_family() {
  local family=$1
  local bin="${CARGO_TARGET_DIR:-target}/instructions/examples/instructions_$family"
  [ -x "$bin" ] || { echo "no $bin after the build"; exit 1; }
  for workload in $("$bin" list); do
    out="$(mktemp)"
    valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
      --toggle-collect="instructions_$family::harness::measured" "$bin" "$workload" "$ITERATIONS" \
      >/dev/null 2>"$out"
    collected=$(grep -oE 'Collected : [0-9]+' "$out" | grep -oE '[0-9]+$')
    rm -f "$out"
    [ "${collected:-0}" -gt 0 ] || { echo "callgrind counted nothing for $workload"; exit 1; }
    per=$(awk -v c="$collected" -v n="$ITERATIONS" 'BEGIN { printf "%.1f", c / n }')
    count[$workload]=$per
    printf '%-34s %12s\n' "$workload" "$per"
  done
}
for family in $families; do measure_family "$family"; done
# The HTTP layer with the `metrics` feature on (a build of its own: features unify within
# one build) and Prometheus's recorder installed.
cargo build --locked --profile instructions -p paceline-benches --features metrics \
  --example instructions_metrics 2>&1 | tail -1
measure_family metrics
for path in call refused; do
  awk -v on="${count[http_${path}_metrics/paceline]}" -v off="${count[http_$path/paceline]}" \
    -v p="$path" 'BEGIN { printf "metrics on adds %.1f instructions to an http_%s\n", on - off, p }'
done

# The HTTP layers' own cost: each layered call minus the same call without a layer.
for path in call proxied proxied_returning proxied_sparse tonic; do
  for who in paceline governor; do
    call="http_$path"
    [ "$path" = tonic ] && call=tonic_call
    count[${call}_layer/$who]=$(awk -v a="${count[$call/$who]}" \
      -v b="${count[$call/bare]}" 'BEGIN { printf "%.1f", a - b }')
    printf '%-34s %12s\n' "${call}_layer/$who" "${count[${call}_layer/$who]}"
  done
done

# A refusal's cost to each layer: the refused request minus a bare service that answers
# the same 429 with the same four fields, prebuilt (what any layer pays at least to send
# them). Beside it, the same layer's cost for an admitted request.
for who in paceline governor; do
  count[http_refused_layer/$who]=$(awk -v a="${count[http_refused/$who]}" \
    -v b="${count[http_refused/floor]}" 'BEGIN { printf "%.1f", a - b }')
  printf '%-34s %12s\n' "http_refused_layer/$who" "${count[http_refused_layer/$who]}"
done
# A refusal may cost the layer at most REFUSAL_RATIO times what an admission costs it.
REFUSAL_RATIO=1.2
if ! awk -v r="${count[http_refused_layer/paceline]}" -v a="${count[http_call_layer/paceline]}" \
  -v max="$REFUSAL_RATIO" 'BEGIN {
    printf "a refusal costs paceline%s layer %.3fx what an admission does (at most %sx)\n", "'"'"'s", r / a, max
    exit !(r / a <= max) }'; then
  echo "a refusal costs the layer more than ${REFUSAL_RATIO}x an admission"
  refusal_too_dear=1
fi

echo
echo "paceline over governor, same workload:"
for workload in "${!count[@]}"; do
  case "$workload" in
    */paceline)
      peer="${workload%/paceline}/governor"
      if [ -n "${count[$peer]:-}" ]; then
        awk -v a="${count[$workload]}" -v b="${count[$peer]}" -v w="${workload%/paceline}" \
          'BEGIN { printf "  %-28s %5.2fx (%s vs %s)\n", w, a / b, a, b }'
      fi ;;
  esac
done | sort

if [ "${1:-}" = "--update" ]; then
  for workload in "${!count[@]}"; do echo "$workload ${count[$workload]}"; done | sort > "$baseline"
  echo "wrote $baseline"
  exit 0
fi

status=${refusal_too_dear:-0}
while read -r workload expected; do
  case "$workload" in */paceline) ;; *) continue ;; esac
  now="${count[$workload]:-}"
  if [ -z "$now" ]; then
    echo "MISSING: $workload is in the baseline but was not measured"; status=1; continue
  fi
  if awk -v now="$now" -v base="$expected" -v t="$TOLERANCE" 'BEGIN { exit !(now > base * (1 + t / 100)) }'; then
    echo "REGRESSION: $workload costs $now instructions, baseline $expected (+${TOLERANCE}% allowed)"
    status=1
  fi
done < "$baseline"
[ "$status" = 0 ] && echo "instruction counts within ${TOLERANCE}% of $baseline, refusals within ${REFUSAL_RATIO}x"
exit "$status"
