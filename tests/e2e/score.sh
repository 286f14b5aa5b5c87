#!/usr/bin/env bash
# e2e: fp8kv score on a tiny random checkpoint (made here with python3, stdlib only).
source "$(dirname "$0")/lib.sh"
python3 "$SRC/tests/e2e/tiny_model.py" "$T/m" || fail "could not make the tiny model"

echo '[[257, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 32, 72, 101, 108, 108, 111], [257, 65, 66]]' > "$T/ids.json"
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/bf16.json" --block-size 4
# stdout: one line, llama-perplexity's final estimate; stderr: one progress bar.
grep -qE '^PPL = [0-9]+\.[0-9]{4} ± [0-9]+\.[0-9]{4} \(20 positions, 2 sequences\)$' "$T/out" && [ "$(wc -l < "$T/out")" = 1 ] \
  || fail "stdout is not one PPL line: $(cat "$T/out")"
grep -q "^score \[#*\] 22/22 tokens" "$T/err" || fail "no final progress line: $(cat "$T/err")"
grep -q "scored sequence" "$T/err" && fail "one line per sequence on stderr"
grep -q "KV cache: .* tokens (.* blocks of 4), max concurrency .* at max_model_len 128, dtype bf16" "$T/err" \
  || fail "missing KV cache log line on stderr"
python3 - "$T/bf16.json" "$T/m" <<'PY' || fail "bad score JSON"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["model"] == sys.argv[2], j["model"]
assert j["kv_cache_dtype"] == "bf16"
assert "fp8kv_version" in j
s = j["sequences"]
assert len(s) == 2 and len(s[0]["token_ids"]) == 19 and s[1]["token_ids"] == [257, 65, 66]
for q in s:
    n = len(q["token_ids"])
    assert len(q["logprobs"]) == n and len(q["top1_ids"]) == n
    assert q["logprobs"][0] is None and q["top1_ids"][0] is None
    assert all(isinstance(x, float) and x <= 0 and math.isfinite(x) for x in q["logprobs"][1:])
    assert all(isinstance(x, int) and 0 <= x < 272 for x in q["top1_ids"][1:])
# The PPL and its uncertainty, from the logprobs (llama-perplexity's estimate).
nll = [-x for q in s for x in q["logprobs"][1:]]
n = len(nll); m = sum(nll) / n; var = sum(x * x for x in nll) / n - m * m
assert j["positions"] == n == 20
assert abs(j["ppl"] - math.exp(m)) < 1e-9 * math.exp(m), (j["ppl"], math.exp(m))
assert abs(j["ppl_stderr"] - math.exp(m) * math.sqrt(var / (n - 1))) < 1e-6 * j["ppl"], j["ppl_stderr"]
PY
# The PPL line prints the JSON's figures.
python3 - "$T/bf16.json" "$T/out" <<'PY' || fail "PPL line differs from the JSON"
import json, sys
j = json.load(open(sys.argv[1])); line = open(sys.argv[2]).read()
assert line.startswith(f"PPL = {j['ppl']:.4f} ± {j['ppl_stderr']:.4f} "), (line, j["ppl"])
PY

# fp8 cache: same shape, logprobs close to bf16 (random model: loose format-level bound).
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/fp8.json" --kv-cache-dtype fp8 --threads 1
python3 - "$T/bf16.json" "$T/fp8.json" <<'PY' || fail "fp8 vs bf16"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["kv_cache_dtype"] == "fp8_e4m3"
d = max(abs(x - y) for s, t in zip(a["sequences"], b["sequences"]) for x, y in zip(s["logprobs"][1:], t["logprobs"][1:]))
assert 0 < d < 0.5, d
PY

# Chunked prefill gives identical output.
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/chunk.json" --chunk-size 3 --block-size 4
python3 - "$T/bf16.json" "$T/chunk.json" <<'PY' || fail "chunked differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["sequences"] == b["sequences"]
PY

# A flat array is one sequence; tokenize's own {"ids": [...]} output is accepted.
echo '[257, 1, 2, 3]' > "$T/flat.json"
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/flat.json" --output "$T/flat_out.json"
echo '{"ids": [257, 1, 2, 3]}' > "$T/tok.json"
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/tok.json" --output "$T/tok_out.json"
cmp -s "$T/flat_out.json" "$T/tok_out.json" || fail '{"ids": [...]} scored differently from the flat array'
"$BIN" tokenize "$T/m" --text "Hello world" > "$T/tok2.json" || fail tokenize
expect_rc 0 "$BIN" score "$T/m" --token-ids-file "$T/tok2.json" --output "$T/tok2_out.json"
# One token (flat, nested, or as {"ids"}) leaves nothing to score: exit 2, as a one-token text.
for one in '[5]' '[[5]]' '[[257, 1], [5]]' '{"ids": [5]}'; do
  echo "$one" > "$T/one.json"
  expect_refused "score $one" "has 1 token; scoring needs at least 2" "$BIN" score "$T/m" --token-ids-file "$T/one.json" --output "$T/one_out.json"
done
for bad in '{"ids": [1, 2], "x": 1}' '{"tokens": [1, 2]}' '{}'; do
  echo "$bad" > "$T/bad.json"
  expect_refused "score $bad" 'or {"ids": [...]}' "$BIN" score "$T/m" --token-ids-file "$T/bad.json" --output "$T/bad_out.json"
done

# Text file, cut into --context chunks; a last chunk shorter than 2 tokens is dropped.
printf 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJK' > "$T/text.txt"   # 47 bytes + BOS = 48 tokens
expect_rc 0 "$BIN" score "$T/m" --text-file "$T/text.txt" --context 16 --output "$T/text.json"
python3 - "$T/text.json" <<'PY' || fail "text chunks"
import json, sys
s = json.load(open(sys.argv[1]))["sequences"]
assert [len(q["token_ids"]) for q in s] == [16, 16, 16], [len(q["token_ids"]) for q in s]
assert s[0]["token_ids"][:3] == [257, 97, 98]
PY
printf 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKL' > "$T/text2.txt"  # 49 tokens: last chunk of 1 dropped
expect_rc 0 "$BIN" score "$T/m" --text-file "$T/text2.txt" --context 16 --output "$T/text2.json"
python3 -c "import json,sys; assert len(json.load(open(sys.argv[1]))['sequences']) == 3" "$T/text2.json" || fail "short last chunk kept"

# auto resolves to fp8 when the checkpoint declares an fp8 KV scheme.
cp -r "$T/m" "$T/m8"
python3 - "$T/m8/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["quantization_config"] = {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}
json.dump(c, open(sys.argv[1], "w"))
PY
expect_rc 0 "$BIN" score "$T/m8" --token-ids-file "$T/ids.json" --output "$T/auto.json"
grep -q '"kv_cache_dtype":"fp8_e4m3"' "$T/auto.json" || fail "auto did not resolve to fp8_e4m3"

# Bad input: exit 2 with one clear line, no output file.
expect_rc 2 "$BIN" score "$T/m" --output "$T/x.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --text-file "$T/text.txt" --output "$T/x.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --no-such-flag
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --max-model-len 10
grep -q "max_model_len" "$T/err" || fail "no max_model_len in the error"
echo '[257, 999]' > "$T/oov.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/oov.json" --output "$T/x.json"
echo '["a"]' > "$T/badids.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/badids.json" --output "$T/x.json"
echo '[]' > "$T/empty.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/empty.json" --output "$T/x.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/nope.json" --output "$T/x.json"
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --kv-cache-dtype fp16
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --kv-memory 12XB
expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --kv-memory 1KiB
expect_rc 2 "$BIN" score "$T/nodir" --token-ids-file "$T/ids.json" --output "$T/x.json"
[ -e "$T/x.json" ] && fail "an output file was written on error"
if ! "$BIN" --version 2>/dev/null | grep -qi cuda; then
  expect_rc 2 "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/x.json" --backend cuda
fi
echo "score e2e: OK"
