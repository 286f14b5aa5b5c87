#!/usr/bin/env bash
# fp8kv eval end to end. A tiny llama with a planted V outlier in layer 1:
# kvstats reports clipping in layer 1's V only; compare writes a report whose
# reference (bf16) has KLD 0, a control arm, every arm, fractions in [0, 1],
# an open last bucket, and an HTML page; calibrated fp8 (scales from another
# directory) has a smaller KLD than fp8:unity. niah on the bundled model: cells
# and McNemar entries for every arm, same seed -> same result. Bad input -> 2.
# Usage: bash eval.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$HERE/inject_make_checkpoint.py" "$T/m" --outlier-layer 1 --gain 400 || fail make
python3 -c "
import json, random
r = random.Random(5)
json.dump([[r.randrange(97) for _ in range(80)] for _ in range(3)], open('$T/ids.json', 'w'))"

# kvstats at unity: clipping in layer 1 V only.
"$BIN" eval kvstats "$T/m" --token-ids-file "$T/ids.json" --scales unity --output "$T/stats.json" \
  > "$T/stdout" 2> "$T/stderr" || { cat "$T/stderr"; fail kvstats; }
grep -q "pool" "$T/stderr" || fail "kvstats table missing on stderr"
python3 - "$T/stats.json" <<'PY' || fail "kvstats checks"
import json, sys
j = json.load(open(sys.argv[1]))
assert "fp8kv_version" in j
assert len(j["layers"]) == 9, len(j["layers"])
for l in j["layers"]:
    assert l["type"] == "full_attention" and l["stream"] in ("q", "k", "v")
    for k in ("amax", "p9999", "clip_frac", "flush_frac", "rt_err"):
        assert isinstance(l[k], (int, float)), (k, l)
    if l["layer"] == 1 and l["stream"] == "v":
        assert l["clip_frac"] > 0 and l["amax"] > 448, l
    else:
        assert l["clip_frac"] == 0, l
assert {(p["type"], p["stream"]) for p in j["pooled"]} == {("full_attention", s) for s in "qkv"}
PY
# Calibrate + inject to get a calibrated checkpoint for the fp8:scales=DIR arm.
# --rule modelopt (floored at 1) changes only the clipping layer's scale, so
# the compare below measures clipping alone. The floorless default also
# rescales the other layers' K and V; on this random model that only moves
# which few positions round differently (e4m3's relative step is the same at
# any scale in the normal range), and the mean KLD over 240 positions moves by
# as much as the clipping effect (0.0029 vs unity's 0.0024, CI 1e-5..0.0066).
"$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --rule modelopt --output "$T/report.json" > /dev/null 2>&1 || fail calibrate
"$BIN" inject "$T/m" --report "$T/report.json" --output "$T/cal" > /dev/null 2>&1 || fail inject
# kvstats with the calibrated checkpoint's scales: no clipping anywhere.
"$BIN" eval kvstats "$T/cal" --token-ids-file "$T/ids.json" --scales checkpoint --output "$T/stats_cal.json" \
  > /dev/null 2> "$T/stderr" || { cat "$T/stderr"; fail "kvstats checkpoint"; }
python3 -c "
import json; j = json.load(open('$T/stats_cal.json'))
assert all(l['clip_frac'] == 0 for l in j['layers']), [l for l in j['layers'] if l['clip_frac']]" || fail "calibrated still clips"

"$BIN" eval compare "$T/m" --token-ids-file "$T/ids.json" --arms "bf16,fp8:unity,fp8:scales=$T/cal" \
  --context 64 --buckets 0,16,32 --output "$T/cmp.json" --html "$T/cmp.html" > "$T/stdout" 2> "$T/stderr" \
  || { cat "$T/stderr"; fail compare; }
python3 - "$T/cmp.json" "$T/stdout" "$T/cal" <<'PY' || fail "compare checks"
import json, sys
r = json.load(open(sys.argv[1])); out = json.load(open(sys.argv[2]))
assert "fp8kv_version" in r and out["output"] == sys.argv[1]
assert r["reference"] == "bf16"
names = [a["name"] for a in r["arms"]]
assert names == ["bf16", "fp8:unity", "fp8:scales=" + sys.argv[3]], names
ref, unity, cal = r["arms"]
assert ref["kld"]["mean"] == 0 and ref["kld"]["max"] == 0 and ref["top1_agree"] == 1
for a in r["arms"]:
    for k in ("mean", "median", "p99", "max"):
        assert a["kld"][k] >= -1e-12, (k, a["kld"])
    assert 0 <= a["top1_agree"] <= 1
    assert [b["lo"] for b in a["buckets"]] == [0, 16, 32] and a["buckets"][-1]["hi"] is None
    for b in a["buckets"]:
        assert set(("lo", "hi", "n", "dnll_pct", "top1_agree", "kld_mean")) <= set(b)
assert unity["kld"]["mean"] > cal["kld"]["mean"] > 0, (unity["kld"], cal["kld"])
PY
grep -q "<svg" "$T/cmp.html" || fail "html has no svg"
grep -qi "<script" "$T/cmp.html" && fail "html has a script"
grep -q "NaN" "$T/cmp.json" && fail "NaN in report"

# Bad input: exit 2 with one line on stderr.
for args in "--arms bf16,fp16" "--arms bf16,bf16" "--buckets 5,10" "--arms bf16,fp8:scales=$T/nope"; do
  "$BIN" eval compare "$T/m" --token-ids-file "$T/ids.json" $args --output "$T/x.json" > /dev/null 2> "$T/stderr"; rc=$?
  [ $rc -eq 2 ] || fail "compare $args: exit $rc ($(cat "$T/stderr"))"
done
"$BIN" eval compare "$T/m" --output "$T/x.json" > /dev/null 2>&1; [ $? -eq 2 ] || fail "compare without input"
"$BIN" eval kvstats "$T/m" --token-ids-file "$T/ids.json" --scales -3 > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad scale"
"$BIN" eval kvstats "$T/m" --token-ids-file "$T/ids.json" --target bf16 > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad target"
echo '[1, 2, 9999]' > "$T/bad_ids.json"
"$BIN" eval kvstats "$T/m" --token-ids-file "$T/bad_ids.json" > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad ids"

# niah on the bundled model (tokenizer + haystack), tiny grid.
M="$SRC/models/fp8kv-mini"
if [ -f "$M/config.json" ]; then
  for i in 1 2; do
    "$BIN" eval niah "$M" --haystack "$M/eval/haystack.txt" --lengths 256 --depths 10,90 --trials 2 \
      --arms bf16,fp8 --seed 3 --output "$T/niah$i.json" > "$T/niah_stdout$i" 2> "$T/stderr" \
      || { cat "$T/stderr"; fail niah; }
  done
  python3 - "$T/niah1.json" "$T/niah2.json" <<'PY' || fail "niah checks"
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert "fp8kv_version" in a
assert len(a["cells"]) == 4, a["cells"]  # 1 length x 2 depths x 2 arms
for c in a["cells"]:
    assert c["trials"] == 2 and 0 <= c["correct"] <= 2 and c["arm"] in ("bf16", "fp8")
m = a["mcnemar"]
assert len(m) == 1 and m[0]["a"] == "bf16" and m[0]["b"] == "fp8" and 0 <= m[0]["p_value"] <= 1
assert a["cells"] == b["cells"] and a["samples"] == b["samples"], "same seed must reproduce"
PY
fi
echo "eval: ok"
