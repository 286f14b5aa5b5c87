# Shared preamble of tests/e2e/*.sh. Each script starts with
#   source "$(dirname "$0")/lib.sh"
# and is run by CTest as `bash SCRIPT <fp8kv-binary> <source-dir>`. Sets BIN,
# SRC, HERE (this folder), T (a temporary directory removed at exit) and the
# helpers below. Not a test itself: tests/CMakeLists.txt skips it.
set -u
BIN=$1; SRC=$2
HERE="$SRC/tests/e2e"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_rc CODE cmd... : runs cmd (stdout -> $T/out, stderr -> $T/err) and
# fails unless it exits with CODE.
expect_rc() {
  local want=$1; shift
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  [ "$rc" = "$want" ] || { cat "$T/err" >&2; fail "expected exit $want, got $rc: $*"; }
}

# expect_refused NAME SUBSTRING cmd... : bad input. cmd must exit 2, print
# nothing on stdout, and say SUBSTRING (fixed string) on stderr.
expect_refused() {
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  [ "$rc" = 2 ] || fail "$name: exit $rc, expected 2: $(cat "$T/err")"
  [ -s "$T/out" ] && fail "$name: wrote to stdout on error: $(head -c 300 "$T/out")"
  grep -qF -- "$want" "$T/err" || fail "$name: stderr lacks '$want': $(cat "$T/err")"
  echo "ok   $name"
}

# write_report FILE STATUS K:V...: a calibration report as inject reads it
# (target fp8_e4m3, rule safety:1.3, q_scale 1.0) with one layer per K:V
# pair; K and V are raw JSON (a test may write null, NaN or a list).
write_report() {
  local f=$1 status=$2 i=0 sep="" kv
  shift 2
  {
    printf '{"status": "%s", "target": "fp8_e4m3", "rule": "safety:1.3", "layers": [' "$status"
    for kv in "$@"; do
      printf '%s\n {"layer": %d, "k_scale": %s, "v_scale": %s, "q_scale": 1.0}' "$sep" "$i" "${kv%%:*}" "${kv#*:}"
      sep=","; i=$((i + 1))
    done
    printf ']}\n'
  } > "$f"
}

# random_ids FILE N VOCAB SEED: a JSON list of N token ids below VOCAB.
random_ids() {
  python3 -c "import json, random, sys; random.seed(int(sys.argv[4])); \
json.dump([random.randrange(int(sys.argv[3])) for _ in range(int(sys.argv[2]))], open(sys.argv[1], 'w'))" "$@"
}

# score_tp12 MODEL IDS ARGS...: `score` of the ids in IDS at --tp 1 and --tp 2
# (one process) into $T/s1.json and $T/s2.json, stderr in $T/e1 and $T/e2.
score_tp12() {
  local model=$1 ids=$2 tp
  shift 2
  for tp in 1 2; do
    "$BIN" score "$model" --token-ids-file "$ids" --output "$T/s$tp.json" "$@" --tp $tp > /dev/null 2> "$T/e$tp" \
      || fail "score --tp $tp: $(cat "$T/e$tp")"
  done
}

# True when BIN was built with AddressSanitizer (its allocator reserves far
# more virtual memory than `ulimit -v` allows, so memory-limit checks skip).
bin_has_asan() { ldd "$BIN" 2>/dev/null | grep -q libasan; }

# free_port_pair: prints a free TCP port P on 127.0.0.1 whose P + 1 is free
# too (a tensor-parallel group's control channel and collectives).
free_port_pair() {
  python3 - <<'PY'
import socket
for _ in range(200):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    if p > 65000: a.close(); continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError: pass
    finally: a.close(); b.close()
PY
}

# start_serve_pair TAG MODEL ARGS...: one tensor-parallel group of two `serve`
# processes (--tp 2 --nnodes 2 on a free port pair, rank 1 started first),
# stderr in $T/TAG.e0 and $T/TAG.e1. Sets pid0, pid1 and port (rank 0's HTTP
# port) once rank 0 listens; otherwise kills both and fails.
start_serve_pair() {
  local tag=$1 model=$2 P; shift 2
  P=$(free_port_pair); [ -n "$P" ] || fail "$tag: no free port"
  local mp=(--tp 2 --nnodes 2 --master-port "$P")
  "$BIN" serve "$model" --port 0 "$@" "${mp[@]}" --node-rank 1 > /dev/null 2> "$T/$tag.e1" &
  pid1=$!
  "$BIN" serve "$model" --port 0 "$@" "${mp[@]}" --node-rank 0 > /dev/null 2> "$T/$tag.e0" &
  pid0=$!
  for _ in $(seq 1 300); do grep -q "listening on" "$T/$tag.e0" 2>/dev/null && break; sleep 0.1; done
  port=$(grep -o 'listening on http://[^ ]*' "$T/$tag.e0" | grep -o '[0-9]*$')
  [ -n "$port" ] || { kill -9 $pid0 $pid1 2>/dev/null; fail "$tag: serve did not start: $(tail -c 400 "$T/$tag.e0")"; }
}

# ---- tensor-parallel watchdog helpers (tp_watchdog*.sh) ----
now() { date +%s.%N; }
# The watchdog's operations (docs/tp.md "The watchdog"), and its one line
# (check_line FILE REGEX NAME: exactly one 'fp8kv: ' line, matching REGEX).
op_re='(all_reduce|all_gather|the step broadcast|the KV clip counts|the keepalive|the wait for the next step)( \(layer [0-9]+\))?'
check_line() {  # FILE REGEX NAME
  local n
  n=$(grep -c '^fp8kv: ' "$1")
  [ "$n" = 1 ] || fail "$3: $n 'fp8kv: ' lines, expected 1: $(tail -c 600 "$1")"
  grep -qE "$2" "$1" || fail "$3: the line does not match '$2': $(grep '^fp8kv: ' "$1")"
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
