#!/usr/bin/env bash
# One parse for --kv-cache-dtype (numerics/fp8.h kv_cache_dtype_names): every
# accepted name (vLLM's auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2 and the
# aliases bf16, fp8e4m3, fp8e5m2) gives the same KV plan line in `capacity`
# and in the engine the serving commands build (cli/engine_flags.h, used by
# serve, generate, score, eval); unknown names and vLLM's unsupported ones
# exit 2 naming the flag and the accepted names, in capacity and serve alike.
# Usage: bash kv_dtype_names.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/golden/models_hd64/llama"
COMMON=(--kv-memory 4MiB --max-model-len 128 --max-num-seqs 4 --max-num-batched-tokens 64 --kv-cache-dtype)

for name in auto bfloat16 fp8 fp8_e4m3 fp8_e5m2 bf16 fp8e4m3 fp8e5m2; do
  "$BIN" capacity "$M" "${COMMON[@]}" "$name" --json > "$T/cap.out" 2> "$T/cap.err" ||
    fail "capacity --kv-cache-dtype $name: $(cat "$T/cap.err")"
  "$BIN" generate "$M" --backend cpu --prompt "hello" --max-tokens 1 "${COMMON[@]}" "$name" > "$T/gen.out" 2> "$T/gen.err" ||
    fail "generate --kv-cache-dtype $name: $(cat "$T/gen.err")"
  cap=$(grep -o 'KV cache: .*' "$T/cap.err" | head -1)
  eng=$(grep -o 'KV cache: .*' "$T/gen.err" | head -1)
  [ -n "$cap" ] || fail "capacity $name: no KV cache line: $(cat "$T/cap.err")"
  [ "$cap" = "$eng" ] || fail "--kv-cache-dtype $name: capacity '$cap' vs engine '$eng'"
  echo "ok   $name: $cap"
done

for name in fp8_inc fp8_ds_mla int8 float16; do
  expect_refused "capacity $name" "not supported by fp8kv; accepted: auto, bfloat16" \
    "$BIN" capacity "$M" "${COMMON[@]}" "$name"
  expect_refused "serve $name" "--kv-cache-dtype: '$name' (a vLLM KV cache dtype) is not supported" \
    "$BIN" serve "$M" --port 0 "${COMMON[@]}" "$name"
done
expect_refused "capacity unknown" "--kv-cache-dtype: unknown KV cache dtype 'e4m3'; accepted: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_per_token_head, int8_per_token_head (aliases: bf16, fp8e4m3, fp8e5m2)" \
  "$BIN" capacity "$M" "${COMMON[@]}" e4m3
expect_refused "serve unknown" "--kv-cache-dtype: unknown KV cache dtype 'e4m3'" \
  "$BIN" serve "$M" --port 0 "${COMMON[@]}" e4m3
echo "PASS kv_dtype_names"
