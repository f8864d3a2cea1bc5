#!/usr/bin/env bash
# Builds ellm with a sanitizer into build-KIND (or $BUILD_DIR) and runs tests under it:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer, with clang: every unit test, then the
#         server's end-to-end tests (routes and bad input, load, hostile clients, the openai
#         client). The build also holds the libFuzzer targets (-DELLM_FUZZ=ON: the parsers of
#         untrusted input carry the fuzzers' coverage counters, the kernels, the forward, the
#         engine and the tests do not), so scripts/fuzz.sh can run them from it.
#   tsan  ThreadSanitizer: the engine (scheduler) and server unit tests, then the server's
#         end-to-end tests, which drive the scheduler, the HTTP threads and shutdown at once.
# Every process's reports (the servers the end-to-end tests start included) go to
# BUILD_DIR/sanitizer-logs/; any report fails the run, even one a test did not notice.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
root=$PWD
# The server's end-to-end tests that drive its threads: routes, disconnects and SIGTERM, load,
# hostile clients, sessions, n choices. ASan adds the openai and anthropic clients (the Messages
# and Responses APIs' translations of untrusted bodies) and the tool-call parsers of untrusted
# output; TSan has nothing to find in those that the others miss. The structured-output test
# (163 s under ASan, most of it the token mask over the vocabulary) is left out: the schema
# compiler and matcher run under ASan in test_grammar, test_server and the fuzzers.
e2e='server_api|load|hostile|sessions|choices'
case "$kind" in
  asan)
    e2e="$e2e|server_openai|anthropic_api|responses_api|streamed_tool_calls"
    flags="-DELLM_SANITIZE=ON -DELLM_FUZZ=ON"
    export CXX=clang++
    targets="ellm test_base test_kernels test_model test_text test_grammar test_image test_engine test_server"
    targets="$targets $(ls fuzz/fuzz_*.cc | xargs -n1 basename | sed 's/\.cc$//')" ;;
  tsan)
    flags=-DELLM_TSAN=ON
    targets="ellm test_engine test_server" ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan" >&2; exit 2 ;;
esac
dir=${BUILD_DIR:-build-$kind}
logs=$root/$dir/sanitizer-logs

# -O1 -g1: the sanitizers' usual level; at -O2 -g a test file took 2.7x as long to compile.
built=$(date +%s)
# shellcheck disable=SC2086
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" $flags >/dev/null
# shellcheck disable=SC2086
cmake --build "$dir" -j "$(nproc)" --target $targets
echo "-- $kind build: $(( $(date +%s) - built ))s"
tested=$(date +%s)
[ -d tests/e2e/node_modules/openai ] || e2e=${e2e/server_openai|/}
[ -d tests/e2e/node_modules/@anthropic-ai/sdk ] || e2e=${e2e/anthropic_api|/}
[ -d tests/e2e/node_modules/openai ] || e2e=${e2e/responses_api|/}
e2e="^e2e_test_($e2e)\$"

rm -rf "$logs" && mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
# cpp-httplib is a compiled Debian library that TSan cannot see into; .ci/tsan.supp says which
# of its reports are false and why. Our own code is never suppressed.
export TSAN_OPTIONS="suppressions=$root/.ci/tsan.supp:second_deadlock_stack=1:log_path=$logs/tsan"

# The model and engine tests run on the best tier only (tests/tiers_under_test.h): the kernels'
# tests walk every tier's memory, and each tier's numerics are the release run's.
export ELLM_TEST_TIERS=best
status=0
cd "$dir"
if [ "$kind" = asan ]; then
  # The golden sessions are numerics checks that the release run makes on every model; under ASan
  # (5 to 100 s each) one model per code path walks the same memory: dense BF16, MoE FP8, 4-bit,
  # hybrid MoE. The others are left out here, and so is the hybrid chunking comparison (full
  # logits of 245 positions, several times, on every tier: over 10 minutes under ASan), whose
  # passes the kept hybrid golden sessions also run, and the bit-for-bit snapshot comparison on
  # every tier (the kept hybrid golden session resumes from a snapshot too). Of the hybrid
  # models' sessions on the real models, one case (the MoE's, from disk) walks their memory.
  same_paths='GoldenSession\..*/(tiny_qwen3_moe|tiny_qwen3_fp8|tiny_qwen3_awq|tiny_qwen35|tiny_qwen3_yarn|tiny_qwen35_yarn)( |$)'
  same_paths="$same_paths|^Qwen35Forward\.AnyChunkingGivesTheSameLogitsOnEveryTier"
  same_paths="$same_paths|^Qwen35Snapshots\.|SessionModel\..*/(tiny_qwen35_ram|tiny_qwen35_disk|tiny_qwen35_moe_ram)( |$)"
  # Attention on BF16 products: a numerics check on every model; its kernels' memory is walked by
  # the kernel tests (test_kernels' Attention.*), which run here on every tier.
  same_paths="$same_paths|^Models/GoldenSession\.Bf16Attention"
  # The long-context attention row (a 2,600-row prefill per tier and dtype, 86 s under ASan)
  # walks the split-along-positions path the decode-row tests kept here walk at 2,100 rows.
  same_paths="$same_paths|^Attention\.LongContextRowDoesNotDependOnSplitOrBatch$"
  # A 64k-position prompt fed three ways (100 s a model in the release build): numerics; the
  # paths it runs are the shorter prefill, parts and chunking tests' kept here.
  same_paths="$same_paths|^Models/LongPrompt\."
  ctest --output-on-failure -j 2 -E "^e2e_|$same_paths" || status=1
else
  # The grammar tests (test_grammar) are single-threaded and walk the 151k-token vocabulary
  # thousands of times: minutes under TSan for nothing it can find. ASan runs them, and the
  # engine's single-threaded parsers, sampling and session files, and the numerics checks of
  # restored sessions and reference completions (the scheduler and the store's writer thread
  # run in the scheduler, store and engine-model tests kept here, and in the end-to-end tests).
  tests/test_engine --gtest_brief=1 \
    --gtest_filter='EngineRobustness.*:EngineScheduler.*:*SessionStore.*:TinyModels/EngineModel.*:SpeculativeEngine.*-*GreedyMatchesTheReferenceCompletions*' ||
    status=1
  tests/test_server --gtest_brief=1 || status=1
fi
# The end-to-end tests time their servers, which sanitizers already slow down. Under ASan they
# wait more than they compute (5 of 11.5 minutes busy on one core, measured), so two at a time;
# under TSan, which costs far more, one at a time.
ctest --output-on-failure -j "$([ "$kind" = asan ] && echo 2 || echo 1)" -R "$e2e" || status=1

reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
  for f in $reports; do echo "==== $f"; head -n 80 "$f"; done
  echo "$kind: $(echo "$reports" | wc -l) sanitizer report file(s) in $logs"
  status=1
fi
echo "-- $kind tests: $(( $(date +%s) - tested ))s"
[ "$status" = 0 ] && echo "$kind: all clean"
exit "$status"
