#!/usr/bin/env bash
# CTest entry for the Node client suites: run.sh SUITE FP8KV_BIN SOURCE_DIR
# (SUITE: client | hostile | load). Exit 77 (skipped) when `npm ci` has not been run.
set -euo pipefail
suite=$1 bin=$(realpath "$2") src=$(realpath "$3")
cd "$src/tests/server"
if [ ! -d node_modules/openai ]; then
  echo "SKIP: tests/server/node_modules is missing (scripts/setup.sh runs npm ci there)"
  exit 77
fi
FP8KV_BIN=$bin FP8KV_MODEL=$src/models/fp8kv-mini exec node --test "$suite.test.mjs"
