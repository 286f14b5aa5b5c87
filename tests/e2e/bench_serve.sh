#!/usr/bin/env bash
# e2e: `fp8kv bench serve` against `fp8kv serve --port 0` on the bundled
# model's config.json alone (--load-format dummy, --tokenizer the bundled
# model: the GPU script's setup) on the CPU: 8 streamed requests at once with --ignore-eos; the result JSON has
# vLLM's names, completed == --num-prompts, the token totals are exact, the
# throughputs agree with the duration, and the server counted the same
# tokens in /metrics. Bad flags and an unreachable server exit 2.
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
N=8 IN=24 OUTLEN=6

mkdir -p "$T/cfg" && cp "$M/config.json" "$T/cfg/"
"$BIN" serve "$T/cfg" --load-format dummy --tokenizer "$M" --port 0 --threads 1 >"$T/serve.out" 2>"$T/serve.err" &
SP=$!
trap 'kill $SP 2>/dev/null; wait $SP 2>/dev/null; rm -rf "$T"' EXIT
PORT=""
for _ in $(seq 240); do
  PORT=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$T/serve.err" | sed 's/.*://')
  [ -n "$PORT" ] && break
  kill -0 $SP 2>/dev/null || { cat "$T/serve.err" >&2; fail "serve exited early"; }
  sleep 0.25
done
[ -n "$PORT" ] || fail "serve did not print its address"

expect_rc 0 "$BIN" bench serve --port "$PORT" --num-prompts $N --random-input-len $IN --random-output-len $OUTLEN \
  --ignore-eos --request-rate inf --seed 3 --save-result --result-dir "$T" --result-filename r.json
grep -q "Successful requests: *$N" "$T/out" || fail "table lacks 'Successful requests: $N': $(cat "$T/out")"
echo "ok   bench serve table"
# Progress on stderr (issue 37 A5): the finished requests of the timed run.
grep -q "bench serve \[#*\] $N/$N requests" "$T/err" || fail "no progress line '$N/$N requests': $(cat "$T/err")"
echo "ok   bench serve progress"

python3 - "$T/r.json" $N $IN $OUTLEN <<'PY' || fail "result JSON check failed"
import json, math, sys
j = json.load(open(sys.argv[1])); n, inp, out = map(int, sys.argv[2:5])
need = ["completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "duration", "num_prompts", "request_rate",
        "input_lens", "output_lens", "ttfts", "itls", "errors"]
for m in ["ttft", "tpot", "itl", "e2el"]:
    need += [f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms", f"p99_{m}_ms"]
for k in need:
    assert k in j, f"missing {k}"
    if isinstance(j[k], float):
        assert math.isfinite(j[k]) and j[k] >= 0, f"{k} = {j[k]}"
assert j["completed"] == n and j["failed"] == 0, (j["completed"], j["failed"], j["errors"])
assert j["num_prompts"] == n and j["request_rate"] == "inf"
# --ignore-eos: every request returns exactly max_tokens tokens (usage), and
# the prompts are token ids, so their lengths are exact.
assert j["total_input_tokens"] == n * inp, j["total_input_tokens"]
assert j["total_output_tokens"] == n * out, j["total_output_tokens"]
assert j["output_lens"] == [out] * n and j["input_lens"] == [inp] * n
def close(a, b, rel=1e-9):
    assert abs(a - b) <= rel * max(abs(a), abs(b)), (a, b)
d = j["duration"]
assert d > 0
close(j["request_throughput"] * d, n)
close(j["output_throughput"] * d, n * out)
close(j["total_token_throughput"] * d, n * (inp + out))
for m in ["ttft", "tpot", "itl", "e2el"]:
    assert j[f"mean_{m}_ms"] > 0, m
    assert j[f"median_{m}_ms"] <= j[f"p99_{m}_ms"] + 1e-9, m
# A chunk carries a batch of new tokens (docs/server.md): tokens from steps
# that ran while the stream's writer was busy go out in one chunk (a loaded
# 2-core CI machine does this). So a request has at most out - 1 gaps, not
# exactly that many. TTFT <= e2e latency <= duration.
assert len(j["itls"]) == n
assert all(len(x) <= out - 1 for x in j["itls"]), [len(x) for x in j["itls"]]
assert all(t >= 0 for x in j["itls"] for t in x)
assert all(0 < t for t in j["ttfts"])
assert j["p99_e2el_ms"] <= d * 1e3 + 1e-6
print("ok   result JSON: completed", j["completed"], "of", n)
PY

# The server saw the same tokens: the timed run plus the initial test request.
curl -s "http://127.0.0.1:$PORT/metrics" >"$T/metrics" || fail "GET /metrics failed"
gen=$(grep -E '^fp8kv:generation_tokens_total' "$T/metrics" | awk '{print $2}')
python3 -c "import sys; g=float(sys.argv[1]); w=float(sys.argv[2]); sys.exit(0 if g==w else 1)" "${gen:-0}" $(( (N + 1) * OUTLEN )) ||
  fail "generation_tokens_total = $gen, expected $(( (N + 1) * OUTLEN ))"
echo "ok   /metrics generation tokens = $gen"

# The chat endpoint (vLLM's --backend openai-chat): the random ids decoded
# to text in one user message; the input tokens are the server's
# usage.prompt_tokens (the text re-tokenized inside the chat template).
expect_rc 0 "$BIN" bench serve --port "$PORT" --endpoint /v1/chat/completions --tokenizer "$SRC/models/fp8kv-mini" \
  --num-prompts 4 --random-input-len $IN --random-output-len $OUTLEN --ignore-eos --seed 5 --json
python3 - "$T/out" $OUTLEN <<'PY' || fail "chat result check failed: $(head -c 600 "$T/out")"
import json, sys
j = json.load(open(sys.argv[1])); out = int(sys.argv[2])
assert j["completed"] == 4 and j["failed"] == 0, j["errors"]
assert j["endpoint"] == "/v1/chat/completions"
assert j["output_lens"] == [out] * 4, j["output_lens"]
assert all(n > 0 for n in j["input_lens"]), j["input_lens"]
assert j["total_input_tokens"] == sum(j["input_lens"])
assert j["backend"] == "openai-chat"
# A chunk may carry several tokens (steps merged while the writer was busy),
# so there may be fewer ITL samples than tokens.
assert all(t > 0 for t in j["ttfts"])
print("ok   chat endpoint: input tokens", j["input_lens"])
PY
expect_refused "chat without a tokenizer" "chat prompts are text" "$BIN" bench serve --port "$PORT" \
  --endpoint /v1/chat/completions --num-prompts 1
expect_refused "rate 0" "--request-rate" "$BIN" bench serve --port "$PORT" --num-prompts 1 --request-rate 0
expect_refused "dataset" "--dataset-name" "$BIN" bench serve --port "$PORT" --dataset-name sharegpt
expect_refused "base url" "--base-url" "$BIN" bench serve --base-url "ftp://127.0.0.1:$PORT"
kill $SP; wait $SP; rc=$?
[ "$rc" = 0 ] || fail "serve exited $rc on SIGTERM"
# Nothing listens on the old port now.
expect_refused "unreachable" "cannot reach" "$BIN" bench serve --port "$PORT" --num-prompts 1
echo "ok   bench serve e2e"
