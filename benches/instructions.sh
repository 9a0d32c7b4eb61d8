#!/usr/bin/env bash
# The hot paths' instruction counts under callgrind, paceline beside governor (and
# tower-governor for the HTTP layer, whose own cost is reported as `http_layer`), checked
# against benches/instructions.baseline: a paceline count more than TOLERANCE percent
# above its baseline fails (instruction counts do not drift with machine load the way
# times do). `bash benches/instructions.sh --update` writes the baseline anew.
set -euo pipefail
cd "$(dirname "$0")/.."
TOLERANCE=${PACELINE_INSTRUCTIONS_TOLERANCE:-5}
ITERATIONS=20000
baseline=benches/instructions.baseline

command -v valgrind >/dev/null || { apt-get update >/dev/null && apt-get install -y valgrind >/dev/null; }
cargo build --locked --profile instructions -p paceline-benches --example instructions 2>&1 | tail -1
bin="${CARGO_TARGET_DIR:-target}/instructions/examples/instructions"
[ -x "$bin" ] || { echo "no $bin after the build"; exit 1; }

declare -A count
printf '%-34s %12s\n' "workload" "instructions"
for workload in $("$bin" list); do
  out="$(mktemp)"
  valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
    --toggle-collect='instructions::measured' "$bin" "$workload" "$ITERATIONS" \
    >/dev/null 2>"$out"
  collected=$(grep -oE 'Collected : [0-9]+' "$out" | grep -oE '[0-9]+$')
  rm -f "$out"
  per=$(awk -v c="$collected" -v n="$ITERATIONS" 'BEGIN { printf "%.1f", c / n }')
  count[$workload]=$per
  printf '%-34s %12s\n' "$workload" "$per"
done

# The HTTP layers' own cost: each layered call minus the same call without a layer.
if [ -n "${count[http_call/bare]:-}" ]; then
  for who in paceline governor; do
    count[http_layer/$who]=$(awk -v a="${count[http_call/$who]}" -v b="${count[http_call/bare]}" \
      'BEGIN { printf "%.1f", a - b }')
    printf '%-34s %12s\n' "http_layer/$who" "${count[http_layer/$who]}"
  done
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

status=0
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
[ "$status" = 0 ] && echo "instruction counts within ${TOLERANCE}% of $baseline"
exit "$status"
