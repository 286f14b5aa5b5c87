#!/usr/bin/env bash
# GPU machine (repo root): the HF transformers peer of issue 12's batch-1 row
# (tools/bench_hf_peer.py: static KV cache + generate()'s torch.compile, random
# bf16 weights from tests/data/configs/llama-3.1-8b, 1024 in / 64 out, greedy,
# EOS ignored), in the same device call as `fp8kv bench latency` on the same
# shape (scripts/gpu_step.sh), so the two share the box. JSON + log under $OUT.
#   run(command="bash scripts/gpu_hf_peer.sh")
# Budget: HF_PEER_S (default 120 s; the compile takes ~40 s of it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 >"$OUT/smi.csv" 2>/dev/null &
smi=$!
timeout "${HF_PEER_S:-120}" python3 tools/bench_hf_peer.py tests/data/configs/llama-3.1-8b --input-len 1024 \
  --output-len 64 --json "$OUT/hf_peer.json" >"$OUT/hf_peer.log" 2>&1
rc=$?
kill $smi 2>/dev/null
echo "hf peer: rc $rc"
python3 - "$OUT/hf_peer.json" <<'PY' || tail -5 "$OUT/hf_peer.log"
import json, sys
j = json.load(open(sys.argv[1]))
print(f"hf peer ({j['peer']}, torch {j['torch']}, transformers {j['transformers']}): "
      f"{j['decode_ms_per_step']:.3f} ms/step, {j['decode_tokens_per_s']:.1f} decode tok/s, "
      f"floor fraction {j['floor_fraction']:.3f} (copy {j['copy_gbps']:.0f} GB/s)")
PY
