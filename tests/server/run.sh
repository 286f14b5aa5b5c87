#!/usr/bin/env bash
# CTest entry for the Node client suites:
#   run.sh SUITE FP8KV_BIN SOURCE_DIR [MODEL_DIR [ENGINE_ARGS...]]
# (SUITE: client | hostile | load; MODEL_DIR: default models/fp8kv-mini,
# relative to SOURCE_DIR unless absolute; ENGINE_ARGS: flags for every serve
# and generate of the suite, e.g. --kv-cache-dtype fp8). Exit 77 (skipped)
# when `npm ci` has not been run.
set -euo pipefail
suite=$1 bin=$(realpath "$2") src=$(realpath "$3")
model=${4:-models/fp8kv-mini}
shift 3
if (($#)); then shift; fi
case $model in /*) ;; *) model=$src/$model ;; esac
cd "$src/tests/server"
if [ ! -d node_modules/openai ]; then
  echo "SKIP: tests/server/node_modules is missing (scripts/setup.sh runs npm ci there)"
  exit 77
fi
FP8KV_BIN=$bin FP8KV_MODEL=$model FP8KV_ENGINE_ARGS="$*" exec node --test "$suite.test.mjs"
