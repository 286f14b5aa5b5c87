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
#   2b. the leader is stopped: the follower exits 1 after about 2 s ("rank 0
#      stalled"), and the leader, continued, exits 1 too;
#   3. `serve`: the follower is killed while two requests decode: the
#      non-streaming one gets a 503, the streaming one an error event, and
#      the server exits 1 with the one line;
#   4. no false alarm: an idle server (3 s without a step, timeout 1 s) keeps
#      its follower through the leader's keepalive and then answers a request.
# Usage: bash tp_watchdog.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
flags=(--kv-memory 8MiB --max-model-len 4096 --threads 1 --load-format dummy --kv-cache-dtype fp8)
gen=(generate "$M" --prompt "The fp8 cache" --max-tokens 4000 "${flags[@]}")
now() { date +%s.%N; }
# The one line every rank prints (and only one).
op_re='(all_reduce|all_gather|the step broadcast|the keepalive|the wait for the next step)( \(layer [0-9]+\))?'
check_line() {  # FILE REGEX NAME
  local n
  n=$(grep -c '^fp8kv: ' "$1")
  [ "$n" = 1 ] || fail "$3: $n 'fp8kv: ' lines, expected 1: $(tail -c 600 "$1")"
  grep -qE "$2" "$1" || fail "$3: the line does not match '$2': $(grep '^fp8kv: ' "$1")"
}
# Waits until FILE holds at least N bytes (the leader has streamed tokens).
wait_bytes() {  # FILE N PID
  for _ in $(seq 1 300); do
    [ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# wait_exit PID SECONDS: the exit code, or fails the test when still running.
wait_exit() {
  local pid=$1 limit=$2 t0
  t0=$(now)
  while kill -0 "$pid" 2>/dev/null; do
    if python3 -c "import sys; sys.exit(0 if $(now) - $t0 > $limit else 1)"; then
      kill -9 "$pid" 2>/dev/null
      fail "pid $pid still running after $limit s"
    fi
    sleep 0.05
  done
  wait "$pid"
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

# 2b. SIGSTOP on the leader: its followers see it stall (they wait for its
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

# 3. serve: open requests get 503 (or a 503 error event when streaming) and the server exits 1.
P=$(free_port_pair)
mp=(--tp 2 --nnodes 2 --master-port "$P" --collective-timeout 10)
"$BIN" serve "$M" --port 0 "${flags[@]}" "${mp[@]}" --node-rank 1 > /dev/null 2> "$T/s.e1" &
pid1=$!
"$BIN" serve "$M" --port 0 "${flags[@]}" "${mp[@]}" --node-rank 0 > /dev/null 2> "$T/s.e0" &
pid0=$!
for _ in $(seq 1 300); do grep -q "listening on" "$T/s.e0" 2>/dev/null && break; sleep 0.1; done
port=$(grep -o 'listening on http://[^ ]*' "$T/s.e0" | grep -o '[0-9]*$')
[ -n "$port" ] || { kill -9 $pid0 $pid1 2>/dev/null; fail "serve did not start: $(tail -c 400 "$T/s.e0")"; }
python3 - "$port" "$M" "$T" <<'PY' &
import http.client, json, sys, threading
port, model, T = int(sys.argv[1]), sys.argv[2], sys.argv[3]
body = {"model": model, "prompt": "The fp8 cache", "max_tokens": 4000, "temperature": 0}
def plain():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    json.dump({"status": r.status, "body": r.read().decode()}, open(T + "/s.plain", "w"))
def stream():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    r = c.getresponse()
    events = []
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: "): continue
        events.append(line[6:])
        if len(events) == 20: open(T + "/s.started", "w").close()
    json.dump({"status": r.status, "events": events}, open(T + "/s.stream", "w"))
ts = [threading.Thread(target=plain), threading.Thread(target=stream)]
for t in ts: t.start()
for t in ts: t.join()
PY
client=$!
for _ in $(seq 1 300); do [ -e "$T/s.started" ] && break; kill -0 $client 2>/dev/null || break; sleep 0.1; done
[ -e "$T/s.started" ] || { kill -9 $pid0 $pid1 2>/dev/null; fail "serve: no streamed tokens: $(tail -c 400 "$T/s.e0")"; }
t0=$(now)
{ kill -9 $pid1; wait $pid1; } 2>/dev/null
wait_exit $pid0 15; rc=$?
dt=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
wait_exit $client 15 || fail "the client failed"
[ "$rc" = 1 ] || fail "serve: rank 0 exit $rc, expected 1: $(tail -c 600 "$T/s.e0")"
check_line "$T/s.e0" "^fp8kv: rank 1 lost during $op_re: .*; rank 0 stops$" "serve"
python3 - "$T" <<'PY' || fail "serve: the open requests' answers"
import json, sys
T = sys.argv[1]
p = json.load(open(T + "/s.plain"))
assert p["status"] == 503, p
err = json.loads(p["body"])["error"]
assert err["type"] == "service_unavailable_error" and "rank 1 lost" in err["message"], err
s = json.load(open(T + "/s.stream"))
assert s["status"] == 200 and s["events"][-1] == "[DONE]", s["events"][-3:]
last = json.loads(s["events"][-2])["error"]
assert last["type"] == "service_unavailable_error" and "rank 1 lost" in last["message"], last
print("ok   serve: the open requests got 503 (streaming: a 503 error event):", err["message"][:100])
PY
echo "ok   serve: SIGKILL on rank 1: the server exits 1 after $dt s: $(grep '^fp8kv: ' "$T/s.e0")"

# 4. No false alarm: an idle server (no step for 3 x --collective-timeout 1)
# keeps its follower (the leader's keepalive), then serves a request.
P=$(free_port_pair)
mp=(--tp 2 --nnodes 2 --master-port "$P" --collective-timeout 1)
"$BIN" serve "$M" --port 0 "${flags[@]}" "${mp[@]}" --node-rank 1 > /dev/null 2> "$T/i.e1" &
pid1=$!
"$BIN" serve "$M" --port 0 "${flags[@]}" "${mp[@]}" --node-rank 0 > /dev/null 2> "$T/i.e0" &
pid0=$!
for _ in $(seq 1 300); do grep -q "listening on" "$T/i.e0" 2>/dev/null && break; sleep 0.1; done
port=$(grep -o 'listening on http://[^ ]*' "$T/i.e0" | grep -o '[0-9]*$')
[ -n "$port" ] || { kill -9 $pid0 $pid1 2>/dev/null; fail "idle serve did not start: $(tail -c 400 "$T/i.e0")"; }
sleep 3
kill -0 $pid1 2>/dev/null || { kill -9 $pid0; fail "idle: rank 1 ended: $(tail -c 400 "$T/i.e1")"; }
python3 - "$port" "$M" <<'PY' || { kill -9 $pid0 $pid1 2>/dev/null; fail "idle: the request after the idle period failed"; }
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
c.request("POST", "/v1/completions", json.dumps({"model": sys.argv[2], "prompt": "The fp8 cache", "max_tokens": 8}),
          {"Content-Type": "application/json"})
r = c.getresponse()
assert r.status == 200, (r.status, r.read())
PY
kill -TERM $pid0
wait_exit $pid0 40; rc0=$?
wait_exit $pid1 10; rc1=$?
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "idle: exits $rc0 / $rc1 after SIGTERM: $(tail -c 300 "$T/i.e0") / $(tail -c 300 "$T/i.e1")"
echo "ok   idle serve, --collective-timeout 1: 3 s without a step, then a request: 200; SIGTERM: both exit 0"
echo ok
