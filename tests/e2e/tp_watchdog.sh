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

# 2. SIGSTOP on the follower: a stalled collective, --collective-timeout 2.
start_pair 2 stop
kill -STOP $pid1
t0=$(now)
wait_exit $pid0 12; rc=$?
dt=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
[ "$rc" = 1 ] || { kill -9 $pid1; fail "stop: rank 0 exit $rc, expected 1: $(tail -c 400 "$T/stop.e0")"; }
check_line "$T/stop.e0" \
  "^fp8kv: rank 1 stalled during $op_re: .*within the collective timeout \(2 s, --collective-timeout\); rank 0 stops$" "stop"
# It waited for the timeout (not less), and not much more (2-core CI slack).
python3 -c "import sys; sys.exit(0 if 1.9 <= $dt < 8 else 1)" || { kill -9 $pid1; fail "stop: rank 0 took $dt s, expected about 2"; }
echo "ok   SIGSTOP on rank 1, --collective-timeout 2: rank 0 exits 1 after $dt s: $(grep '^fp8kv: ' "$T/stop.e0")"
kill -CONT $pid1
wait_exit $pid1 10; rc=$?
[ "$rc" = 1 ] || fail "stop: rank 1 (continued) exit $rc, expected 1: $(tail -c 400 "$T/stop.e1")"
check_line "$T/stop.e1" "^fp8kv: rank 0 lost during $op_re: .*; rank 1 stops$" "stop, rank 1"
[ -s "$T/stop.o1" ] && fail "rank 1 printed: $(head -c 200 "$T/stop.o1")"
echo "ok   rank 1, continued, exits 1: $(grep '^fp8kv: ' "$T/stop.e1")"

# 3. SIGSTOP on the leader: its followers see it stall (they wait for its
# next step or sit in a collective, both bounded by the timeout).
start_pair 2 lstop
kill -STOP $pid0
t0=$(now)
wait_exit $pid1 12; rc=$?
dt=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
[ "$rc" = 1 ] || { kill -9 $pid0; fail "leader stop: rank 1 exit $rc, expected 1: $(tail -c 400 "$T/lstop.e1")"; }
check_line "$T/lstop.e1" \
  "^fp8kv: rank 0 stalled during $op_re: .*within the collective timeout \(2 s, --collective-timeout\); rank 1 stops$" \
  "leader stop"
python3 -c "import sys; sys.exit(0 if 1.9 <= $dt < 8 else 1)" || { kill -9 $pid0; fail "leader stop: rank 1 took $dt s"; }
kill -CONT $pid0
wait_exit $pid0 10; rc=$?
[ "$rc" = 1 ] || fail "leader stop: rank 0 (continued) exit $rc, expected 1: $(tail -c 400 "$T/lstop.e0")"
check_line "$T/lstop.e0" "^fp8kv: rank 1 lost during $op_re: .*; rank 0 stops$" "leader stop, rank 0"
echo "ok   SIGSTOP on rank 0: rank 1 exits 1 after $dt s: $(grep '^fp8kv: ' "$T/lstop.e1")"

echo ok
