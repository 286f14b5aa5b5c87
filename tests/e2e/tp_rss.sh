#!/usr/bin/env bash
# Per-rank loading on CPU ranks (docs/tp.md "Per-rank loading"): with
# --load-format dummy each process of a TP 2 group (--nnodes 2) makes and
# holds only its shard, so its peak RSS is at most 0.65x the TP 1 process's
# (issue 36 item 2). Peak RSS: getrusage(RUSAGE_CHILDREN).ru_maxrss of a
# python wrapper that runs one fp8kv process (the child's VmHWM, KiB).
#
# Shape: Llama-3.2-1B's (tests/data/configs/llama-3.2-1b: hidden 2048,
# 32/8 heads, intermediate 8192, tied embeddings, vocab-parallel head) with
# num_hidden_layers 16 -> 2 and vocab_size 128256 -> 16032: the embedding
# and the layers shrink by the same factor 8, so the replicated share (the
# embedding) and hence the ratio stay the 1B's, while the CPU dummy-weight
# generation fits the 2-core CI (the full 1B takes ~75 s for TP 1 alone
# there). FULL_1B=1 runs the unreduced 1B shape (minutes; ~7.3 GB for TP 1).
# At the reduced shape the process's own memory (libraries, the CUDA
# runtime of a CUDA-enabled build, the tokenizer, ~0.1-0.2 GiB) is a sixth
# of TP 1's peak, where at the 1B shape it is ~2%: the ratio is taken over
# the model-dependent part, each peak less that of the same run on a
# near-empty model (hidden 64, one layer), and the raw ratio is printed too.
# Usage: bash tp_rss.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
bin_has_asan && { echo "skip: an ASan binary's shadow memory and quarantine are not the engine's RSS"; exit 0; }
TOK="$SRC/models/fp8kv-mini"
[ -f "$TOK/tokenizer.json" ] || fail "no $TOK"
CFG="$T/model" BASE="$T/base"
mkdir -p "$CFG" "$BASE"
python3 - "$SRC/tests/data/configs/llama-3.2-1b/config.json" "$CFG/config.json" "$BASE/config.json" "${FULL_1B:-0}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if sys.argv[4] != "1":
    c["num_hidden_layers"] //= 8
    c["vocab_size"] //= 8
json.dump(c, open(sys.argv[2], "w"))
c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
         head_dim=32)
json.dump(c, open(sys.argv[3], "w"))
PY
# One process; prints "exit_code peak_kib seconds".
peak() {
  python3 -c '
import resource, subprocess, sys, time
t0 = time.time()
rc = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "w")).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, f"{time.time() - t0:.1f}")
' "$@"
}
run=(generate "$CFG" --load-format dummy --tokenizer "$TOK" --prompt "The fp8 cache" --max-tokens 2
     --kv-memory 16MiB --max-model-len 256 --threads 1)
read -r rc1 kib1 s1 < <(peak "$T/e1" "$BIN" "${run[@]}")
[ "$rc1" = 0 ] || fail "TP 1: exit $rc1: $(tail -c 400 "$T/e1")"
base_run=("${run[@]}"); base_run[1]=$BASE
read -r rcb kibb _ < <(peak "$T/eb" "$BIN" "${base_run[@]}")
[ "$rcb" = 0 ] || fail "near-empty model: exit $rcb: $(tail -c 400 "$T/eb")"
P=$(free_port_pair); [ -n "$P" ] || fail "no free port"
mp=(--tp 2 --nnodes 2 --master-port "$P")
peak "$T/r1" "$BIN" "${run[@]}" "${mp[@]}" --node-rank 1 > "$T/p1" &
pid1=$!
read -r rc0 kib0 s0 < <(peak "$T/r0" "$BIN" "${run[@]}" "${mp[@]}" --node-rank 0)
wait $pid1
read -r rcr1 kibr1 sr1 < "$T/p1"
[ "$rc0" = 0 ] || fail "TP 2 rank 0: exit $rc0: $(tail -c 400 "$T/r0")"
[ "$rcr1" = 0 ] || fail "TP 2 rank 1: exit $rcr1: $(tail -c 400 "$T/r1")"
python3 - "$kib1" "$kib0" "$kibr1" "$s1" "$s0" "$sr1" "$kibb" <<'PY' || fail "peak RSS"
import sys
one, r0, r1 = (int(x) for x in sys.argv[1:4])
s1, s0, sr1 = sys.argv[4:7]
base = int(sys.argv[7])
print(f"     process baseline (near-empty model): {base / 2**20:.2f} GiB")
for name, kib in (("rank 0", r0), ("rank 1", r1)):
    ratio = (kib - base) / (one - base)
    print(f"     TP 2 {name}: peak RSS {kib / 2**20:.2f} GiB (raw {kib / one:.3f} x TP 1's {one / 2**20:.2f} GiB); "
          f"less the baseline {ratio:.3f}")
    # At most 0.65 (issue 36). At least 0.5: a rank holds half the layers
    # plus the whole embedding, so less would mean a missing shard.
    assert 0.5 < ratio <= 0.65, f"{name}: {ratio:.3f} x TP 1"
print(f"ok   per-rank dummy weights: TP 2 processes peak at <= 0.65 x TP 1 (TP 1 {s1} s, TP 2 {s0} / {sr1} s)")
PY
echo ok
