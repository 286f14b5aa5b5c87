#!/usr/bin/env bash
# The linear-attention state dtypes on the Qwen3.5-style bundled model
# (models/fp8kv-mini-gdn; docs/design.md "Qwen3.5 hybrids"):
#  - the KV cache line names them (conv bfloat16, recurrent float32 by
#    default; --mamba-cache-dtype / --mamba-ssm-cache-dtype change them);
#  - a bf16 recurrent state is rounded once per step, when the step stores it:
#    scoring a sequence in one step gives bitwise the f32 state's logprobs,
#    scoring it in chunks of 64 does not (the state read by every chunk after
#    the first was rounded);
#  - bad values exit 2 naming the flag (tests/e2e/engine_flags.sh checks
#    every command).
# Usage: bash gdn_state_dtype.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini-gdn"
[ -f "$M/model.safetensors" ] || { echo "SKIP: $M not expanded (scripts/expand_models.sh)"; exit 77; }

"$BIN" tokenize "$M" --text-file "$SRC/models/fp8kv-mini/eval/heldout_2.txt" > "$T/tok.json" || fail tokenize
python3 - "$T/tok.json" "$T/ids.json" <<'PY' || fail "ids"
import json, sys
ids = json.load(open(sys.argv[1]))["ids"]
assert len(ids) >= 300, len(ids)
json.dump([ids[:300]], open(sys.argv[2], "w"))
PY

score() {  # score NAME FLAGS...: $T/NAME.json, its KV cache line in $T/NAME.err
  local name=$1; shift
  "$BIN" score "$M" --backend cpu --token-ids-file "$T/ids.json" --output "$T/$name.json" "$@" 2> "$T/$name.err" \
    || { cat "$T/$name.err"; fail "score $name"; }
}
score f32
grep -qF "conv bfloat16, recurrent float32" "$T/f32.err" || fail "default state dtypes: $(grep 'KV cache' "$T/f32.err")"
score bf16 --mamba-ssm-cache-dtype bfloat16
grep -qF "conv bfloat16, recurrent bfloat16" "$T/bf16.err" || fail "bf16 state: $(grep 'KV cache' "$T/bf16.err")"
cmp -s "$T/f32.json" "$T/bf16.json" || fail "one step: the bf16 state changed the logprobs"
echo "ok   one step: bf16 recurrent state == f32 bitwise"

score f32_64 --chunk-size 64
score bf16_64 --chunk-size 64 --mamba-ssm-cache-dtype bfloat16
python3 - "$T/f32_64.json" "$T/bf16_64.json" <<'PY' || fail "chunked: logprobs"
import json, sys, math
a, b = (json.load(open(p))["sequences"][0]["logprobs"] for p in sys.argv[1:3])
first = [i for i in range(1, len(a)) if a[i] != b[i]]
assert all(math.isfinite(x) for x in b[1:]), "non-finite logprob"
# Rows 0..63 (the first chunk) read zero states: logprobs 1..64 are bitwise.
assert first and first[0] > 64, first[:3]
print("ok   chunks of 64: the first chunk bitwise, then differs from position %d (max |d| %.3g)"
      % (first[0], max(abs(x - y) for x, y in zip(a[1:], b[1:]))))
PY

"$BIN" generate "$M" --backend cpu --prompt "The" --max-tokens 4 --mamba-cache-dtype float32 \
  --mamba-ssm-cache-dtype bfloat16 > "$T/gen.out" 2> "$T/gen.err" || { cat "$T/gen.err"; fail generate; }
grep -qF "conv float32, recurrent bfloat16" "$T/gen.err" || fail "generate: $(grep 'KV cache' "$T/gen.err")"
[ -s "$T/gen.out" ] || fail "generate printed nothing"
echo "ok   generate with a float32 conv state and a bf16 recurrent state"

expect_refused "ssm float16" "--mamba-ssm-cache-dtype: float16 (a vLLM value) is not supported by fp8kv" \
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" --mamba-ssm-cache-dtype float16
echo "gdn_state_dtype: ok"
