#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CXX=clang++ BUILD_DIR=build-fuzz bash scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DELLM_FUZZ=ON
for target in build-fuzz/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  corpus=build-fuzz/corpus/$name
  mkdir -p "$corpus"
  [ -d "fuzz/seeds/$name" ] && cp -n fuzz/seeds/"$name"/* "$corpus"/ 2>/dev/null || true
  echo "-- $name for ${seconds}s"
  log=build-fuzz/$name.log
  if ! "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/ "$corpus" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz target $name failed (crash input saved under build-fuzz/)"
    exit 1
  fi
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$log" | sed "s/^/   /"
done
