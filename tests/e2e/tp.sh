#!/usr/bin/env bash
# --tensor-parallel-size on the CPU (simulated ranks): score on
# models/fp8kv-mini with TP 2 equals TP 1 within the cache-rounding bound of
# tests/engine/test_tp.cpp (logprobs within 1e-2, same top-1); the engine's
# "KV cache:" line equals `fp8kv capacity --tensor-parallel-size 2` (per-rank
# bytes, total tokens); a size that does not divide the heads is refused by
# name (exit 2).
# Usage: bash tp.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
python3 -c "import json, random; random.seed(1); json.dump([random.randrange(8192) for _ in range(48)], open('$T/ids.json', 'w'))"
flags=(--kv-memory 4MiB --max-model-len 256 --kv-cache-dtype fp8 --threads 2)
for tp in 1 2; do
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/s$tp.json" "${flags[@]}" --tp $tp \
    > /dev/null 2> "$T/e$tp" || fail "score --tp $tp: $(cat "$T/e$tp")"
done
python3 - "$T" <<'PY' || fail "TP 2 != TP 1"
import json, sys
T = sys.argv[1]
a = json.load(open(T + "/s1.json"))["sequences"][0]
b = json.load(open(T + "/s2.json"))["sequences"][0]
d = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None)
assert d <= 1e-2, f"max |dlogprob| {d}"
assert a["top1_ids"] == b["top1_ids"], "top-1 differs"
print(f"ok   score --tp 2 vs 1: max |dlogprob| {d:.3g}, same top-1")
PY
want=$("$BIN" capacity "$M" --kv-memory 4MiB --max-model-len 256 --kv-cache-dtype fp8 --tensor-parallel-size 2 --json \
  | python3 -c "import json, sys; print(json.load(sys.stdin)['log_line'])")
got=$(grep -o "KV cache: .*" "$T/e2" | head -1)
[ "$got" = "$want" ] || fail "engine '$got' != capacity '$want'"
echo "ok   KV cache line = capacity --tensor-parallel-size 2"
expect_refused "tp 3" "--tensor-parallel-size 3 does not divide num_attention_heads 8" \
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" "${flags[@]}" --tp 3
expect_refused "tp 0" "--tensor-parallel-size must be >= 1" \
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" "${flags[@]}" --tp 0
echo ok
