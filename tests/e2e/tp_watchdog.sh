#!/usr/bin/env bash
# The tensor-parallel watchdog on CPU ranks (docs/tp.md "The watchdog"): two
# `fp8kv` processes (--nnodes 2) decode fp8kv-mini's shape with dummy weights
# (no EOS stops them early), and in the middle of decoding
#   1. the follower is killed (SIGKILL): the leader exits 1 at once, well
#      within --collective-timeout, with ONE line
#      "fp8kv: rank 1 lost during OP[ (layer N)]: REASON; rank 0 stops";
#   2. the follower is stopped (SIGSTOP) under --collective-timeout 2: the
#      leader exits 1 after about 2 s ("rank 1 stalled during ..."), and the
#      follower, continued, exits 1 too ("rank 0 lost during ...");
#   3. the leader is stopped: the follower exits 1 after about 2 s ("rank 0
#      stalled"), and the leader, continued, exits 1 too.
#   (serve: tp_watchdog_serve.sh)
# Usage: bash tp_watchdog.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
flags=(--kv-memory 8MiB --max-model-len 4096 --threads 1 --load-format dummy --kv-cache-dtype fp8)
gen=(generate "$M" --prompt "The fp8 cache" --max-tokens 4000 "${flags[@]}")
# Waits until FILE holds at least N bytes (the leader has streamed tokens).
wait_bytes() {  # FILE N PID
  for _ in $(seq 1 300); do
    [ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
start_pair() {  # TIMEOUT PREFIX: starts rank 1 then rank 0 of `generate`
  local P
  P=$(free_port_pair); [ -n "$P" ] || fail "no free port"
  local mp=(--tp 2 --nnodes 2 --master-port "$P" --collective-timeout "$1")
  "$BIN" "${gen[@]}" "${mp[@]}" --node-rank 1 > "$T/$2.o1" 2> "$T/$2.e1" &
  pid1=$!
  "$BIN" "${gen[@]}" "${mp[@]}" --node-rank 0 > "$T/$2.o0" 2> "$T/$2.e0" &
  pid0=$!
  wait_bytes "$T/$2.o0" 40 $pid0 || { kill -9 $pid0 $pid1 2>/dev/null;
    fail "$2: rank 0 streamed no tokens: $(tail -c 400 "$T/$2.e0") / $(tail -c 400 "$T/$2.e1")"; }
}

# 1. SIGKILL on the follower in the middle of decoding.
start_pair 10 kill
t0=$(now)
{ kill -9 $pid1; wait $pid1; } 2>/dev/null  # (quiet: no "Killed" job notice)
wait_exit $pid0 10; rc=$?
dt=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
[ "$rc" = 1 ] || fail "kill: rank 0 exit $rc, expected 1: $(tail -c 400 "$T/kill.e0")"
check_line "$T/kill.e0" "^fp8kv: rank 1 lost during $op_re: .*; rank 0 stops$" "kill"
python3 -c "import sys; sys.exit(0 if $dt < 5 else 1)" || fail "kill: rank 0 took $dt s (a dead peer ends the wait at once)"
echo "ok   SIGKILL on rank 1: rank 0 exits 1 after $dt s: $(grep '^fp8kv: ' "$T/kill.e0")"

# 2. and 3. SIGSTOP on one rank S, --collective-timeout 2: a stalled peer.
# The other rank W exits 1 after the timeout ("rank S stalled during ..."):
# the leader sits in a collective, the follower in one or in its wait for the
# next step, both bounded by the timeout. S, continued, exits 1 too ("rank W
# lost during ..."); rank 1 never prints.
stop_case() {  # NAME S
  local name=$1 s=$2 w=$((1 - $2)) spid wpid
  start_pair 2 "$name"
  if [ "$s" = 1 ]; then spid=$pid1; wpid=$pid0; else spid=$pid0; wpid=$pid1; fi
  kill -STOP $spid
  t0=$(now)
  wait_exit $wpid 12; rc=$?
  dt=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
  [ "$rc" = 1 ] || { kill -9 $spid; fail "$name: rank $w exit $rc, expected 1: $(tail -c 400 "$T/$name.e$w")"; }
  check_line "$T/$name.e$w" \
    "^fp8kv: rank $s stalled during $op_re: .*within the collective timeout \(2 s, --collective-timeout\); rank $w stops$" \
    "$name"
  # It waited for the timeout (not less), and not much more (2-core CI slack).
  python3 -c "import sys; sys.exit(0 if 1.9 <= $dt < 8 else 1)" \
    || { kill -9 $spid; fail "$name: rank $w took $dt s, expected about 2"; }
  echo "ok   SIGSTOP on rank $s, --collective-timeout 2: rank $w exits 1 after $dt s: $(grep '^fp8kv: ' "$T/$name.e$w")"
  kill -CONT $spid
  wait_exit $spid 10; rc=$?
  [ "$rc" = 1 ] || fail "$name: rank $s (continued) exit $rc, expected 1: $(tail -c 400 "$T/$name.e$s")"
  check_line "$T/$name.e$s" "^fp8kv: rank $w lost during $op_re: .*; rank $s stops$" "$name, rank $s"
  [ -s "$T/$name.o1" ] && fail "rank 1 printed: $(head -c 200 "$T/$name.o1")"
  echo "ok   rank $s, continued, exits 1: $(grep '^fp8kv: ' "$T/$name.e$s")"
}
stop_case stop 1
stop_case lstop 0

echo ok
