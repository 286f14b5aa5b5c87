#!/usr/bin/env bash
# fp8kv calibrate end to end: a tiny llama with a planted V outlier in layer 1
# (its V exceeds 448 at unity). calibrate must find the layer (v_scale > 1
# there, amax * 1.3 / 448 < 1 elsewhere: the default rule has no floor), write a complete report whose scales parse back to the
# same float32 bits, and inject must accept it; bad input fails with a
# "failed" report / exit 2.
# Usage: bash calibrate_outlier.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$HERE/inject_make_checkpoint.py" "$T/m" --outlier-layer 1 --gain 400 || fail make
python3 -c "
import json, random
r = random.Random(5)
json.dump([[r.randrange(97) for _ in range(64)] for _ in range(4)], open('$T/ids.json', 'w'))"

"$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --context 32 --output "$T/report.json" \
  > "$T/stdout" 2> "$T/stderr" || { cat "$T/stderr"; fail "calibrate"; }
grep -q ": above 1.0 in 1 of 3 layers: 1, below 1.0 in 2, exactly 1.0 in 0" "$T/stderr" || fail "summary: $(cat "$T/stderr")"
grep -q "largest amax" "$T/stderr" || fail "summary lacks the largest amax"
python3 - "$T/report.json" "$T/stdout" <<'PY' || fail "report checks"
import json, struct, sys
rep = json.load(open(sys.argv[1]))
out = json.load(open(sys.argv[2]))
assert out["status"] == "complete" and out["layers_with_v_scale_above_1"] == [1], out
assert rep["status"] == "complete" and rep["rule"] == "safety:1.3" and rep["target"] == "fp8_e4m3", rep
assert rep["tokens_observed"] == 256 and "fp8kv_version" in rep
assert len(rep["layers"]) == 3
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
for l in rep["layers"]:
    for k in ("q_amax", "k_amax", "v_amax", "q_p9999", "k_p9999", "v_p9999", "q_scale", "k_scale", "v_scale"):
        assert isinstance(l[k], float) or isinstance(l[k], int), (k, l)
        assert f32(l[k]) == l[k], ("not a float32 value", k, l[k])
    assert l["observations"] == 256
L1 = rep["layers"][1]
assert L1["v_amax"] > 448 and L1["v_scale"] > 1, L1
assert L1["v_amax"] * 1.3 / 448 <= L1["v_scale"] < L1["v_amax"] * 1.3 / 448 * (1 + 2**-7), L1  # bf16, rounded up
assert L1["v_p9999"] <= L1["v_amax"]
for i in (0, 2):
    L = rep["layers"][i]
    want = L["v_amax"] * 1.3 / 448
    assert want <= L["v_scale"] < want * (1 + 2**-7) and L["v_scale"] < 1, L
    assert struct.unpack("<I", struct.pack("<f", L["v_scale"]))[0] & 0xFFFF == 0, ("not bf16", L)
PY

# amax rule, per head: arrays (2 KV heads, 4 query heads); bf16-representable scales.
"$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --rule amax --per-head --output "$T/ph.json" > /dev/null 2> "$T/stderr" \
  || { cat "$T/stderr"; fail "calibrate --per-head"; }
python3 - "$T/ph.json" <<'PY' || fail "per-head report"
import json, struct, sys
rep = json.load(open(sys.argv[1]))
for l in rep["layers"]:
    assert len(l["k_scale"]) == 2 and len(l["v_scale"]) == 2 and len(l["q_scale"]) == 4, l
    for s in l["k_scale"] + l["v_scale"] + l["q_scale"]:
        b = struct.unpack("<I", struct.pack("<f", s))[0]
        assert b & 0xFFFF == 0, ("not bf16", s)
v = rep["layers"][1]["v_amax"]
assert v[0] > 448 and v[1] < 448, v   # the outlier row is in KV head 0
PY
"$BIN" inject "$T/m" --report "$T/report.json" --output "$T/cal" > /dev/null 2> "$T/stderr" || { cat "$T/stderr"; fail "inject"; }
"$BIN" inspect "$T/cal" > /dev/null 2>&1 || fail "inspect calibrated"

# Empty corpus: report with status failed + reason, exit 2.
echo "[]" > "$T/empty.json"
"$BIN" calibrate "$T/m" --corpus-ids-file "$T/empty.json" --output "$T/failed.json" > /dev/null 2> "$T/stderr"; rc=$?
[ $rc -eq 2 ] || fail "empty corpus: exit $rc"
python3 -c "import json; j=json.load(open('$T/failed.json')); assert j['status']=='failed' and j['reason'], j" || fail "failed report"
"$BIN" inject "$T/m" --report "$T/failed.json" --output "$T/x" > /dev/null 2>&1; [ $? -eq 2 ] || fail "inject accepted a failed report"
# Bad options: exit 2.
for r in safety:0.5 safety:1e30 safety:17 safety:nan minmax ""; do
  "$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --rule "$r" --output "$T/x.json" > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad rule $r"
done
# modelopt keeps its floor: unity where amax < 448.
"$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --rule modelopt --output "$T/mo.json" > /dev/null 2>&1 || fail "modelopt"
python3 -c "
import json; r = json.load(open('$T/mo.json'))['layers']
assert r[0]['v_scale'] == 1.0 and r[2]['v_scale'] == 1.0 and r[1]['v_scale'] > 1, r" || fail "modelopt floor"
"$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --target bf16 --output "$T/x.json" > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad target"
echo "calibrate_outlier: ok"
