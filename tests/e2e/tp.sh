#!/usr/bin/env bash
# --tensor-parallel-size on the CPU (simulated ranks): score on
# models/fp8kv-mini with TP 2 equals TP 1 within the cache-rounding bound of
# tests/engine/test_tp.cpp (logprobs within 1e-2, same top-1); the engine's
# "KV cache:" line equals `fp8kv capacity --tensor-parallel-size 2` (per-rank
# bytes, total tokens); a size that does not divide the heads is refused by
# name (exit 2). A tiny Qwen3.5 hybrid and a tiny block-wise fp8 model
# (--load-format dummy, config.json only): TP 2 in one process and, for
# Qwen3.5, in two processes (each rank makes its own shard) against TP 1;
# linear heads that the TP size does not divide, and fp8 block shards off a
# 128 boundary, exit 2 naming them.
# Usage: bash tp.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
random_ids "$T/ids.json" 48 8192 1
flags=(--kv-memory 4MiB --max-model-len 256 --kv-cache-dtype fp8 --threads 2)
score_tp12 "$M" "$T/ids.json" "${flags[@]}"
python3 - "$T" <<'PY' || fail "TP 2 != TP 1"
import json, sys
T = sys.argv[1]
a = json.load(open(T + "/s1.json"))["sequences"][0]
b = json.load(open(T + "/s2.json"))["sequences"][0]
d = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None)
assert d <= 1e-2, f"max |dlogprob| {d}"
assert a["top1_ids"] == b["top1_ids"], "top-1 differs"
print(f"ok   score --tp 2 vs 1: max |dlogprob| {d:.3g}, same top-1")
PY
want=$("$BIN" capacity "$M" --kv-memory 4MiB --max-model-len 256 --kv-cache-dtype fp8 --tensor-parallel-size 2 --json \
  | python3 -c "import json, sys; print(json.load(sys.stdin)['log_line'])")
got=$(grep -o "KV cache: .*" "$T/e2" | head -1)
[ "$got" = "$want" ] || fail "engine '$got' != capacity '$want'"
echo "ok   KV cache line = capacity --tensor-parallel-size 2"
expect_refused "tp 3" "--tensor-parallel-size 3 does not divide num_attention_heads 8" \
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" "${flags[@]}" --tp 3
expect_refused "tp 0" "--tensor-parallel-size must be >= 1" \
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" "${flags[@]}" --tp 0

# ---- Qwen3.5 (Gated DeltaNet + gated attention) and fp8 weights, dummy ----
Q="$T/qwen3_5"; F="$T/fp8"; mkdir -p "$Q" "$F"
python3 - "$T" <<'PY'
import json, random, sys
T = sys.argv[1]
q = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 64,
     "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
     "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512, "eos_token_id": 2,
     "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
     "linear_num_key_heads": 2, "linear_num_value_heads": 4,
     "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
json.dump(q, open(T + "/qwen3_5/config.json", "w"))
# Block-wise fp8: q_proj 512 rows, k/v 256, ffn 512: whole 128-row blocks per rank at TP 2.
f = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 160, "intermediate_size": 512,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
     "vocab_size": 256, "max_position_embeddings": 512, "eos_token_id": 2, "tie_word_embeddings": False,
     "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]}}
json.dump(f, open(T + "/fp8/config.json", "w"))
f["head_dim"] = 40  # q_proj 160 rows: 80 per rank at TP 2
import os; os.makedirs(T + "/fp8_off", exist_ok=True); json.dump(f, open(T + "/fp8_off/config.json", "w"))
random.seed(2); json.dump([random.randrange(256) for _ in range(40)], open(T + "/qids.json", "w"))
PY
df=(--token-ids-file "$T/qids.json" --load-format dummy --kv-memory 4MiB --max-model-len 128 --threads 1)
for m in qwen3_5 fp8; do
  for tp in 1 2; do
    "$BIN" score "$T/$m" "${df[@]}" --output "$T/$m$tp.json" --tp $tp > /dev/null 2> "$T/$m.e$tp" \
      || fail "$m score --tp $tp: $(cat "$T/$m.e$tp")"
  done
done
P=$(free_port_pair); [ -n "$P" ] || fail "no free port"
mp=(--tp 2 --nnodes 2 --master-port "$P")
"$BIN" score "$Q" "${df[@]}" --output "$T/qr1.json" "${mp[@]}" --node-rank 1 > /dev/null 2> "$T/qer1" &
pid1=$!
"$BIN" score "$Q" "${df[@]}" --output "$T/qr0.json" "${mp[@]}" --node-rank 0 > /dev/null 2> "$T/qer0" \
  || { kill $pid1 2>/dev/null; wait $pid1; fail "qwen3_5 rank 0: $(cat "$T/qer0"); rank 1: $(cat "$T/qer1")"; }
wait $pid1 || fail "qwen3_5 rank 1: $(cat "$T/qer1")"
python3 - "$T" <<'PY' || fail "qwen3_5 / fp8 TP 2 != TP 1"
import json, sys
T = sys.argv[1]
def seq(n): return json.load(open(f"{T}/{n}.json"))["sequences"][0]
def dmax(a, b): return max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None)
q1, q2, qmp = seq("qwen3_5" + "1"), seq("qwen3_5" + "2"), seq("qr0")
assert qmp["logprobs"] == q2["logprobs"], "qwen3_5: 2 processes differ from 2 simulated ranks"
d = dmax(q1, q2)
assert d <= 1e-2, f"qwen3_5: max |dlogprob| vs TP 1 {d}"
print(f"ok   qwen3_5 dummy: 2 processes == 2 simulated ranks bitwise; vs TP 1 max |dlogprob| {d:.3g}")
d = dmax(seq("fp81"), seq("fp82"))
assert d <= 1e-2, f"fp8 block: max |dlogprob| vs TP 1 {d}"
print(f"ok   fp8 block-wise dummy: TP 2 vs TP 1 max |dlogprob| {d:.3g}")
PY
expect_refused "qwen3_5 tp 4" "--tensor-parallel-size 4 does not divide linear_num_key_heads 2 and linear_num_value_heads 4" \
  "$BIN" score "$Q" "${df[@]}" --output "$T/x.json" --tp 4
expect_refused "fp8 block off 128" "fp8 weight model.layers.0.self_attn.q_proj.weight [160, 160] has 128x128 block scales" \
  "$BIN" score "$T/fp8_off" "${df[@]}" --output "$T/x.json" --tp 2
echo ok
