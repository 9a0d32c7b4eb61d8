#!/usr/bin/env bash
# The many-core measurements (BENCHMARKS.md, "Many cores"), for a machine that has no
# toolchain and no registry access. Two steps:
#
#   bash benches/many-core.sh build            # here: static binaries into devbench/
#   bash benches/many-core.sh run [WHICH...]   # there: contention, keyed (both by default)
#
# `build` compiles the contention and keyed benches for x86-64 Linux with the C runtime
# linked in, strips them and puts them in devbench/ (git ignores it: list it in
# .git/info/exclude); copy that folder to the many-core machine with the repository.
# `run` prints the machine first, then each bench's paired rounds at 1-16 threads: the
# figures BENCHMARKS.md's many-core tables quote. Each bench takes a few minutes;
# PACELINE_BENCH_THREADS and PACELINE_BENCH_ROUNDS override the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=devbench
benches=(contention keyed)

case "${1:-}" in
build)
  built="$(RUSTFLAGS="-C target-feature=+crt-static" cargo bench -p paceline-benches \
    --no-run --target x86_64-unknown-linux-gnu "${benches[@]/#/--bench=}" 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p')"
  mkdir -p "$dir"
  for bench in "${benches[@]}"; do
    bin="$(grep "/$bench-" <<<"$built" | head -1)"
    [ -n "$bin" ] || { echo "no $bench binary in the build's output"; exit 1; }
    strip -o "$dir/$bench" "$bin"
    echo "$dir/$bench <- $bin"
  done
  ;;
run)
  shift
  [ $# -gt 0 ] || set -- "${benches[@]}"
  grep -m1 'model name' /proc/cpuinfo || true
  echo "cpus: $(nproc)"
  for bench in "$@"; do
    [ -x "$dir/$bench" ] || { echo "no $dir/$bench: run '$0 build' first"; exit 1; }
    echo "== $bench"
    case "$bench" in
    contention)
      PACELINE_BENCH_THREADS="${PACELINE_BENCH_THREADS:-1,2,4,8,16}" \
        PACELINE_BENCH_ROUNDS="${PACELINE_BENCH_ROUNDS:-5}" PACELINE_BENCH_LATENCY=1 \
        "$dir/contention" --bench
      ;;
    keyed)
      PACELINE_BENCH_THREADS="${PACELINE_BENCH_THREADS:-1,16}" \
        PACELINE_BENCH_ROUNDS="${PACELINE_BENCH_ROUNDS:-7}" \
        "$dir/keyed" --bench skip-criterion
      ;;
    *) echo "unknown bench $bench (contention, keyed)"; exit 1 ;;
    esac
  done
  ;;
*)
  echo "usage: $0 build | run [contention] [keyed]"
  exit 1
  ;;
esac
