#!/usr/bin/env bash
# kill -9 at random moments during `fp8kv inject` (the test-only option
# --test-step-delay-ms widens the windows between steps). After every kill the checkpoint must load
# (fp8kv inspect exit 0) with either the old or the new scales, and the weight
# shards must be byte-identical. 60 in-place trials (sharded and single-file
# checkpoints) + 12 --output trials (the output appears whole or not at all).
# Usage: bash inject_kill9.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
TRIALS=${FP8KV_KILL9_TRIALS:-30}   # per checkpoint kind
SLOW=15

report() { write_report "$1" complete 1.0:1.0 "1.0:$2" 1.0:1.0; }  # report FILE V1
report "$T/a.json" 2.5
report "$T/b.json" 4.75
v1() { python3 "$HERE/inject_read_scale.py" "$1" model.layers.1.self_attn.v_scale; }
weights_hash() { ls "$1"/model*.safetensors | sort | xargs sha256sum | cut -d' ' -f1 | md5sum; }
# Kill moments span one whole uninterrupted run (process start included: a
# CUDA build loads cuBLASLt at start, which alone can outlast a fixed window).
SPAN_MS=220
calibrate_span() {
  local m="$T/m_span"; python3 "$HERE/inject_make_checkpoint.py" "$m" > /dev/null || fail make
  local t0 t1; t0=$(date +%s%N)
  "$BIN" inject "$m" --test-step-delay-ms "$SLOW" --report "$T/a.json" --in-place > /dev/null 2>&1 || fail "inject (timing run)"
  t1=$(date +%s%N); SPAN_MS=$(( (t1 - t0) / 1000000 * 11 / 10 + 1 ))
  rm -rf "$m"
}
rand_delay() { local ms=$(( (RANDOM * 32768 + RANDOM) % SPAN_MS )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

calibrate_span
echo "kill window: 0..${SPAN_MS} ms" >&2
total_old=0; total_new=0
for kind in sharded single; do
  M="$T/m_$kind"
  if [ $kind = sharded ]; then python3 "$HERE/inject_make_checkpoint.py" "$M" --sharded || fail make
  else python3 "$HERE/inject_make_checkpoint.py" "$M" || fail make; fi
  W=$(weights_hash "$M")
  cur=missing
  for i in $(seq 1 "$TRIALS"); do
    if [ "$cur" = "2.5" ]; then rep="$T/b.json"; new=4.75; else rep="$T/a.json"; new=2.5; fi
    "$BIN" inject "$M" --test-step-delay-ms "$SLOW" --report "$rep" --in-place > /dev/null 2> "$T/err" &
    pid=$!
    sleep "$(rand_delay)"
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
    "$BIN" inspect "$M" > /dev/null 2> "$T/ierr" || fail "$kind trial $i: inspect failed after kill: $(cat "$T/ierr")"
    got=$(v1 "$M")
    if [ "$got" = "$new" ]; then total_new=$((total_new + 1))
    elif [ "$got" = "$cur" ]; then total_old=$((total_old + 1))
    else fail "$kind trial $i: v_scale '$got' is neither old '$cur' nor new '$new'"; fi
    [ "$(weights_hash "$M")" = "$W" ] || fail "$kind trial $i: weight shards changed"
    cur=$got
  done
  # A clean run afterwards leaves exactly one scale shard and no temp files.
  "$BIN" inject "$M" --report "$T/b.json" --in-place > /dev/null 2> "$T/err" || fail "clean inject: $(cat "$T/err")"
  [ "$(v1 "$M")" = "4.75" ] || fail "clean inject value"
  leftovers=$(ls "$M" | grep -E 'kv_cache_scales\.[0-9a-f]+\.safetensors|\.tmp\.' || true)
  [ -z "$leftovers" ] || fail "leftovers after a clean inject: $leftovers"
  (cd "$M" && sha256sum -c --quiet SHA256SUMS) || fail "SHA256SUMS after clean inject"
done
echo "in-place kills: $total_old left the old scales, $total_new the new ones" >&2
[ $total_old -gt 0 ] && [ $total_new -gt 0 ] || fail "kills never hit one of the two outcomes (old $total_old, new $total_new)"

# --output: the new directory appears complete or not at all.
M="$T/m_sharded"; W=$(weights_hash "$M")
appeared=0
for i in $(seq 1 12); do
  O="$T/out$i"
  "$BIN" inject "$M" --test-step-delay-ms "$SLOW" --report "$T/a.json" --output "$O" > /dev/null 2> "$T/err" &
  pid=$!
  sleep "$(rand_delay)"
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
  if [ -e "$O" ]; then
    appeared=$((appeared + 1))
    "$BIN" inspect "$O" > /dev/null 2>&1 || fail "--output trial $i: output exists but does not load"
    [ "$(v1 "$O")" = "2.5" ] || fail "--output trial $i: output has v_scale $(v1 "$O")"
    (cd "$O" && sha256sum -c --quiet SHA256SUMS) || fail "--output trial $i: SHA256SUMS"
  fi
  [ "$(weights_hash "$M")" = "$W" ] || fail "--output trial $i: source weights changed"
done
echo "--output kills: $appeared of 12 outputs completed before the kill" >&2
echo "inject_kill9: ok"
