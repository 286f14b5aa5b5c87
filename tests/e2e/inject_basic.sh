#!/usr/bin/env bash
# fp8kv inject end to end: --output (sharded) and --in-place (single file),
# refusals before any write (exit 2, tensor/field named), SHA256SUMS,
# weight shards byte-identical, inspect loads the result.
# Usage: bash inject_basic.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$HERE/inject_make_checkpoint.py" "$T/m" --sharded || fail "make checkpoint"
python3 "$HERE/inject_make_checkpoint.py" "$T/single" || fail "make checkpoint"
W1=$(sha256sum "$T/m/model-00001-of-00002.safetensors" | cut -d' ' -f1)

report() { write_report "$1" "${3:-complete}" 1.0:1.0 "1.0:$2" 0.5:1.0; }  # report FILE V1 [STATUS]
report "$T/r.json" 3.5

# --output: new directory, source untouched.
"$BIN" inject "$T/m" --report "$T/r.json" --output "$T/out" > "$T/stdout" 2> "$T/stderr" || { cat "$T/stderr"; fail "inject --output"; }
python3 -c "import json,sys; j=json.load(open('$T/stdout')); assert j['tensors']==9 and 'fp8kv_version' in j, j" || fail "stdout JSON"
[ "$(python3 "$HERE/inject_read_scale.py" "$T/out" model.layers.1.self_attn.v_scale)" = "3.5" ] || fail "v_scale in out"
[ "$(python3 "$HERE/inject_read_scale.py" "$T/m" model.layers.1.self_attn.v_scale)" = "missing" ] || fail "source modified"
[ "$(sha256sum "$T/m/model-00001-of-00002.safetensors" | cut -d' ' -f1)" = "$W1" ] || fail "weight shard changed"
(cd "$T/out" && sha256sum -c --quiet SHA256SUMS) || fail "SHA256SUMS"
"$BIN" inspect "$T/out" --json > "$T/inspect.json" 2> "$T/inspect.err" || { cat "$T/inspect.err"; fail "inspect out"; }
grep -q "v_scale" "$T/inspect.err" && fail "coverage warning on a fully calibrated checkpoint"
python3 - "$T/inspect.json" <<'PY' || fail "inspect kv_scales"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["kv_scales"]
assert [e["layer"] for e in s] == [0, 1, 2], s
assert s[1]["v_scale"] == 3.5 and s[2]["k_scale"] == 0.5 and s[0]["q_scale"] == 1.0, s
assert j["kv_scale_coverage"]["v_scale_layers"] == 3 and j["warnings"] == [], j
PY
"$BIN" inspect "$T/m" --json > "$T/inspect0.json" 2> /dev/null || fail "inspect m"
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['kv_scales']; assert all(e['k_scale'] is None and e['v_scale'] is None and e['q_scale'] is None for e in s) and len(s)==3, s" "$T/inspect0.json" || fail "inspect nulls"

# --in-place on a single-file checkpoint: creates the index; re-inject replaces.
"$BIN" inject "$T/single" --report "$T/r.json" --in-place > /dev/null 2> "$T/stderr" || { cat "$T/stderr"; fail "inject --in-place"; }
[ -f "$T/single/model.safetensors.index.json" ] || fail "index not created"
report "$T/r2.json" 7.25
"$BIN" inject "$T/single" --report "$T/r2.json" --in-place --naming vllm-runtime > /dev/null 2> "$T/stderr" || { cat "$T/stderr"; fail "re-inject"; }
[ "$(python3 "$HERE/inject_read_scale.py" "$T/single" model.layers.1.self_attn.attn.v_scale)" = "7.25" ] || fail "re-inject value"
[ "$(python3 "$HERE/inject_read_scale.py" "$T/single" model.layers.1.self_attn.v_scale)" = "missing" ] || fail "old names left in index"
[ "$(ls "$T/single" | grep -c kv_cache_scales)" = "1" ] || fail "leftover scale shards: $(ls "$T/single")"
"$BIN" inspect "$T/single" > /dev/null 2>&1 || fail "inspect single"

# Refusals: exit 2, named, nothing written.
expect_refused() {  # expect_refused NEEDLE ARGS...
  local needle=$1; shift
  local before; before=$(ls -la --time-style=+%s.%N "$T/m" | md5sum)
  "$BIN" inject "$T/m" "$@" > "$T/stdout" 2> "$T/stderr"; local rc=$?
  [ $rc -eq 2 ] || fail "expected exit 2 for '$needle', got $rc: $(cat "$T/stderr")"
  grep -q -- "$needle" "$T/stderr" || fail "stderr lacks '$needle': $(cat "$T/stderr")"
  [ -s "$T/stdout" ] && fail "stdout not empty on refusal"
  [ "$(ls -la --time-style=+%s.%N "$T/m" | md5sum)" = "$before" ] || fail "refused inject modified the checkpoint"
  [ -e "$T/new" ] && fail "refused inject created the output"
  return 0
}
report "$T/bad.json" 3.0 failed;            expect_refused "status is 'failed'" --report "$T/bad.json" --output "$T/new"
report "$T/bad.json" 0;                     expect_refused "v_scale is 0" --report "$T/bad.json" --in-place
report "$T/bad.json" -2;                    expect_refused "v_scale is -2" --report "$T/bad.json" --in-place
report "$T/bad.json" null;                  expect_refused "v_scale is null" --report "$T/bad.json" --in-place
report "$T/bad.json" NaN;                   expect_refused "invalid JSON" --report "$T/bad.json" --in-place
report "$T/bad.json" 1e39;                  expect_refused "overflows float32" --report "$T/bad.json" --in-place
report "$T/bad.json" '[1.0, 2.0, 3.0]';     expect_refused "v_scale has 3 values" --report "$T/bad.json" --in-place
python3 -c "import json; j=json.load(open('$T/r.json')); j['layers'].pop(); json.dump(j, open('$T/bad.json','w'))"
expect_refused "2 layer entries, but the model has 3 layers" --report "$T/bad.json" --in-place
expect_refused "exactly one of --output" --report "$T/r.json"
expect_refused "exactly one of --output" --report "$T/r.json" --in-place --output "$T/new"
expect_refused "not an empty directory" --report "$T/r.json" --output "$T/out"
expect_refused "no such\|cannot open" --report "$T/nope.json" --in-place
echo "inject_basic: ok"
