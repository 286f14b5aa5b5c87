#!/usr/bin/env bash
# The reference card's workflow on a tiny Qwen3.5 hybrid
# (tests/golden/models_qwen3_5/l3f1_hd64: layers 0-2 linear_attention, no KV
# cache; layer 3 full_attention; byte-level tokenizer), in both checkpoint
# layouts (Qwen3_5ForCausalLM `model.*`, and Qwen3_5ForConditionalGeneration
# `model.language_model.*` with the text config under text_config):
#   1. calibrate on held-out text: status complete, entries for the
#      full-attention layers only (docs/design.md "KV scales of hybrid models");
#   2. inject --naming vllm-runtime --no-q-scale (the card wrote k and v only:
#      2 x full-attention layers tensors): exactly
#      <prefix>layers.L.self_attn.attn.{k,v}_scale for each full-attention L,
#      with the layout's prefix, the report's float32 values, registered in
#      the index; the weight shard byte-identical (sha256);
#   3. serve the injected model with --kv-cache-dtype fp8 and prefix caching:
#      the log says the scales came from the checkpoint (no coverage
#      warning); one greedy completion sent twice: 200 both times, the same
#      text; /metrics served; with prefix caching on (state snapshots every
#      block: --state-snapshot-interval 1) the
#      second request must hit; if a log line says caching is off for the
#      model, no hit may be counted;
#   4. eval compare bf16 vs fp8 (scales from the checkpoint) on a short
#      held-out text: the table's dPPL / KLD lines and finite JSON figures;
#      eval kvstats: rows for the full-attention layers only.
# Usage: bash card_workflow.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
G="$SRC/tests/golden/models_qwen3_5/l3f1_hd64"
CORPUS="$SRC/models/fp8kv-mini/eval/heldout_1.txt"
[ -f "$G/model.safetensors" ] || fail "no $G"
[ -f "$CORPUS" ] || fail "no $CORPUS"
head -c 1500 "$SRC/models/fp8kv-mini/eval/heldout_2.txt" > "$T/heldout.txt"
FULL=$(python3 -c "import json,sys; print(','.join(str(i) for i, t in enumerate(json.load(open(sys.argv[1]))['layer_types']) if t == 'full_attention'))" "$G/config.json")
NFULL=$(echo "$FULL" | tr ',' '\n' | grep -c .)
[ "$NFULL" -ge 1 ] && [ "$FULL" != "0,1,2,3" ] || fail "the golden is not a hybrid: full-attention layers '$FULL'"
SP=""
trap '[ -n "$SP" ] && kill -9 $SP 2>/dev/null; rm -rf "$T"' EXIT

for layout in causal conditional; do
  D="$T/$layout"; M="$D/m"; INJ="$D/inj"
  mkdir -p "$D" && cp -r "$G" "$M" && rm -f "$M/golden.json"
  if [ $layout = conditional ]; then
    python3 "$HERE/qwen3_5_layout.py" "$M" || fail "$layout: layout rewrite"
    PREFIX="model.language_model."
  else
    PREFIX="model."
  fi
  W0=$(sha256sum "$M/model.safetensors" | cut -d' ' -f1)

  # 1. calibrate: the full-attention layers only.
  expect_rc 0 "$BIN" calibrate "$M" --corpus "$CORPUS" --max-corpus-tokens 1024 --context 256 --threads 1 \
    --output "$D/report.json"
  grep -q "calibration complete" "$T/err" || fail "$layout: no 'calibration complete': $(tail -c 500 "$T/err")"
  python3 - "$D/report.json" "$FULL" <<'PY' || fail "$layout: report"
import json, sys
r = json.load(open(sys.argv[1])); full = [int(x) for x in sys.argv[2].split(",")]
assert r["status"] == "complete", r.get("reason")
assert [e["layer"] for e in r["layers"]] == full, [e["layer"] for e in r["layers"]]
for e in r["layers"]:
    assert e["observations"] == r["tokens_observed"] == 1024, e
    assert e["k_scale"] > 0 and e["v_scale"] > 0 and e["v_amax"] > 0, e
PY
  echo "ok   $layout: calibrate: status complete, entries for layers $FULL only"

  # 2. inject, vLLM runtime names, k and v only.
  expect_rc 0 "$BIN" inject "$M" --report "$D/report.json" --naming vllm-runtime --no-q-scale --output "$INJ"
  python3 - "$INJ" "$D/report.json" "$PREFIX" "$FULL" <<'PY' || fail "$layout: injected tensors"
import json, os, struct, sys
d, report, prefix = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
full = [int(x) for x in sys.argv[4].split(",")]
want = {}
for e in report["layers"]:
    for s in ("k", "v"):
        want[f"{prefix}layers.{e['layer']}.self_attn.attn.{s}_scale"] = struct.unpack("<f", struct.pack("<f", e[f"{s}_scale"]))[0]
assert len(want) == 2 * len(full)
wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
in_shard = {n for n, f in wm.items() if f == "kv_cache_scales.safetensors"}
assert in_shard == set(want), sorted(in_shard ^ set(want))
assert all(n.startswith(prefix) for n in wm if n != "lm_head.weight"), "the index names another prefix"
b = open(os.path.join(d, "kv_cache_scales.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
assert set(h) == set(want), sorted(set(h) ^ set(want))
for name, e in h.items():
    assert e["dtype"] == "F32" and e["shape"] == [], (name, e)
    got = struct.unpack("<f", b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])[0]
    assert got == want[name], (name, got, want[name])
print(f"ok   injected {len(h)} tensors: " + ", ".join(sorted(h)))
PY
  [ "$(sha256sum "$INJ/model.safetensors" | cut -d' ' -f1)" = "$W0" ] || fail "$layout: injected weight shard differs"
  [ "$(sha256sum "$M/model.safetensors" | cut -d' ' -f1)" = "$W0" ] || fail "$layout: source weight shard changed"
  (cd "$INJ" && sha256sum -c --quiet SHA256SUMS) || fail "$layout: SHA256SUMS"
  expect_rc 0 "$BIN" inspect "$INJ" --json
  python3 - "$T/out" "$FULL" <<'PY' || fail "$layout: inspect"
import json, sys
j = json.load(open(sys.argv[1])); full = [int(x) for x in sys.argv[2].split(",")]
assert [e["layer"] for e in j["kv_scales"]] == full, j["kv_scales"]
c = j["kv_scale_coverage"]
assert c["quantized_layers"] == len(full) and c["v_scale_layers"] == len(full) and c["v_scale_missing_layers"] == [], c
assert j["warnings"] == [], j["warnings"]
PY
  echo "ok   $layout: inject: weights byte-identical, inspect: coverage $NFULL/$NFULL, no warning"

  # 3. serve with an fp8 cache and prefix caching.
  "$BIN" serve "$INJ" --port 0 --kv-cache-dtype fp8 --enable-prefix-caching --state-snapshot-interval 1 --threads 1 --kv-memory 16MiB \
    --max-num-seqs 4 > "$D/serve.out" 2> "$D/serve.err" &
  SP=$!
  PORT=""
  for _ in $(seq 240); do
    PORT=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$D/serve.err" | sed 's/.*://')
    [ -n "$PORT" ] && break
    kill -0 $SP 2>/dev/null || fail "$layout: serve exited early: $(tail -c 600 "$D/serve.err")"
    sleep 0.25
  done
  [ -n "$PORT" ] || fail "$layout: serve did not print its address"
  grep -qF "KV scales from the checkpoint: k $NFULL/$NFULL, v $NFULL/$NFULL, q 0/$NFULL KV-cache layers" "$D/serve.err" ||
    fail "$layout: serve did not load the injected scales: $(grep -i 'scale' "$D/serve.err")"
  grep -qE "v_scale for|unity|at (v_scale )?1\.0" "$D/serve.err" && fail "$layout: unity / coverage warning: $(grep -i 'scale\|unity' "$D/serve.err")"
  BODY=$(python3 -c "import json,sys; print(json.dumps({'model': sys.argv[1], 'prompt': 'The passkey is 48213. Remember it. The fp8 cache stores keys and values in eight bits.', 'max_tokens': 12, 'temperature': 0, 'ignore_eos': True}))" "$INJ")
  for i in 1 2; do
    code=$(curl -s -o "$D/c$i.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$BODY" \
      "http://127.0.0.1:$PORT/v1/completions") || fail "$layout: curl $i"
    [ "$code" = 200 ] || fail "$layout: completion $i: HTTP $code: $(head -c 300 "$D/c$i.json")"
  done
  code=$(curl -s -o "$D/metrics.txt" -w '%{http_code}' "http://127.0.0.1:$PORT/metrics") || fail "$layout: curl metrics"
  [ "$code" = 200 ] || fail "$layout: /metrics: HTTP $code"
  if grep -q "prefix caching is off for" "$D/serve.err"; then CACHING=off; else CACHING=on; fi
  python3 - "$D/c1.json" "$D/c2.json" "$D/metrics.txt" "$CACHING" "$FULL" <<'PY' || fail "$layout: serve answers / metrics"
import json, re, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta, tb = a["choices"][0]["text"], b["choices"][0]["text"]
assert a["usage"]["completion_tokens"] == 12 == b["usage"]["completion_tokens"], (a["usage"], b["usage"])
assert ta == tb, (ta, tb)
m = open(sys.argv[3]).read()
def metric(name):
    v = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", m, re.M)
    assert v, f"/metrics lacks {name}"
    return float(v.group(1))
queries, hits = metric("fp8kv:prefix_cache_queries_total"), metric("fp8kv:prefix_cache_hits_total")
if sys.argv[4] == "off":
    assert hits == 0, f"prefix caching is off, yet {hits} hit tokens"
else:  # the second request's prompt: its whole blocks were cached by the first
    assert queries >= 2 * a["usage"]["prompt_tokens"], (queries, a["usage"])
    assert hits >= 16, f"prefix caching is on, but the repeated prompt hit {hits} tokens"
# Clip counters name the KV-cache layers only.
full = {int(x) for x in sys.argv[5].split(",")}
layers = {int(x) for x in re.findall(r'kv_cache_clipped_total\{[^}]*layer="(\d+)"', m)}
assert layers <= full, layers
print(f"ok   serve: 200 twice, same greedy text {ta!r}; prefix caching {sys.argv[4]}, hits {hits:g} of {queries:g} tokens")
PY
  kill -TERM $SP
  wait_exit $SP 30; rc=$?
  SP=""
  [ "$rc" = 0 ] || fail "$layout: serve exited $rc after SIGTERM: $(tail -c 400 "$D/serve.err")"

  # 4. eval compare: bf16 vs fp8 with the checkpoint's scales.
  expect_rc 0 "$BIN" eval compare "$INJ" --text-file "$T/heldout.txt" --arms bf16,fp8 --context 128 --threads 1
  grep -qE '^arm +PPL +dPPL % +KLD mean' "$T/err" || fail "$layout: compare table header: $(tail -c 500 "$T/err")"
  grep -qE '^fp8 +[0-9.]+ +[-+][0-9.]+ +[0-9.e-]+ ' "$T/err" || fail "$layout: compare fp8 row: $(tail -c 500 "$T/err")"
  grep -qF "KV scales from the checkpoint: k $NFULL/$NFULL, v $NFULL/$NFULL" "$T/err" || fail "$layout: compare's fp8 arm without the scales"
  python3 - "$T/out" <<'PY' || fail "$layout: compare JSON"
import json, math, sys
j = json.load(open(sys.argv[1]))
names = [a["name"] for a in j["arms"]]
assert names == ["bf16", "fp8"], names
f = j["arms"][1]
assert f["kv_cache_dtype"] == "fp8_e4m3" and f["scales"] == "checkpoint", f
assert f["n_positions"] > 500, f["n_positions"]
for v in (f["ppl"], f["ppl_delta_pct"], f["kld"]["mean"], f["kld"]["p99"]):
    assert math.isfinite(v), f
assert f["kld"]["mean"] > 0 and j["arms"][0]["kld"]["mean"] == 0, (f["kld"], j["arms"][0]["kld"])
print(f"ok   eval compare: fp8 dPPL {f['ppl_delta_pct']:+.4f} %, KLD mean {f['kld']['mean']:.3g}")
PY

  # eval kvstats on the same text: rows for the KV-cache layers only.
  expect_rc 0 "$BIN" eval kvstats "$INJ" --text-file "$T/heldout.txt" --threads 1
  python3 - "$T/out" "$FULL" <<'PY' || fail "$layout: kvstats JSON"
import json, sys
j = json.load(open(sys.argv[1])); full = [int(x) for x in sys.argv[2].split(",")]
assert sorted({l["layer"] for l in j["layers"]}) == full, [l["layer"] for l in j["layers"]]
assert all(l["type"] == "full_attention" and l["count"] > 0 for l in j["layers"]), j["layers"]
PY
  grep -q "linear" <(grep -E '^(pool|[0-9]+) ' "$T/err") && fail "$layout: kvstats table lists a linear layer"
  echo "ok   $layout: eval kvstats: layers $FULL only"
done
echo "card_workflow: ok"
