#!/usr/bin/env bash
# Called by scripts/gpu_engine.sh on the GPU machine once `--backend cuda` is
# wired: score a held-out file with --backend cpu and cuda, bf16 and fp8
# caches, and print mean |delta logprob| (cuda vs cpu, and each vs the cpu
# bf16 run); greedy generate on both backends; the exit-2 refusals.
#   bash scripts/gpu_engine_score.sh BIN MODEL_DIR OUT_DIR
set -uo pipefail
BIN=$1 MODEL=$2 OUT=$3
head -c 30000 "$MODEL/eval/heldout_1.txt" > "$OUT/heldout_1_head30k.txt"  # the first 30 kB: a few thousand tokens
TEXT=$OUT/heldout_1_head30k.txt
for be in cpu cuda; do
  for dt in bf16 fp8; do
    /usr/bin/time -f "score $be $dt: %e s" "$BIN" score "$MODEL" --text-file "$TEXT" --context 1024 \
      --kv-cache-dtype $dt --backend $be --output "$OUT/score_${be}_${dt}.json" 2>&1 | tail -2
  done
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def lps(name):
    d = json.load(open(f"{out}/score_{name}.json"))
    return [x for s in d["sequences"] for x in s["logprobs"] if x is not None], d
def mad(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)
r = {}
for n in ["cpu_bf16", "cpu_fp8", "cuda_bf16", "cuda_fp8"]:
    try: r[n] = lps(n)[0]
    except Exception as e: print(n, "missing:", e)
if len(r) == 4:
    n = len(r["cpu_bf16"])
    print(f"tokens scored: {n}")
    print(f"mean|dlogprob| cuda_bf16 vs cpu_bf16: {mad(r['cuda_bf16'], r['cpu_bf16']):.5f}")
    print(f"mean|dlogprob| cuda_fp8  vs cpu_fp8 : {mad(r['cuda_fp8'], r['cpu_fp8']):.5f}")
    print(f"mean|dlogprob| cpu_fp8   vs cpu_bf16: {mad(r['cpu_fp8'], r['cpu_bf16']):.5f}")
    print(f"mean|dlogprob| cuda_fp8  vs cpu_bf16: {mad(r['cuda_fp8'], r['cpu_bf16']):.5f}")
    for k in r: print(f"mean logprob {k}: {sum(r[k]) / n:.5f}")
PY
for be in cpu cuda; do
  "$BIN" generate "$MODEL" --prompt "The history of the" --max-tokens 32 --backend $be > "$OUT/gen_$be.txt" 2>/dev/null
  echo "generate $be: $(head -c 200 "$OUT/gen_$be.txt" | tr '\n' ' ')"
done
cmp -s "$OUT/gen_cpu.txt" "$OUT/gen_cuda.txt" && echo "greedy generate: cpu == cuda" || echo "greedy generate: cpu != cuda"
"$BIN" score "$MODEL" --text-file "$TEXT" --context 64 --block-size 8 --backend cuda --output "$OUT/x.json" 2>&1 | tail -1
echo "block-size 8 exit: ${PIPESTATUS[0]}"
echo '[1, 2, 3, 4]' > "$OUT/ids.json"
"$BIN" score tests/data/tiny_llama --token-ids-file "$OUT/ids.json" --backend cuda --output "$OUT/y.json" 2>&1 | tail -1
echo "head_dim 8 exit: ${PIPESTATUS[0]}"
