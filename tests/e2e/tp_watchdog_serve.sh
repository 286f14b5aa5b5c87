#!/usr/bin/env bash
# The tensor-parallel watchdog in `serve` on CPU ranks (docs/tp.md "The
# watchdog"; the generate cases: tp_watchdog.sh). Two `serve` processes
# (--nnodes 2) of fp8kv-mini's shape with dummy weights:
#   1. the follower is killed while two requests decode: the non-streaming
#      one gets a 503, the streaming one a 503 error event and [DONE], and the
#      server exits 1 with ONE line "fp8kv: rank 1 lost during ...";
#   2. no false alarm: an idle server (3 s without a step under
#      --collective-timeout 1) keeps its follower through the leader's
#      keepalive, then answers a request; SIGTERM ends both with exit 0.
# Usage: bash tp_watchdog_serve.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
M="$SRC/models/fp8kv-mini"
[ -f "$M/config.json" ] || fail "no $M"
flags=(--kv-memory 8MiB --max-model-len 4096 --threads 1 --load-format dummy --kv-cache-dtype fp8)

# 1. open requests get 503 (or a 503 error event when streaming) and the server exits 1.
start_serve_pair s "$M" "${flags[@]}" --collective-timeout 10
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

# 2. No false alarm: an idle server (no step for 3 x --collective-timeout 1)
# keeps its follower (the leader's keepalive), then serves a request.
start_serve_pair i "$M" "${flags[@]}" --collective-timeout 1
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
