#!/usr/bin/env bash
# Multi-process tensor parallelism on the CPU (docs/design.md, "Multi-process
# tensor parallelism"): two `fp8kv` processes (--nnodes 2, --node-rank 0/1,
# sockets on 127.0.0.1) give bitwise the scores of the single-process TP 2
# (the same rank-order fp32 sums: backend/comm.h), hence TP 1 within
# tp.sh's bound; greedy `generate` prints the same text and the same KV
# clip counts (rank 0 sums both ranks'); rank 1 prints nothing and exits 0.
# Bad rank/world combinations, an unreachable master and ranks with other
# linear-attention state dtypes exit 2 naming the cause; a killed peer ends
# the other process (no hang).
# Usage: bash tp_multiproc.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
free_port() { free_port_pair; }  # control and collectives (lib.sh)
random_ids "$T/ids.json" 48 8192 1
flags=(--kv-memory 4MiB --max-model-len 256 --kv-cache-dtype fp8 --threads 1)

# Single process: TP 1 and TP 2 (threads).
score_tp12 "$M" "$T/ids.json" "${flags[@]}"
# Two processes; rank 1 first (start order does not matter).
P=$(free_port); [ -n "$P" ] || fail "no free port"
mp=(--tp 2 --nnodes 2 --master-addr 127.0.0.1 --master-port "$P")
"$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/r1.json" "${flags[@]}" "${mp[@]}" --node-rank 1 \
  > "$T/o1" 2> "$T/er1" &
pid1=$!
"$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/r0.json" "${flags[@]}" "${mp[@]}" --node-rank 0 \
  > /dev/null 2> "$T/er0" || { kill $pid1 2>/dev/null; fail "rank 0: $(cat "$T/er0")"; }
wait $pid1 || fail "rank 1 exit $?: $(cat "$T/er1")"
[ -e "$T/r1.json" ] && fail "rank 1 wrote an output file"
[ -s "$T/o1" ] && fail "rank 1 printed: $(head -c 300 "$T/o1")"
python3 - "$T" <<'PY' || fail "2 processes != 2 threads / 1 rank"
import json, sys
T = sys.argv[1]
one = json.load(open(T + "/s1.json"))["sequences"][0]
thr = json.load(open(T + "/s2.json"))["sequences"][0]
mp = json.load(open(T + "/r0.json"))["sequences"][0]
assert mp["logprobs"] == thr["logprobs"], "2 processes differ from 2 simulated ranks"
assert mp["top1_ids"] == thr["top1_ids"]
d = max(abs(x - y) for x, y in zip(one["logprobs"], mp["logprobs"]) if x is not None)
assert d <= 1e-2, f"max |dlogprob| vs TP 1 {d}"
assert mp["top1_ids"] == one["top1_ids"], "top-1 differs from TP 1"
print(f"ok   score, 2 processes == 2 simulated ranks bitwise; vs TP 1 max |dlogprob| {d:.3g}, same top-1")
PY

# --load-format dummy: each rank makes only its shard (bitwise the slice of
# the full dummy model), so 2 processes == 1 process TP 2 == TP 1 bitwise here.
for tp in 1 2; do
  "$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/d$tp.json" "${flags[@]}" --tp $tp --load-format dummy \
    > /dev/null 2> "$T/de$tp" || fail "dummy score --tp $tp: $(cat "$T/de$tp")"
done
P=$(free_port)
mp=(--tp 2 --nnodes 2 --master-port "$P" --load-format dummy)
"$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/dr1.json" "${flags[@]}" "${mp[@]}" --node-rank 1 \
  > /dev/null 2> "$T/der1" &
pid1=$!
"$BIN" score "$M" --token-ids-file "$T/ids.json" --output "$T/dr0.json" "${flags[@]}" "${mp[@]}" --node-rank 0 \
  > /dev/null 2> "$T/der0" || { kill $pid1 2>/dev/null; fail "dummy rank 0: $(cat "$T/der0")"; }
wait $pid1 || fail "dummy rank 1: $(cat "$T/der1")"
python3 - "$T" <<'PY' || fail "dummy: 2 processes != 1 process"
import json, sys
T = sys.argv[1]
one, thr, mp = (json.load(open(f"{T}/{n}.json"))["sequences"][0] for n in ("d1", "d2", "dr0"))
assert mp["logprobs"] == thr["logprobs"], "dummy: 2 processes differ from 2 simulated ranks"
d = max(abs(x - y) for x, y in zip(one["logprobs"], mp["logprobs"]) if x is not None)
assert d <= 1e-2, f"dummy: max |dlogprob| vs TP 1 {d}"
print(f"ok   dummy weights per rank: 2 processes == 2 simulated ranks bitwise; vs TP 1 max |dlogprob| {d:.3g}")
PY

# generate: the same greedy text as the single process.
"$BIN" generate "$M" --prompt "The fp8 cache" --max-tokens 24 "${flags[@]}" --tp 2 > "$T/g2" 2> "$T/ge2" \
  || fail "generate --tp 2: $(cat "$T/ge2")"
P=$(free_port)
mp=(--tp 2 --nnodes 2 --master-port "$P")
"$BIN" generate "$M" --prompt "The fp8 cache" --max-tokens 24 "${flags[@]}" "${mp[@]}" --node-rank 1 > "$T/gm1" 2> "$T/gem1" &
pid1=$!
"$BIN" generate "$M" --prompt "The fp8 cache" --max-tokens 24 "${flags[@]}" "${mp[@]}" --node-rank 0 > "$T/gm0" 2> "$T/gem0" \
  || { kill $pid1 2>/dev/null; fail "generate rank 0: $(cat "$T/gem0")"; }
wait $pid1 || fail "generate rank 1: $(cat "$T/gem1")"
cmp -s "$T/g2" "$T/gm0" || fail "generate text differs: '$(cat "$T/g2")' vs '$(cat "$T/gm0")'"
[ -s "$T/gm1" ] && fail "generate rank 1 printed: $(head -c 300 "$T/gm1")"
echo "ok   generate, 2 processes == 1 process: $(head -c 60 "$T/gm0" | tr '\n' ' ')"
# KV clip counts: rank 0 reports the sum over both processes (gathered on the
# control channel), the single process's line to the count.
c2=$(grep "^KV clipped at store" "$T/ge2") || fail "generate --tp 2 printed no clip line: $(cat "$T/ge2")"
cm=$(grep "^KV clipped at store" "$T/gem0") || fail "generate rank 0 printed no clip line: $(cat "$T/gem0")"
[ "$cm" = "$c2" ] || fail "clip counts: 2 processes '$cm', 1 process '$c2'"
echo "ok   KV clip counts, 2 processes == 1 process: $cm"

# Bad combinations (exit 2, before any model work).
s=(score "$M" --token-ids-file "$T/ids.json" --output "$T/x.json" "${flags[@]}")
expect_refused "nnodes != tp" "--nnodes must equal --tensor-parallel-size" "$BIN" "${s[@]}" --tp 1 --nnodes 2
expect_refused "node-rank out of range" "--node-rank 2 is out of range for --nnodes 2" \
  "$BIN" "${s[@]}" --tp 2 --nnodes 2 --node-rank 2
expect_refused "bad port" "--master-port must be in 1..65534" "$BIN" "${s[@]}" --tp 2 --nnodes 2 --master-port 0
# Unreachable master: bounded by --collective-timeout, naming the address.
P=$(free_port)
start=$(date +%s)
expect_refused "unreachable master" "127.0.0.1:$P" \
  "$BIN" "${s[@]}" --tp 2 --nnodes 2 --node-rank 1 --master-port "$P" --collective-timeout 2
[ $(( $(date +%s) - start )) -lt 60 ] || fail "unreachable master took too long"
# Rank 0 alone waits for its peer, bounded.
expect_refused "missing peer" "timed out" \
  "$BIN" "${s[@]}" --tp 2 --nnodes 2 --node-rank 0 --master-port "$P" --collective-timeout 2
expect_refused "bad --collective-timeout" "--collective-timeout" "$BIN" "${s[@]}" --collective-timeout 0
# The linear-attention state dtypes must be rank 0's (models/fp8kv-mini-gdn):
# both processes exit 2 naming the flags when the pools are allocated.
G="$SRC/models/fp8kv-mini-gdn"
P=$(free_port)
mp=(generate "$G" --prompt "The" --max-tokens 2 --threads 1 --tp 2 --nnodes 2 --master-port "$P" --collective-timeout 20)
"$BIN" "${mp[@]}" --node-rank 1 > /dev/null 2> "$T/sd1" &
pid1=$!
expect_refused "state dtypes differ" "rank 1 keeps the linear-attention states as conv bfloat16, recurrent float32 \
but rank 0 as conv bfloat16, recurrent bfloat16 (--mamba-cache-dtype, --mamba-ssm-cache-dtype)" \
  "$BIN" "${mp[@]}" --node-rank 0 --mamba-ssm-cache-dtype bfloat16
wait $pid1; rc=$?
[ "$rc" = 2 ] || fail "rank 1 exit $rc with other state dtypes than rank 0's: $(tail -c 400 "$T/sd1")"

# serve: SIGTERM on rank 0 ends rank 1 too (exit 0: rank 0's engine says
# quit); a rank 0 killed with SIGKILL ends rank 1 at once (exit != 0, no hang).
for sig in TERM KILL; do
  start_serve_pair "d$sig" "$M" "${flags[@]}"
  sleep 0.5
  kill -$sig $pid0
  wait $pid0 2>/dev/null
  start=$(date +%s)
  wait $pid1; rc=$?
  [ $(( $(date +%s) - start )) -lt 30 ] || fail "rank 1 took too long to end after rank 0's SIG$sig"
  if [ $sig = TERM ]; then
    [ "$rc" = 0 ] || fail "rank 1 exit $rc after rank 0's SIGTERM: $(tail -c 400 "$T/d$sig.e1")"
  else
    [ "$rc" != 0 ] || fail "rank 1 exit 0 after rank 0 was killed"
    grep -q "closed the connection\|Connection reset" "$T/d$sig.e1" || fail "rank 1's error: $(tail -c 400 "$T/d$sig.e1")"
  fi
  echo "ok   serve: SIG$sig on rank 0 ends rank 1 (exit $rc)"
done
echo ok
