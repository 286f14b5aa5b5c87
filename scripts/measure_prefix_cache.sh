#!/usr/bin/env bash
# Usage: scripts/measure_prefix_cache.sh BIN MODEL_DIR "FLAGS" PORT (docs/server.md "Prefix caching").
# 8 requests sharing a ~470-token prefix, one after the other, caching on vs off.
set -e
BIN=$1; MODEL=$2; flag=$3; port=$4
$BIN serve $MODEL --port $port --threads 1 $flag > ${TMPDIR:-/tmp}/fp8kv_prefix_m_$port.log 2>&1 & spid=$!
for i in $(seq 60); do grep -q listening ${TMPDIR:-/tmp}/fp8kv_prefix_m_$port.log && break; sleep 1; done
prefix=$(python3 -c "print('The quick brown fox jumps over the lazy dog, and then it runs into the forest. ' * 18)")
t0=$(date +%s.%N)
for i in 1 2 3 4 5 6 7 8; do
  curl -s http://127.0.0.1:$port/v1/completions -H 'content-type: application/json' \
    -d "{\"prompt\": \"$prefix Question $i: what happened next?\", \"max_tokens\": 4, \"temperature\": 0}" | python3 -c "import json,sys; print(json.load(sys.stdin)['usage']['prompt_tokens'], end=' ')"
done
t1=$(date +%s.%N)
echo
curl -s http://127.0.0.1:$port/metrics | grep -E "^fp8kv:prefix_cache|^fp8kv:prompt_tokens_total"
echo "wall_s $(python3 -c "print(round($t1-$t0,2))")"
kill $spid
