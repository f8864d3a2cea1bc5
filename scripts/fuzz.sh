#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for SECONDS (default 60).
# BUILD_DIR: a build to use (default build-fuzz); one that is not configured yet is configured
# for fuzzing. CI passes build-asan, the ASan build of scripts/sanitize.sh asan, which holds the
# fuzz targets too, so the library is not built a third time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
dir=${BUILD_DIR:-build-fuzz}
[ -f "$dir/build.ninja" ] || CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DELLM_FUZZ=ON >/dev/null
targets=$(ls fuzz/fuzz_*.cc | xargs -n1 basename | sed 's/\.cc$//')
# shellcheck disable=SC2086
cmake --build "$dir" -j "$(nproc)" --target $targets
for name in $targets; do
  target=$dir/fuzz/$name
  corpus=$dir/corpus/$name
  mkdir -p "$corpus"
  [ -d "fuzz/seeds/$name" ] && cp -n fuzz/seeds/"$name"/* "$corpus"/ 2>/dev/null || true
  echo "-- $name for ${seconds}s"
  log=$dir/$name.log
  if ! "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$dir/" "$corpus" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz target $name failed (crash input saved under $dir/)"
    exit 1
  fi
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$log" | sed "s/^/   /"
done
