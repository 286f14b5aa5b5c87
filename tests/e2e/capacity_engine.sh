#!/usr/bin/env bash
# The engine's pool equals what `fp8kv capacity` plans: run engine commands
# with --kv-memory on a tiny checkpoint and compare their `KV cache:` log line
# with `fp8kv capacity --json`'s log_line for the same settings (several
# budgets, including ones that are not a multiple of the page, and fp8 when
# `fp8kv score` is available).
# Usage: bash capacity_engine.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$SRC/tests/e2e/inject_make_checkpoint.py" "$T/m" > /dev/null || fail "make checkpoint"
python3 -c "import json; json.dump([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]], open('$T/ids.json', 'w'))"

capacity_line() {  # capacity_line MEM DTYPE -> the planned log line
  "$BIN" capacity "$T/m" --kv-memory "$1" --kv-cache-dtype "$2" --json > "$T/cap.json" 2> "$T/cap.err" \
    || fail "capacity $1 $2: $(cat "$T/cap.err")"
  python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['log_line'])" "$T/cap.json"
}
engine_line() {  # engine_line FILE -> the engine's logged line
  grep -o "KV cache: .*" "$1" | head -1
}

# The tiny llama: 3 layers x 2 kv heads x head_dim 16; bf16 page = 16 x 3 x 2 x 2 x 16 x 2 = 6144 B.
checked=0
for mem in 1000000 6144000 614400 6143999; do
  want=$(capacity_line "$mem" bf16)
  "$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --min-tokens 10 --output "$T/r.json" --kv-memory "$mem" \
    > /dev/null 2> "$T/eng.err" || fail "calibrate --kv-memory $mem: $(cat "$T/eng.err")"
  got=$(engine_line "$T/eng.err")
  [ -n "$got" ] || fail "engine logged no KV cache line: $(cat "$T/eng.err")"
  [ "$got" = "$want" ] || fail "kv-memory $mem: engine '$got' != capacity '$want'"
  checked=$((checked + 1))
done
# Hand check of one: 1000000 B / 6144 B = 162 blocks; 256 / 16 = 16 blocks a request.
[ "$(capacity_line 1000000 bf16)" = "KV cache: 2592 tokens (162 blocks of 16), max concurrency 10.12x at max_model_len 256, dtype bf16" ] \
  || fail "hand-computed line: $(capacity_line 1000000 bf16)"

# A tiny Gemma 3 (hybrid: 4 sliding(8) + 2 full layers -> group size 2, two
# sliding groups and one full group): the engine's pool follows the same plan.
python3 - "$T/g" <<'PY' || fail "make gemma3 checkpoint"
import json, os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
H, I, V, Hq, Hkv, D, L = 64, 96, 97, 4, 2, 16, 6
cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": H,
       "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": Hq, "num_key_value_heads": Hkv,
       "head_dim": D, "vocab_size": V, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
       "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": D,
       "sliding_window": 8, "sliding_window_pattern": 3, "hidden_activation": "gelu_pytorch_tanh",
       "layer_types": ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(L)],
       "tie_word_embeddings": True, "eos_token_id": 1, "bos_token_id": 2, "torch_dtype": "float32"}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
names = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H])]
for l in range(L):
    p = f"model.layers.{l}."
    names += [(p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [Hq * D, H]),
              (p + "self_attn.k_proj.weight", [Hkv * D, H]), (p + "self_attn.v_proj.weight", [Hkv * D, H]),
              (p + "self_attn.o_proj.weight", [H, Hq * D]), (p + "self_attn.q_norm.weight", [D]),
              (p + "self_attn.k_norm.weight", [D]), (p + "post_attention_layernorm.weight", [H]),
              (p + "pre_feedforward_layernorm.weight", [H]), (p + "post_feedforward_layernorm.weight", [H]),
              (p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
              (p + "mlp.down_proj.weight", [H, I])]
rng = random.Random(3); header = {}; blobs = []; off = 0
for name, shape in names:
    n = 1
    for x in shape: n *= x
    b = struct.pack(f"<{n}f", *[rng.gauss(0, 0.05) for _ in range(n)])
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h); f.write(b"".join(blobs))
PY
"$BIN" capacity "$T/g" --kv-memory 1000000 --json > "$T/gcap.json" 2> "$T/gcap.err" || fail "capacity gemma3: $(cat "$T/gcap.err")"
python3 - "$T/gcap.json" <<'PY' || fail "gemma3 plan"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["group_size"] == 2 and [g["layers"] for g in p["groups"]] == [[0, 3], [1, 4], [2, 5]], p["groups"]
# page = 16 x 2 layers x 2 x 2 heads x 16 x 2 B = 4096; sliding: cdiv(min(7 + 2048, 128), 16) + 1 = 9; full: 8
assert p["page_bytes"] == 4096 and p["num_blocks"] == 1000000 // 4096, p
assert [g["blocks_per_request"] for g in p["groups"]] == [9, 9, 8] and p["blocks_per_request"] == 26
assert p["tokens"] == 244 * 128 // 26
PY
for mem in 1000000 106496; do
  want=$("$BIN" capacity "$T/g" --kv-memory "$mem" --json 2>/dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['log_line'])")
  "$BIN" calibrate "$T/g" --corpus-ids-file "$T/ids.json" --min-tokens 10 --output "$T/gr.json" --kv-memory "$mem" \
    > /dev/null 2> "$T/eng.err" || fail "calibrate gemma3 --kv-memory $mem: $(cat "$T/eng.err")"
  got=$(engine_line "$T/eng.err")
  [ "$got" = "$want" ] || fail "gemma3 kv-memory $mem: engine '$got' != capacity '$want'"
  checked=$((checked + 1))
done

# fp8 through `fp8kv score` (when built): the cache dtype flows into the plan too.
if "$BIN" score --help 2>/dev/null | grep -q -- "--kv-cache-dtype"; then
  for dt in fp8 bf16; do
    for mem in 1000000 3071999; do
      want=$(capacity_line "$mem" "$dt")
      "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/s.json" --kv-memory "$mem" \
        --kv-cache-dtype "$dt" > /dev/null 2> "$T/eng.err" || fail "score $dt $mem: $(cat "$T/eng.err")"
      got=$(engine_line "$T/eng.err")
      [ "$got" = "$want" ] || fail "score $dt kv-memory $mem: engine '$got' != capacity '$want'"
      checked=$((checked + 1))
    done
  done
fi
echo "capacity_engine e2e: ok ($checked engine runs matched)"
