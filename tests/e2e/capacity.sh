#!/usr/bin/env bash
# fp8kv capacity end to end, against hand arithmetic (docs/capacity.md):
# dense (Llama-3.1-8B) and hybrid (Gemma-3-12B) pools, fp8 = 2 x bf16 blocks,
# JSON fields, the --compare grid, --gpu-memory budgets (checkpoint weights vs
# config estimate), and bad input -> exit 2 with one clear line, empty stdout.
# Usage: bash capacity.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
CFG="$SRC/tests/data/configs"

run_ok() {  # run_ok NAME ARGS... : stdout -> $T/NAME.out
  local name=$1; shift
  "$BIN" capacity "$@" > "$T/$name.out" 2> "$T/$name.err" || { cat "$T/$name.err" >&2; fail "$name: exit $?"; }
}
run_bad() {  # run_bad NAME EXPECTED_SUBSTRING ARGS... : must exit 2, say EXPECTED on stderr, print nothing
  local name=$1 want=$2; shift 2
  "$BIN" capacity "$@" > "$T/$name.out" 2> "$T/$name.err"
  local rc=$?
  [ "$rc" = 2 ] || fail "$name: exit $rc, expected 2 ($(cat "$T/$name.err"))"
  [ -s "$T/$name.out" ] && fail "$name: wrote to stdout on error"
  grep -qF -- "$want" "$T/$name.err" || fail "$name: stderr lacks '$want': $(cat "$T/$name.err")"
}

# ---- dense: Llama-3.1-8B, 80 GiB, bf16 and fp8 ----
run_ok llama_bf16 "$CFG/llama-3.1-8b" --kv-memory 80GiB --kv-cache-dtype bf16 --json
run_ok llama_fp8 "$CFG/llama-3.1-8b/config.json" --kv-memory 80GiB --kv-cache-dtype fp8 --json
python3 - "$T/llama_bf16.out" "$T/llama_fp8.out" <<'PY' || fail "llama JSON"
import json, sys
b = json.load(open(sys.argv[1])); f = json.load(open(sys.argv[2]))
assert b["fp8kv_version"], b
assert b["kv_cache_dtype"] == "bf16" and f["kv_cache_dtype"] == "fp8_e4m3", (b["kv_cache_dtype"], f["kv_cache_dtype"])
# 32 layers x 8 kv heads x 128 x (K+V) x 2 bytes
assert b["bytes_per_token"] == 131072 and f["bytes_per_token"] == 65536
assert b["block_size"] == 16 and b["max_model_len"] == 131072
# page = 16 x 131072 B = 2 MiB; 80 GiB / 2 MiB = 40960 blocks
assert b["page_bytes"] == 2 << 20 and b["num_blocks"] == 40960, b["num_blocks"]
assert f["num_blocks"] == 2 * b["num_blocks"]
assert b["blocks_per_request"] == 8192
assert b["max_concurrency"] == 5.0 and f["max_concurrency"] == 10.0
assert b["tokens"] == 40960 * 16 and f["tokens"] == 81920 * 16
assert len(b["groups"]) == 1
g = b["groups"][0]
assert g["attention_type"] == "full_attention" and g["sliding_window"] is None
assert g["layers"] == list(range(32)) and g["blocks_per_request"] == 8192 and g["bytes_per_token"] == 131072
assert b["log_line"] == "KV cache: 655360 tokens (40960 blocks of 16), max concurrency 5.00x at max_model_len 131072, dtype bf16", b["log_line"]
PY
grep -qx "KV cache: 655360 tokens (40960 blocks of 16), max concurrency 5.00x at max_model_len 131072, dtype bf16" \
  "$T/llama_bf16.err" || fail "log line on stderr: $(cat "$T/llama_bf16.err")"

# Memory not a multiple of the bf16 page: fp8 gets 2n + 1 blocks.
run_ok llama_odd_b "$CFG/llama-3.1-8b" --kv-memory 85900394496 --kv-cache-dtype bf16 --json   # 80 GiB + 1 MiB
run_ok llama_odd_f "$CFG/llama-3.1-8b" --kv-memory 85900394496 --kv-cache-dtype fp8_e5m2 --json
python3 - "$T/llama_odd_b.out" "$T/llama_odd_f.out" <<'PY' || fail "2n+1"
import json, sys
b = json.load(open(sys.argv[1])); f = json.load(open(sys.argv[2]))
assert b["num_blocks"] == 40960 and f["num_blocks"] == 81921, (b["num_blocks"], f["num_blocks"])
PY

# ---- hybrid: Gemma-3-12B (40 sliding(1024) + 8 full), tp 2 ----
run_ok gemma "$CFG/gemma-3-12b" --kv-memory 40GiB --tensor-parallel-size 2 --max-num-batched-tokens 8192 \
  --max-model-len 32768 --json
python3 - "$T/gemma.out" <<'PY' || fail "gemma JSON"
import json, sys
p = json.load(open(sys.argv[1]))
# tp 2: 4 kv heads per rank; page = 16 x 8 layers x 2 x 4 x 256 x 2 B = 512 KiB
assert p["kv_heads_per_rank"] == 4 and p["group_size"] == 8 and p["page_bytes"] == 524288
assert p["num_blocks"] == 40 * 2048, p["num_blocks"]
gs = p["groups"]
assert [g["attention_type"] for g in gs] == ["sliding_attention"] * 5 + ["full_attention"]
assert gs[0]["layers"] == [0, 6, 12, 18, 24, 30, 36, 42] and gs[5]["layers"] == list(range(5, 48, 6))
# sliding: cdiv(min(1023 + 8192, 32768), 16) + 1 = 577; full: 32768 / 16 = 2048
assert all(g["blocks_per_request"] == 577 for g in gs[:5]) and gs[5]["blocks_per_request"] == 2048
bpr = 2048 + 5 * 577
assert p["blocks_per_request"] == bpr
assert p["tokens"] == p["num_blocks"] * 32768 // bpr, p["tokens"]
assert abs(p["max_concurrency"] - p["num_blocks"] / bpr) < 1e-12
assert p["bytes_per_token"] == 48 * 2 * 4 * 256 * 2
PY

# ---- --compare grid ----
run_ok cmp "$CFG/llama-3.1-8b" --kv-memory 80GiB --compare --json
python3 - "$T/cmp.out" <<'PY' || fail "compare grid"
import json, sys
p = json.load(open(sys.argv[1]))
grid = p["grid"]
lens = sorted({r["max_model_len"] for r in grid}); mnbt = sorted({r["max_num_batched_tokens"] for r in grid})
assert lens == [4096, 8192, 32768, 131072], lens
assert mnbt == [2048, 8192, 16384], mnbt
for r in grid:
    assert set(r) >= {"max_model_len", "max_num_batched_tokens", "bf16", "fp8", "gain_pct"}, r
    # dense, 80 GiB a multiple of the page, lengths multiples of 16: exactly 2x
    assert r["bf16"] == 40960 * 16 and r["fp8"] == 2 * r["bf16"], r
    assert r["gain_pct"] == 100.0, r
row = [r for r in grid if r["max_model_len"] == 131072 and r["max_num_batched_tokens"] == 2048][0]
assert row["bf16"] == p["tokens"]
PY
run_ok cmp_gemma "$CFG/gemma-3-12b" --kv-memory 80GiB --compare --json
python3 - "$T/cmp_gemma.out" <<'PY' || fail "gemma compare grid"
import json, sys
p = json.load(open(sys.argv[1]))
def cdiv(a, b): return -(-a // b)
for r in p["grid"]:
    L, t = r["max_model_len"], r["max_num_batched_tokens"]
    bpr = cdiv(L, 16) + 5 * (cdiv(min(1023 + t, L), 16) + 1)
    assert r["bf16"] == 81920 * L // bpr and r["fp8"] == 163840 * L // bpr, r
    assert abs(r["gain_pct"] - 100.0 * (r["fp8"] - r["bf16"]) / r["bf16"]) < 1e-9, r
PY
run_ok cmp_text "$CFG/gemma-3-12b" --kv-memory 80GiB --compare
grep -q "bf16 vs fp8" "$T/cmp_text.out" || fail "text compare table"
# At the engine's default of 8192 batched tokens (capacity used 2048 before
# 2026-11-30): 81920 x 131072 // (8192 + 5 x 577) = 969343.
# The hybrid's line gives the arithmetic: blocks x 16 is not the tokens (issue 37).
grep -qF "KV cache: 969343 tokens = max concurrency 7.40x at max_model_len 131072 (pool: 81920 blocks of 16 tokens shared by 6 KV-cache groups of 8 layers; a request of max_model_len takes 8192 in full attention + 5 x 577 in sliding window 1024 = 11077 blocks), dtype bf16" \
  "$T/cmp_text.out" || fail "text output: $(cat "$T/cmp_text.out")"
grep -q "max_num_batched_tokens 8192" "$T/cmp_text.out" || fail "capacity's default is not the engine's 8192"

# ---- --gpu-memory: checkpoint weights (tiny float32 llama) vs config estimate ----
python3 "$SRC/tests/e2e/inject_make_checkpoint.py" "$T/m" > /dev/null || fail "make checkpoint"
run_ok gpu_ckpt "$T/m" --gpu-memory 1GiB --json
run_ok gpu_est "$T/m/config.json" --gpu-memory 1GiB --json
python3 - "$T/gpu_ckpt.out" "$T/gpu_est.out" "$T/m/model.safetensors" <<'PY' || fail "gpu memory budget"
import json, struct, sys
c = json.load(open(sys.argv[1]))["memory"]; e = json.load(open(sys.argv[2]))["memory"]
with open(sys.argv[3], "rb") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]; hdr = json.loads(fh.read(n))
tensor_bytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__")
assert c["weights_source"] == "checkpoint" and c["weights_bytes_per_rank"] == tensor_bytes, (c, tensor_bytes)
# The config estimate counts the same tensors: 105024 float32 parameters.
assert e["weights_source"] == "estimate" and e["weights_bytes_per_rank"] == 105024 * 4 == tensor_bytes, e
# activations at the engine's defaults (8192 batched tokens, 256 seqs):
# 8192 x (2 x 64 + (2 x 4 + 2 x 2) x 16 + 3 x 96) x 2 B + 256 x 97 x 4 B
act = 8192 * (128 + 192 + 288) * 2 + 256 * 97 * 4
assert c["activation_bytes"] == act, c
usable = int(1 << 30) * 9 // 10
assert abs(c["kv_memory_bytes"] - (usable - tensor_bytes - act)) <= 1, c
PY

# ---- Qwen3.5-27B: the state snapshots of prefix caching share the budget ----
# (docs/capacity.md "Linear-attention state and its prefix snapshots")
run_ok q35_on "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --json
run_ok q35_off "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --json \
  --no-enable-prefix-caching
run_ok q35_sparse "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --json \
  --state-snapshot-interval 1000
python3 - "$T/q35_on.out" "$T/q35_off.out" "$T/q35_sparse.out" <<'PY' || fail "qwen3.5 snapshot JSON"
import json, sys
on, off, sparse = (json.load(open(p)) for p in sys.argv[1:4])
budget = 80 << 30
per_seq = on["state_bytes_per_sequence"]
# 48 linear layers x (conv [2 x 16 x 128 + 48 x 128][3] bf16 + recurrent [48][128][128] f32)
assert per_seq == 48 * (10240 * 3 * 2 + 48 * 128 * 128 * 4), per_seq
assert off["state_snapshot_slots"] == 0 and off["state_snapshot_interval"] == 0 and off["state_snapshot_bytes"] == 0
assert off["prefix_caching_off_reason"] is None
n = on["state_snapshot_interval"]
page = on["page_bytes"]  # 16 full layers x 16 tokens x K+V x 4 heads x 256 x 2 B = 1 MiB, one group
assert page == 1 << 20 and len(on["groups"]) == 1, page
# automatic: multiple of 4 blocks (64 tokens), the least with n x page >= a snapshot
assert n % 4 == 0 and n * page >= per_seq and (n - 4) * page < per_seq, n
assert on["state_snapshot_bytes"] == on["state_snapshot_slots"] * per_seq
used = on["state_pool_bytes"] + on["pool_bytes"] + on["state_snapshot_bytes"]
assert used <= budget and budget - used < per_seq, (used, budget)
assert on["state_snapshot_slots"] >= on["num_blocks"] // n
assert on["num_blocks"] < off["num_blocks"] and off["num_blocks"] == (budget - off["state_pool_bytes"]) // page
assert sparse["state_snapshot_interval"] == 1000 and on["num_blocks"] < sparse["num_blocks"] < off["num_blocks"]
assert "state snapshots (prefix caching): every %d blocks" % n in on["log_line"], on["log_line"]
PY
run_ok q35_text "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768
grep -qF "state snapshots (prefix caching): every" "$T/q35_text.out" || fail "capacity text lacks the snapshot line"
# The state dtypes (--mamba-cache-dtype: conv, --mamba-ssm-cache-dtype:
# recurrent; docs/design.md "Qwen3.5 hybrids"): the state pool counts their
# bytes, the JSON and the KV line name them.
run_ok q35_bf16_ssm "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --json \
  --no-enable-prefix-caching --mamba-ssm-cache-dtype bfloat16
run_ok q35_f32_conv "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --json \
  --no-enable-prefix-caching --mamba-cache-dtype float32 --mamba-ssm-cache-dtype auto
python3 - "$T/q35_off.out" "$T/q35_bf16_ssm.out" "$T/q35_f32_conv.out" <<'PY' || fail "qwen3.5 state dtype JSON"
import json, sys
off, bf, f32c = (json.load(open(p)) for p in sys.argv[1:4])
conv, ssm = 10240 * 3, 48 * 128 * 128  # elements per linear layer
assert (off["state_conv_dtype"], off["state_ssm_dtype"]) == ("bfloat16", "float32"), off  # auto, auto
assert off["state_bytes_per_sequence"] == 48 * (conv * 2 + ssm * 4)
assert (bf["state_conv_dtype"], bf["state_ssm_dtype"]) == ("bfloat16", "bfloat16"), bf
assert bf["state_bytes_per_sequence"] == 48 * (conv * 2 + ssm * 2), bf["state_bytes_per_sequence"]
assert (f32c["state_conv_dtype"], f32c["state_ssm_dtype"]) == ("float32", "float32"), f32c
assert f32c["state_bytes_per_sequence"] == 48 * (conv * 4 + ssm * 4), f32c["state_bytes_per_sequence"]
for j in (off, bf, f32c):
    assert j["state_pool_bytes"] == 16 * j["state_bytes_per_sequence"]
    assert j["num_blocks"] == ((80 << 30) - j["state_pool_bytes"]) // j["page_bytes"], j["num_blocks"]
assert bf["num_blocks"] > off["num_blocks"] > f32c["num_blocks"]
assert "conv bfloat16, recurrent bfloat16" in bf["log_line"], bf["log_line"]
PY
# As in vLLM, --mamba-cache-dtype sets both states unless --mamba-ssm-cache-dtype is given.
run_ok q35_conv_both "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --json --mamba-cache-dtype bfloat16
run_ok q35_conv_ssm "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --json --mamba-cache-dtype bfloat16 \
  --mamba-ssm-cache-dtype float32
python3 - "$T/q35_conv_both.out" "$T/q35_conv_ssm.out" <<'PY' || fail "--mamba-cache-dtype sets both states"
import json, sys
both, own = (json.load(open(p)) for p in sys.argv[1:3])
assert (both["state_conv_dtype"], both["state_ssm_dtype"]) == ("bfloat16", "bfloat16"), both
assert (own["state_conv_dtype"], own["state_ssm_dtype"]) == ("bfloat16", "float32"), own
PY
run_ok q35_bf16_text "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --mamba-ssm-cache-dtype bfloat16
grep -qF "recurrent [48][128][128] bfloat16" "$T/q35_bf16_text.out" || fail "capacity text lacks the state dtype"
# A dense model takes and ignores them (as vLLM): the same plan, no state fields.
run_ok llama_mamba "$CFG/llama-3.1-8b" --kv-memory 80GiB --kv-cache-dtype bf16 --json --mamba-cache-dtype float32 \
  --mamba-ssm-cache-dtype bfloat16
python3 - "$T/llama_bf16.out" "$T/llama_mamba.out" <<'PY' || fail "dense model with state dtypes"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["state_conv_dtype"] is None and b["state_ssm_dtype"] is None and b["state_pool_bytes"] == 0, b
assert (a["num_blocks"], a["tokens"], a["log_line"]) == (b["num_blocks"], b["tokens"], b["log_line"])
PY
run_bad q35_ssm_fp16 "--mamba-ssm-cache-dtype: float16 (a vLLM value) is not supported by fp8kv" \
  "$CFG/qwen3.5-27b" --kv-memory 80GiB --mamba-ssm-cache-dtype float16
run_bad q35_conv_bad "--mamba-cache-dtype must be auto, bfloat16 or float32 (got 'fp8')" \
  "$CFG/qwen3.5-27b" --kv-memory 80GiB --mamba-cache-dtype fp8
run_bad q35_interval0 "--state-snapshot-interval" "$CFG/qwen3.5-27b" --kv-memory 80GiB --state-snapshot-interval 0
run_bad q35_interval_long "--state-snapshot-interval 3000 x --block-size 16 = 48000 tokens" \
  "$CFG/qwen3.5-27b" --kv-memory 80GiB --max-num-seqs 16 --max-model-len 32768 --state-snapshot-interval 3000

# ---- bad input: exit 2, one clear line ----
run_bad too_small "the largest max_model_len that fits is 81920" "$CFG/llama-3.1-8b" --kv-memory 10GiB
run_bad gpu_small "or a --max-model-len of at most" "$CFG/llama-3.1-8b" --gpu-memory 24GiB
# A hybrid whose state pool alone (256 sequences of Qwen3.5-27B: 36.7 GiB)
# leaves no room for a context: the lever named is --max-num-seqs, not a
# --max-model-len of 0.
run_bad gpu_state_pool "or a smaller --max-num-seqs (the linear-attention state pool of 256 sequences" \
  "$CFG/qwen3.5-27b" --gpu-memory 80GiB
run_bad bad_unit "unknown unit 'xb'" "$CFG/llama-3.1-8b" --kv-memory 10XB
run_bad negative "negative" "$CFG/llama-3.1-8b" --kv-memory=-1GiB
run_bad both "excludes" "$CFG/llama-3.1-8b" --kv-memory 1GiB --gpu-memory 1GiB
run_bad neither "exactly one of --kv-memory" "$CFG/llama-3.1-8b"
run_bad dtype "fp4" "$CFG/llama-3.1-8b" --kv-memory 80GiB --kv-cache-dtype fp4
run_bad too_long "use at most 131072" "$CFG/llama-3.1-8b" --kv-memory 80GiB --max-model-len 200000
run_bad tp "does not divide num_attention_heads 32" "$CFG/llama-3.1-8b" --kv-memory 80GiB --tensor-parallel-size 3
run_bad block "--block-size must be >= 1" "$CFG/llama-3.1-8b" --kv-memory 80GiB --block-size 0
run_bad util "--gpu-memory-utilization must be in (0, 1]" "$CFG/llama-3.1-8b" --gpu-memory 80GiB --gpu-memory-utilization 1.5
run_bad missing "not found" "$T/nonexistent" --kv-memory 80GiB

# ---- issue 15 item 1: size products that do not fit in 64 bits ----
# 64 layers x 1024 KV heads x head_dim 65536, --block-size 2^30: the page
# product is exactly 2^64; it wrapped to 0 and the planner divided by it (SIGFPE).
python3 - "$T/huge" <<'PY' || fail "make huge config"
import json, os, sys
os.makedirs(sys.argv[1])
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 11008, "num_hidden_layers": 64, "num_attention_heads": 1024,
           "num_key_value_heads": 1024, "head_dim": 65536, "vocab_size": 32000,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}, open(os.path.join(sys.argv[1], "config.json"), "w"))
PY
run_bad overflow_page "--block-size 1073741824" "$T/huge" --kv-memory 80GiB --block-size 1073741824
grep -qF "head_dim 65536" "$T/overflow_page.err" || fail "overflow message lacks head_dim: $(cat "$T/overflow_page.err")"
grep -qF "num_key_value_heads 1024" "$T/overflow_page.err" || fail "overflow message lacks kv heads"
run_bad overflow_gpu "does not fit in 64 bits" "$T/huge" --gpu-memory 80GiB --block-size 1073741824
# ---- issue 15 item 10: more blocks than 32-bit block ids, naming the flag ----
run_bad huge_budget "lower --kv-memory" "$CFG/llama-3.1-8b" --kv-memory 1000000TiB
run_bad huge_gpu "lower --gpu-memory" "$CFG/llama-3.1-8b" --gpu-memory 1000000TiB
echo "capacity e2e: ok"
