#!/usr/bin/env bash
# e2e: fp8kv bench latency|throughput on the bundled model (CPU, tiny sizes):
# the JSON fields of docs/bench.md exist, are finite, and agree with each
# other (tok/s x time = tokens, gbps x step time = bytes, floor fraction).
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"

check() {  # check MODE FILE PROMPTS INPUT OUTPUT
  python3 - "$@" <<'PY' || fail "JSON check failed for $1"
import json, math, sys
mode, path, n, inp, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
j = json.load(open(path))
need = ["output_tokens_per_s", "total_tokens_per_s", "decode_tokens_per_s", "decode_ms_per_step", "ttft_ms",
        "bytes_per_step", "gbps", "floor_fraction", "copy_gbps", "elapsed_s", "output_tokens", "prompt_tokens",
        "decode_steps", "mode", "input_len", "output_len", "kv_cache_dtype", "backend", "fp8kv_version"]
for k in need:
    assert k in j, f"missing {k}"
    if isinstance(j[k], float):
        assert math.isfinite(j[k]) and j[k] >= 0, f"{k} = {j[k]}"
for k in ["output_tokens_per_s", "total_tokens_per_s", "decode_tokens_per_s", "decode_ms_per_step", "ttft_ms",
          "bytes_per_step", "gbps", "floor_fraction", "copy_gbps"]:
    assert j[k] > 0, f"{k} = {j[k]}"
assert j["mode"] == mode and j["input_len"] == inp and j["output_len"] == out
assert j["backend"] == "cpu"
# No CUDA graphs on the CPU backend.
assert j["graph_replays"] == 0 and j["graph_captures"] == 0, (j["graph_replays"], j["graph_captures"])
iters = j.get("num_iters", 1)
# --ignore-eos: every request generates exactly output_len tokens.
assert j["output_tokens"] == n * out * iters, j["output_tokens"]
assert j["prompt_tokens"] == n * inp * iters, j["prompt_tokens"]
def close(a, b, rel=1e-6):
    assert abs(a - b) <= rel * max(abs(a), abs(b)), (a, b)
close(j["output_tokens_per_s"] * j["elapsed_s"], j["output_tokens"])
close(j["total_tokens_per_s"] * j["elapsed_s"], j["output_tokens"] + j["prompt_tokens"])
close(j["gbps"] * 1e9 * j["decode_ms_per_step"] / 1e3, j["bytes_per_step"])
close(j["floor_fraction"], j["gbps"] / j["copy_gbps"])
# Decoding is part of the wall time: decode tok/s >= output tok/s over the
# whole run is not guaranteed, but a decode step can't take longer than the run.
assert j["decode_ms_per_step"] / 1e3 <= j["elapsed_s"]
assert j["ttft_ms"] / 1e3 <= j["elapsed_s"]
# Each request decodes output_len - 1 steps after its first token.
if mode == "latency":
    assert j["decode_steps"] == (out - 1) * iters, j["decode_steps"]
# bytes: weights (bf16) + KV; the weights alone are ~2 x 10.5M params here.
assert 1.5e7 < j["bytes_per_step"] < 5e7, j["bytes_per_step"]
print(mode, "ok:", {k: round(j[k], 3) for k in ["decode_tokens_per_s", "decode_ms_per_step", "gbps", "floor_fraction"]})
PY
}

expect_rc 0 "$BIN" bench latency "$M" --input-len 16 --output-len 6 --batch-size 2 --num-iters-warmup 1 \
  --num-iters 2 --ignore-eos --kv-cache-dtype fp8 --json
check latency "$T/out" 2 16 6
expect_rc 0 "$BIN" bench throughput "$M" --input-len 12 --output-len 5 --num-prompts 3 --ignore-eos --json
check throughput "$T/out" 3 12 5
# Human-readable output without --json.
expect_rc 0 "$BIN" bench latency "$M" --input-len 8 --output-len 3 --batch-size 1 --num-iters 1
grep -q "floor fraction" "$T/out" || fail "no floor fraction in the text output"

# Bad input: exit 2 with one clear line.
expect_rc 2 "$BIN" bench latency "$M" --input-len 16 --output-len 1
expect_rc 2 "$BIN" bench latency "$M" --input-len 4000 --output-len 200 --max-model-len 4096
grep -q "max_model_len" "$T/err" || fail "no max_model_len in the error"
expect_rc 2 "$BIN" bench latency "$T/nonexistent" --input-len 4 --output-len 2
expect_rc 2 "$BIN" bench
echo "bench e2e ok"
