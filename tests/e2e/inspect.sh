#!/usr/bin/env bash
# e2e: fp8kv inspect on the tiny llama checkpoint (JSON keys and values), on
# malformed copies (exit 2, one line on stderr naming the file/tensor), and
# the unexpected-tensor warning. Usage: inspect.sh FP8KV_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh"
set -eo pipefail
TMP=$T

# 1. Good checkpoint: exit 0, JSON on stdout only.
"$BIN" inspect "$SRC/tests/data/tiny_llama" --json >"$TMP/out.json" 2>"$TMP/err.txt" || fail "inspect exited $?"
python3 - "$TMP/out.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
want = {"architecture": "LlamaForCausalLM", "model_type": "llama", "num_layers": 2,
        "layer_types": ["full_attention", "full_attention"], "sliding_window": None,
        "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "vocab_size": 64,
        "weight_dtype": "BF16",
        # embed 64x32 + 2 x (norms 2x32 + q 32x32 + k,v 16x32 + o 32x32 + mlp 3x64x32) + norm 32 + lm_head 64x32
        "num_parameters": 2048 + 2 * (64 + 1024 + 512 + 512 + 1024 + 3 * 2048) + 32 + 2048,
        # 2 layers x (K + V) x 2 kv heads x head_dim 8 elements per token
        "kv_bytes_per_token": {"bf16": 128, "fp8_e4m3": 64, "fp8_e5m2": 64}}
for k, v in want.items():
    assert j.get(k) == v, f"{k}: got {j.get(k)!r}, want {v!r}"
assert j["fp8kv_version"].startswith("0."), j["fp8kv_version"]
assert j["warnings"] == [], j["warnings"]
PY
[ -s "$TMP/err.txt" ] && fail "stderr not empty on a clean checkpoint: $(cat "$TMP/err.txt")"
"$BIN" inspect "$SRC/tests/data/tiny_llama" >"$TMP/out.txt" || fail "text inspect failed"
grep -q "LlamaForCausalLM" "$TMP/out.txt" || fail "text output lacks the architecture"

expect_exit2() {  # dir, expected substring of the one-line error
  local rc=0
  "$BIN" inspect "$1" --json >"$TMP/o" 2>"$TMP/e" || rc=$?
  [ "$rc" = 2 ] || fail "$1: exit $rc, expected 2 (stderr: $(cat "$TMP/e"))"
  [ "$(wc -l <"$TMP/e")" = 1 ] || fail "$1: expected one line on stderr, got: $(cat "$TMP/e")"
  grep -qF -- "$2" "$TMP/e" || fail "$1: stderr lacks '$2': $(cat "$TMP/e")"
  [ -s "$TMP/o" ] && fail "$1: stdout not empty on error"
  return 0
}

# 2. Truncated weights file.
mkdir "$TMP/trunc"
cp "$SRC/tests/data/tiny_llama/config.json" "$TMP/trunc/"
head -c 1000 "$SRC/tests/data/tiny_llama/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_exit2 "$TMP/trunc" "model.safetensors"

# 3. A malformed-corpus file as the weights.
mkdir "$TMP/overlap"
cp "$SRC/tests/data/tiny_llama/config.json" "$TMP/overlap/"
cp "$SRC/tests/data/malformed/overlapping_spans.safetensors" "$TMP/overlap/model.safetensors"
expect_exit2 "$TMP/overlap" "overlap"

# 4. Config that disagrees with the weights: the shape error names the tensor.
mkdir "$TMP/shape"
cp "$SRC/tests/data/tiny_llama/model.safetensors" "$TMP/shape/"
sed 's/"intermediate_size": 64/"intermediate_size": 96/' "$SRC/tests/data/tiny_llama/config.json" >"$TMP/shape/config.json"
expect_exit2 "$TMP/shape" "model.layers.0.mlp.gate_proj.weight"

# 5. Missing lm_head (config says untied).
mkdir "$TMP/tied"
cp "$SRC/tests/data/tiny_llama/model.safetensors" "$TMP/tied/"
python3 - "$TMP/tied/config.json" "$SRC/tests/data/tiny_llama/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2])); c["tie_word_embeddings"] = True
json.dump(c, open(sys.argv[1], "w"))
PY
# Tied: lm_head present but not needed -> still loadable, no warning for it.
"$BIN" inspect "$TMP/tied" --json >"$TMP/o" 2>"$TMP/e" || fail "tied config should load"
[ -s "$TMP/e" ] && fail "tied: unexpected warning: $(cat "$TMP/e")"

# 6. Unsupported architecture and bad config field.
mkdir "$TMP/arch"
cp "$SRC/tests/data/tiny_llama/model.safetensors" "$TMP/arch/"
sed 's/"model_type": "llama"/"model_type": "gpt2"/' "$SRC/tests/data/tiny_llama/config.json" >"$TMP/arch/config.json"
expect_exit2 "$TMP/arch" "gpt2"
sed 's/"num_hidden_layers": 2/"num_hidden_layers": "two"/' "$SRC/tests/data/tiny_llama/config.json" >"$TMP/arch/config.json"
expect_exit2 "$TMP/arch" "num_hidden_layers"
rm "$TMP/arch/config.json"
expect_exit2 "$TMP/arch" "config.json"

# 7. Index naming a missing shard.
mkdir "$TMP/idx"
cp "$SRC/tests/data/tiny_llama/config.json" "$SRC/tests/data/tiny_llama/model.safetensors" "$TMP/idx/"
echo '{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}' >"$TMP/idx/model.safetensors.index.json"
expect_exit2 "$TMP/idx" "model-00001-of-00002.safetensors"

# 8. Extra tensors: unknown ones warned on stderr (exit 0), KV scales not.
mkdir "$TMP/extra"
cp "$SRC/tests/data/tiny_llama/config.json" "$TMP/extra/"
python3 - "$SRC/tests/data/tiny_llama/model.safetensors" "$TMP/extra/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
for name in ["model.extra_thing.weight", "model.layers.0.self_attn.k_scale", "model.layers.0.self_attn.v_scale"]:
    h[name] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
    data += struct.pack("<f", 0.5)
hb = json.dumps(h).encode(); hb += b" " * (-(8 + len(hb)) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + data)
PY
"$BIN" inspect "$TMP/extra" --json >"$TMP/o" 2>"$TMP/e" || fail "extra tensors: exit $?"
grep -q "warning: 1 unexpected tensor(s).*model.extra_thing.weight" "$TMP/e" || fail "no warning for the extra tensor: $(cat "$TMP/e")"
grep -q "k_scale" "$TMP/e" && fail "KV scale tensor warned about: $(cat "$TMP/e")"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['unexpected_tensors']==['model.extra_thing.weight'], j; assert j['kv_scale_coverage']['k_scale_layers']==1, j" "$TMP/o" \
  || fail "JSON unexpected_tensors / kv_scales wrong"

# 9. Usage error: missing argument -> exit 2.
rc=0; "$BIN" inspect >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "missing MODEL_DIR: exit $rc, expected 2"
echo "inspect e2e: ok"
