#!/usr/bin/env bash
# The kern branch's GPU run (issue 14, wgmma prefill): see scripts/gpu_prefill.sh.
exec bash "$(dirname "$0")/gpu_prefill.sh" "$@"
