#!/usr/bin/env bash
# fp8kv eval on the Qwen3.5-style bundled model (models/fp8kv-mini-gdn, issue
# 35), the subcommands that e2e_eval runs on fp8kv-mini, on 1,024 tokens of
# held-out text (two documents of 512):
#  - kvstats reports the two full-attention layers (3 and 7) only, q/k/v each,
#    and nothing clips at the shipped scales (calibrated with a 1.3 margin on
#    another held-out file; these K/V stay near half of it);
#  - compare orders the arms by their formats' precision: KLD against bf16 of
#    int8_per_token_head (7 bits per value, per-token scale) < fp8_e4m3 (3
#    mantissa bits) < fp8_e5m2 (2 mantissa bits); the reference's KLD is 0;
#  - niah at 1K, depth 50: one cell per arm, a McNemar entry, the same
#    result for the same seed.
# Usage: bash eval_gdn.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini-gdn"
[ -f "$M/model.safetensors" ] || { echo "SKIP: $M not expanded (scripts/expand_models.sh)"; exit 77; }

"$BIN" tokenize "$M" --text-file "$SRC/models/fp8kv-mini/eval/heldout_2.txt" > "$T/tok.json" || fail tokenize
python3 - "$T/tok.json" "$T/ids.json" <<'PY' || fail "ids"
import json, sys
ids = json.load(open(sys.argv[1]))["ids"]
assert len(ids) >= 1024, len(ids)
json.dump([ids[:512], ids[512:1024]], open(sys.argv[2], "w"))
PY

"$BIN" eval kvstats "$M" --token-ids-file "$T/ids.json" --scales checkpoint --output "$T/stats.json" \
  > /dev/null 2> "$T/err" || { cat "$T/err"; fail kvstats; }
python3 - "$T/stats.json" <<'PY' || fail "kvstats checks"
import json, sys
j = json.load(open(sys.argv[1]))
got = sorted((l["layer"], l["stream"]) for l in j["layers"])
assert got == sorted((l, s) for l in (3, 7) for s in "qkv"), got
for l in j["layers"]:
    assert l["type"] == "full_attention", l
    if l["stream"] in ("k", "v"):
        assert l["clipped"] == 0 and l["nonfinite"] == 0, l
PY
echo "ok   kvstats: layers 3 and 7, no K/V clipped at the shipped scales"

"$BIN" eval compare "$M" --token-ids-file "$T/ids.json" \
  --arms bf16,fp8,fp8_e5m2,int8_per_token_head --output "$T/cmp.json" > /dev/null 2> "$T/err" ||
  { cat "$T/err"; fail compare; }
python3 - "$T/cmp.json" <<'PY' || fail "compare checks"
import json, sys
j = json.load(open(sys.argv[1]))
kld = {a["name"]: a["kld"]["mean"] for a in j["arms"]}
assert kld["bf16"] == 0, kld
assert kld["int8_per_token_head"] < kld["fp8"] < kld["fp8_e5m2"], kld
print("     KLD", {k: round(v, 6) for k, v in kld.items()})
PY
echo "ok   compare: KLD ordered by the formats' precision"

for r in 1 2; do
  "$BIN" eval niah "$M" --haystack "$SRC/models/fp8kv-mini/eval/haystack.txt" --lengths 1024 --depths 50 \
    --trials 2 --arms bf16,fp8 --output "$T/niah$r.json" > /dev/null 2> "$T/err" || { cat "$T/err"; fail niah; }
done
python3 - "$T/niah1.json" "$T/niah2.json" <<'PY' || fail "niah checks"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
strip = lambda j: {k: v for k, v in j.items() if k not in ("seconds", "elapsed_s", "fp8kv_version")}
assert strip(a) == strip(b), "same seed, different result"
text = json.dumps(a)
assert "mcnemar" in text.lower(), list(a)
PY
echo "ok   niah: McNemar entry, same seed -> same result"
