#!/usr/bin/env bash
# The one GPU entry point: builds and packs the GPU binaries here (`pack`),
# runs them on a GPU machine (the other subcommands). `--help` says how.
set -uo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.." || exit 1

usage() {
  cat <<'EOF'
usage: scripts/gpu.sh SUBCOMMAND [SUBCOMMAND ...]

Here (the development machine; same nvcc as the GPU machine):
  pack [--prev DIR]  build fp8kv test_cuda test_cuda_ops bench_attention
                     bench_linear bench_allreduce bench_gdn (Release, in $BUILD) and pack
                     them with the shared libraries they need into .wt/
                     (ignored). --prev DIR also packs a previous build's
                     binaries (DIR/fp8kv, DIR/tests/test_cuda, ...) for an
                     old-vs-new A/B.
  Then: run(command="bash scripts/gpu.sh all", carry=[".wt"], timeout_s=600)

On the GPU machine (binaries from .wt/; logs under gpu-out/, and with $OUT set
one logs.tgz plus the summary come back in $OUT):
  test     test_cuda (fixed FP8KV_SEED) and test_cuda_ops; with a previous
           build packed, its test_cuda too, and the `decode-hash` lines
           compared launch by launch (bitwise equality of the decode outputs)
  kernels  bench_attention: decode rows, store, 8K prefill (d128 and d256), each beside the
           copy-bandwidth ceiling; PyTorch SDPA as the peer when torch is
           there; bench_linear (GEMV vs cuBLASLt). Old and new interleaved,
           one fresh process per sample, medians, new/old speed
  prefill  the kernels step's store and 8K prefill rows alone (every cache
           dtype; per-token-head rows with time / per-tensor fp8), old and
           new interleaved: a prefill or store change's A/B in ~1 minute
  engine   fp8kv bench latency (batch 1, 1K in / 64 out) and throughput
           (256 x 1K in / 128 out) on the Llama-3.1-8B shape, dummy weights,
           fp8 KV cache; old and new interleaved when a previous build is packed
  fp8w     FP8 weights: fp8kv bench latency (batch 1 at 1K and 60K, TTFT
           8K) and throughput on the Llama-3.1-8B shape with a block-wise
           quantization_config against bf16 weights, one binary, interleaved
           (speed = fp8 / bf16)
  gdn      Qwen3.5 (Gated DeltaNet hybrids, issue 33): bench_gdn (the delta
           rule at the 27B shape; the previous build's too when packed) and
           its peers (tools/bench_gdn_peer.py: transformers' torch path, FLA
           when installed),
           then fp8kv bench latency on the Qwen3.5-27B text shape, dummy bf16
           weights, fp8 KV: TTFT of 1K and 8K prompts and batch-1 decode at
           1K, old and new interleaved when a previous build is packed
  gdnprof  ncu of the Gated DeltaNet kernels (gdn_*) over the 27B shape's 8K
           prompt (fp8kv bench latency, one iteration), new and previous
           build: per kernel, us per layer of the prompt's two prefill steps
           (--clock-control none; needs ncu)
  gdn32    Qwen3.5-27B text shape, dummy bf16 weights, batch 32 x 16K in /
           64 out: decode tok/s with an fp8 KV cache against bf16 (issue
           33's >= 1.2x; bf16 KV needs ~34 GB beside the 54 GB of weights:
           an H200's work), one binary
  serve    fp8kv serve on models/fp8kv-mini + bench serve (smoke), prefix
           caching on vs off (same greedy texts); the 8B shape too when
           TOKENIZER is set
  tp       two GPUs (NCCL_NVLS_ENABLE=0): the comm and TP tests,
           bench_allreduce, score TP 2 vs TP 1, multi-process TP 2, bench
           latency TP 1 vs TP 2
  goldens  the transformers goldens of the newer architectures:
           tools/gen_gdn_goldens.py (Qwen3.5 hybrids) and
           tools/gen_fp8_weight_goldens.py --no-mini (FP8-weight checkpoints);
           with $OUT set, goldens.tgz comes back (untar at the repo root)
  train    trains models/fp8kv-mini-gdn (issue 35): tools/train_bundled.py
           --arch qwen3_5 (Qwen3_5ForCausalLM, fp8kv-mini's tokenizer), the
           checkpoint, summary.json and train.log into $OUT (else
           gpu-out/train/export). Needs corpus/ (tools/prepare_corpus.sh
           here; carry ["corpus"]); no .wt. TRAIN_MINUTES=6 (the training
           loop), TRAIN_DEADLINE_MINUTES=9.0 (the whole script)
  train_smoke  the same script's --smoke (~1 min): 3 tiny optimizer steps
           (one 4096-token row), a throughput probe, save, reload, short
           eval; into $OUT/fp8kv-mini-gdn-smoke and $OUT/smoke_summary.json
  all      test kernels engine serve, and tp when the machine has 2+ GPUs
Each subcommand runs in its own process session under a watchdog; one summary
table is printed at the end (gpu-out/summary.txt). "speed new/old" is old
time / new time (or new / old tok/s): below 0.98 is marked SLOWER.

Variables:
  BUILD=build        pack: the CMake build folder (configured if missing)
  REPS=3             kernels / engine: old-new pairs per case (order flipped each pair)
  DEADLINE_S=570     seconds for the whole call; a step that would start with
                     less than 30 s left is skipped
  FP8KV_SEED=20261201  test: the seed of test_cuda's random cases
  TOKENIZER=DIR      serve: a Llama-3.1 tokenizer for the 8B-shape serve run
  GPU_OUT=gpu-out    the log folder
EOF
}

# ---- the case table -------------------------------------------------------
# bench_attention decode rows: DTYPE D B CTX (d128: Llama-3-8B's 32/8 heads,
# d256: Gemma-3-12B's 16/8, d64: 32/8). One row per plan-table case that a
# model runs; e5m2 and d64 are the fallbacks.
DECODE_ROWS=(
  "fp8_e4m3 128 1 1024" "fp8_e4m3 128 1 65536" "fp8_e4m3 128 8 16384" "fp8_e4m3 128 32 16384"
  "fp8_e4m3 128 64 16384" "fp8_e4m3 128 64 1024" "bf16 128 1 1024" "bf16 128 32 16384" "bf16 128 1 65536"
  "fp8_e4m3 256 8 16384" "fp8_e4m3 256 32 16384" "bf16 256 8 16384" "fp8_e5m2 128 8 16384" "fp8_e4m3 64 8 16384"
  # per-token-head beside per-tensor fp8 (issue 34's targets: B >= 8 at 16K, B=1/64K)
  "fp8_per_token_head 128 8 16384" "fp8_per_token_head 128 32 16384" "fp8_per_token_head 128 1 65536"
  "fp8_per_token_head 256 8 16384" "fp8_per_token_head 256 32 16384"
  "int8_per_token_head 128 8 16384" "int8_per_token_head 128 32 16384" "int8_per_token_head 256 8 16384"
)
# fp8kv bench cases: NAME|ARGS (on the Llama-3.1-8B shape, dummy weights, fp8 KV).
MODEL_8B=tests/data/configs/llama-3.1-8b
ENGINE_COMMON=(--load-format dummy --backend cuda --kv-cache-dtype fp8 --ignore-eos --json)
ENGINE_CASES=(
  "lat_b1_1k|latency --batch-size 1 --input-len 1024 --output-len 64 --num-iters-warmup 1 --num-iters 3"
  "thr_256x1k|throughput --num-prompts 256 --input-len 1024 --output-len 128 --num-iters-warmup 0"
)
# Qwen3.5 rows (issue 33): the 27B text shape, dummy bf16 weights, fp8 KV.
MODEL_27B_GDN=tests/data/configs/qwen3.5-27b
GDN_CASES=(
  "ttft_1k|latency --batch-size 1 --input-len 1024 --output-len 2 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 16"
  "ttft_8k|latency --batch-size 1 --input-len 8192 --output-len 2 --num-iters-warmup 1 --num-iters 2 --max-num-seqs 16"
  "lat_b1_1k|latency --batch-size 1 --input-len 1024 --output-len 32 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 8 --max-model-len 2048"
)
# FP8-weight speed rows (issue 32's table): the Llama-3.1-8B shape with a
# block-wise quantization_config ("new") against the same shape with bf16
# weights ("old"), one binary, interleaved; fp8 KV everywhere.
MODEL_8B_FP8=tests/data/configs/llama-3.1-8b-fp8
FP8W_CASES=(
  "lat_b1_1k|latency --batch-size 1 --input-len 1024 --output-len 64 --num-iters-warmup 1 --num-iters 3"
  "lat_b1_60k|latency --batch-size 1 --input-len 60000 --output-len 32 --num-iters-warmup 1 --num-iters 2 --max-model-len 60200"
  "ttft_8k|latency --batch-size 1 --input-len 8192 --output-len 2 --num-iters-warmup 1 --num-iters 3 --max-model-len 8300"
  "thr_256x1k|throughput --num-prompts 256 --input-len 1024 --output-len 128 --num-iters-warmup 0"
)
TARGETS=(fp8kv test_cuda test_cuda_ops bench_attention bench_linear bench_allreduce bench_gdn)
# Seconds each step may run (the watchdog's limit).
declare -A STEP_S=([test]=300 [kernels]=260 [prefill]=150 [engine]=300 [serve]=200 [tp]=420 [goldens]=300 [fp8w]=420 [gdn]=540 [gdnprof]=260 [gdn32]=400
  [train]=570 [train_smoke]=240)
# Steps that run Python only (no packed binaries, no .wt to carry).
NO_BINARIES=" goldens train train_smoke "
# train / train_smoke: the qwen3_5 bundled model (models/fp8kv-mini-gdn/README.md).
TRAIN_ARGS=(--arch qwen3_5 --corpus corpus --tokenizer models/fp8kv-mini --out models/fp8kv-mini-gdn)

G=${GPU_OUT:-gpu-out}
# Unpacked outside the tree: .wt stays small enough to carry again.
WT=${TMPDIR:-/tmp}/fp8kv-wt
NEW=$WT/bin
PREV=$WT/prev
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# row STEP CASE NEW OLD SPEED NOTE: one line of the summary table.
row() { printf '%-8s %-30s %12s %12s %9s  %s\n' "$@" >>"$G/rows.txt"; }
# path of a packed binary (new or prev), or empty.
bin() { [ -x "$1/$2" ] && echo "$1/$2"; }
gtest_status() {  # LOG RC -> "PASS 123 tests" / "FAIL ..."
  local n; n=$(grep -oE '^\[  PASSED  \] [0-9]+ test' "$1" | grep -oE '[0-9]+' | tail -1)
  if [ "$2" = 0 ] && [ -n "$n" ] && ! grep -q '^\[  FAILED  \]' "$1"; then echo "PASS $n tests"
  else echo "FAIL rc $2, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$1") failed$([ "$2" = 124 ] && echo ', timeout')"; fi
}

# ---- pack (here) ----------------------------------------------------------
# Only the libraries a GPU image may lack travel: not glibc / libstdc++ / CUDA.
SYSTEM_LIBS='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.'
pack() {
  local prev=""
  while [ $# -gt 0 ]; do
    case $1 in
      --prev) prev=${2:?--prev DIR}; shift 2 ;;
      *) echo "gpu.sh pack: unknown argument $1" >&2; return 2 ;;
    esac
  done
  local build=${BUILD:-build}
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || return 1
  cmake --build "$build" --target "${TARGETS[@]}" -j "$(nproc)" || return 1
  rm -rf .wt && mkdir -p .wt
  stage_pack "$build" .wt/bin.tar.xz libs || return 1
  if [ -n "$prev" ]; then stage_pack "$prev" .wt/prev.tar.xz || return 1; fi
  { git rev-parse --short HEAD; git status --porcelain --untracked-files=no | grep -q . && echo "(plus uncommitted changes)"; } \
    >.wt/COMMIT 2>/dev/null
  [ -n "$prev" ] && echo "$prev" >.wt/PREV
  ls -la .wt && du -sh .wt
}
stage_pack() {  # BUILD_DIR TARBALL [libs]: its binaries among TARGETS (and their libraries)
  local dir=$1 tarball=$2 libs=${3:-} stage t f n=0
  stage=$(mktemp -d)
  mkdir -p "$stage/lib"
  for t in "${TARGETS[@]}"; do
    f=$(find "$dir" -maxdepth 3 -type f -name "$t" -perm -u+x 2>/dev/null | head -1)
    [ -n "$f" ] || { echo "pack: no $t in $dir (skipped)"; continue; }
    cp "$f" "$stage/" && n=$((n + 1))
    [ -n "$libs" ] || continue
    ldd "$f" | awk '$3 ~ /^\// {print $1, $3}' | while read -r so path; do
      [[ $so =~ $SYSTEM_LIBS ]] || cp -Ln "$path" "$stage/lib/$so"
    done
  done
  [ $n -gt 0 ] || { echo "pack: no binaries in $dir" >&2; rm -rf "$stage"; return 1; }
  # xz -9: the binaries share their fatbins, which its 64 MiB window finds.
  XZ_OPT=${XZ_OPT:--9} tar cJf "$tarball" -C "$stage" . && rm -rf "$stage"
}

# ---- on the GPU machine ---------------------------------------------------
unpack() {
  [ -f .wt/bin.tar.xz ] || { echo "gpu.sh: no .wt/bin.tar.xz: run 'bash scripts/gpu.sh pack' here and carry .wt" >&2; return 1; }
  local d
  for d in bin prev; do
    rm -rf "${WT:?}/$d"
    [ -f ".wt/$d.tar.xz" ] && mkdir -p "$WT/$d" && tar xJf ".wt/$d.tar.xz" -C "$WT/$d"
  done
  # Link only the libraries this machine lacks (its own stay in use).
  rm -rf "$WT/rt" && mkdir -p "$WT/rt"
  local b so
  for _ in 1 2 3; do  # a library found can need others
    for b in "$NEW"/* "$PREV"/*; do
      [ -f "$b" ] || continue
      LD_LIBRARY_PATH=$WT/rt ldd "$b" 2>/dev/null | awk '/not found/ {print $1}' | while read -r so; do
        [ -f "$NEW/lib/$so" ] && ln -sfn "$NEW/lib/$so" "$WT/rt/$so"
      done
    done
  done
  export LD_LIBRARY_PATH=$WT/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  for b in "$NEW"/* "$PREV"/*; do
    [ -f "$b" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH ldd "$b" | grep "not found" | sed "s|^|$b: |"
  done
  return 0
}

step_test() {
  local d=$G/test rc
  export FP8KV_SEED=${FP8KV_SEED:-20261201}
  timeout 200 "$NEW/test_cuda" >"$d/test_cuda.log" 2>&1; rc=$?
  row test test_cuda "" "" "" "$(gtest_status "$d/test_cuda.log" $rc) (seed $FP8KV_SEED)"
  timeout 200 "$NEW/test_cuda_ops" >"$d/test_cuda_ops.log" 2>&1; rc=$?
  row test test_cuda_ops "" "" "" "$(gtest_status "$d/test_cuda_ops.log" $rc)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$d"/test_cuda*.log | head -20
  if [ -n "$(bin $PREV test_cuda)" ]; then
    # The previous build runs the tests this build has (its variant tests are gone).
    local filter
    filter=$("$NEW/test_cuda" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {printf "%s%s%s", sep, s, $1; sep = ":"}')
    timeout 200 "$PREV/test_cuda" --gtest_filter="$filter" >"$d/prev_test_cuda.log" 2>&1; rc=$?
    row test "test_cuda (previous build)" "" "" "" "$(gtest_status "$d/prev_test_cuda.log" $rc)"
    python3 tools/ab_table.py hashes "$d/test_cuda.log" "$d/prev_test_cuda.log" >>"$G/rows.txt"
  fi
}

step_kernels() { kernel_rows kernels "${DECODE_ROWS[@]}" store prefill prefill256; }
step_prefill() { kernel_rows prefill store prefill prefill256; }

kernel_rows() {  # STEP ROW...: bench_attention rows, old/new interleaved; the decode rows' peers and bench_linear with kernels
  local step=$1 d=$G/$1 sides=new r v t0; shift
  [ -n "$(bin $PREV bench_attention)" ] && sides="new old"
  # shellcheck disable=SC2034  # read through ${!b}
  local BIN_new=$NEW/bench_attention BIN_old=$PREV/bench_attention
  local reps=${REPS:-3}; [ "$sides" = new ] && reps=1
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 >"$d/smi.csv" 2>/dev/null &
  local smi=$!
  t0=$(date +%s)
  for rep in $(seq 1 "$reps"); do
    [ $(( $(date +%s) - t0 )) -lt 170 ] || { echo "$step: stop after $((rep - 1)) pairs (time)"; break; }
    local order=$sides
    (( rep % 2 == 0 )) && [ "$sides" != new ] && order="old new"
    for r in "$@"; do
      for v in $order; do
        local b=BIN_$v args
        # shellcheck disable=SC2206
        args=(shape $r)
        [ "$r" = store ] || [ "${r#prefill}" != "$r" ] && args=("$r")
        timeout 60 "${!b}" "${args[@]}" >>"$d/$v.jsonl" 2>>"$d/$v.err" || echo "$step: $v $r: rc $?"
      done
    done
  done
  kill $smi 2>/dev/null
  if [ "$step" != kernels ]; then
    python3 tools/ab_table.py kernels "$d" | sed "s/^kernels /$(printf '%-8s' "$step")/" >>"$G/rows.txt"
    return
  fi
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    local sh=() dd bb cc
    for r in "${DECODE_ROWS[@]}"; do
      read -r _ dd bb cc <<<"$r"
      sh+=("$([ "$dd" = 256 ] && echo 16 || echo 32),8,$dd,$bb,$cc")
    done
    mapfile -t sh < <(printf '%s\n' "${sh[@]}" | sort -u)
    timeout 100 python3 tools/bench_sdpa.py --decode-fresh "${sh[@]}" >"$d/sdpa.jsonl" 2>"$d/sdpa.err"
    timeout 60 python3 tools/bench_sdpa.py --prefill-only >>"$d/sdpa.jsonl" 2>>"$d/sdpa.err"
  else
    echo "no torch with CUDA: no SDPA peer" | tee "$d/sdpa.err"
  fi
  timeout 60 "$NEW/bench_linear" --json "$d/linear.json" >"$d/linear.log" 2>&1 || echo "bench_linear: rc $?"
  python3 tools/ab_table.py kernels "$d" >>"$G/rows.txt"
  grep -E "^T=1 .*GEMMs of one" "$d/linear.log" | while read -r l; do row kernels "bench_linear" "" "" "" "$l"; done
}

step_engine() {
  local d=$G/engine sides=new c name args v i
  [ -n "$(bin $PREV fp8kv)" ] && sides="new old"
  # shellcheck disable=SC2034  # read through ${!b}
  local BIN_new=$NEW/fp8kv BIN_old=$PREV/fp8kv
  local reps=${REPS:-3}; [ "$sides" = new ] && reps=1
  local t0; t0=$(date +%s)
  for i in $(seq 1 "$reps"); do
    [ $(( $(date +%s) - t0 )) -lt 220 ] || { echo "engine: stop after $((i - 1)) pairs (time)"; break; }
    local order=$sides
    (( i % 2 == 0 )) && [ "$sides" != new ] && order="old new"
    for c in "${ENGINE_CASES[@]}"; do
      name=${c%%|*}; args=${c#*|}
      for v in $order; do
        local b=BIN_$v
        # shellcheck disable=SC2086
        timeout 120 "${!b}" bench $args $MODEL_8B "${ENGINE_COMMON[@]}" >"$d/$name.$v.$i.json" 2>"$d/$name.$v.$i.log" ||
          { echo "engine: $v $name: rc $?"; tail -3 "$d/$name.$v.$i.log"; }
      done
    done
  done
  python3 tools/ab_table.py engine "$d" >>"$G/rows.txt"
}

step_fp8w() {
  local d=$G/fp8w c name args v i order
  # shellcheck disable=SC2034  # read through ${!m}
  local M_new=$MODEL_8B_FP8 M_old=$MODEL_8B t0; t0=$(date +%s)
  for i in $(seq 1 "${REPS:-2}"); do
    for c in "${FP8W_CASES[@]}"; do
      name=${c%%|*}; args=${c#*|}
      order="new old"; (( i % 2 == 0 )) && order="old new"
      for v in $order; do
        [ $(( $(date +%s) - t0 )) -lt 380 ] || { echo "fp8w: stop (time)"; break 3; }
        local m=M_$v
        # shellcheck disable=SC2086
        timeout 150 "$NEW/fp8kv" bench $args "${!m}" "${ENGINE_COMMON[@]}" >"$d/$name.$v.$i.json" 2>"$d/$name.$v.$i.log" ||
          { echo "fp8w: $v $name: rc $?"; tail -3 "$d/$name.$v.$i.log"; }
      done
    done
  done
  python3 tools/ab_table.py engine "$d" | sed 's/^engine  /fp8w    /' >>"$G/rows.txt"
}

step_gdn() {
  local d=$G/gdn sides=new c name args v i
  [ -n "$(bin $PREV fp8kv)" ] && sides="new old"
  # shellcheck disable=SC2034  # read through ${!b}
  local BIN_new=$NEW BIN_old=$PREV
  for v in $sides; do
    local b=BIN_$v
    [ -n "$(bin "${!b}" bench_gdn)" ] || continue
    timeout 60 "${!b}/bench_gdn" --json "$d/bench_gdn.$v.jsonl" >"$d/bench_gdn.$v.log" 2>&1 || echo "bench_gdn $v: rc $?"
    echo "== bench_gdn ($v)"; cat "$d/bench_gdn.$v.log"
  done
  # The peers on the same cases (issue 33): transformers' torch path, and FLA's
  # Triton kernels when the machine's Python has them (a "skipped" line if not).
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    timeout 120 python3 tools/bench_gdn_peer.py >"$d/peer.jsonl" 2>"$d/peer.err" || echo "bench_gdn_peer: rc $?"
    echo "== bench_gdn_peer"; cat "$d/peer.jsonl"; tail -3 "$d/peer.err"
  else
    echo "no torch with CUDA: no delta-rule peer"
  fi
  mkdir -p "$d/engine"
  local t0; t0=$(date +%s)
  for i in $(seq 1 "${REPS:-2}"); do
    local order=$sides
    (( i % 2 == 0 )) && [ "$sides" != new ] && order="old new"
    for c in "${GDN_CASES[@]}"; do
      name=${c%%|*}; args=${c#*|}
      for v in $order; do
        [ $(( $(date +%s) - t0 )) -lt 300 ] || { echo "gdn: stop (time)"; break 3; }
        local b=BIN_$v
        # shellcheck disable=SC2086
        timeout 120 "${!b}/fp8kv" bench $args $MODEL_27B_GDN "${ENGINE_COMMON[@]}" >"$d/engine/$name.$v.$i.json" \
          2>"$d/engine/$name.$v.$i.log" || { echo "gdn: $v $name: rc $?"; tail -3 "$d/engine/$name.$v.$i.log"; }
      done
    done
  done
  python3 tools/ab_table.py engine "$d/engine" | sed 's/^engine  /gdn     /' >>"$G/rows.txt"
}

step_gdnprof() {
  local d=$G/gdnprof v
  command -v ncu >/dev/null || { row gdnprof "(step)" "" "" "" "no ncu on this machine"; return; }
  # shellcheck disable=SC2034  # read through ${!b}
  local BIN_new=$NEW BIN_old=$PREV
  for v in new old; do
    local b=BIN_$v
    [ -n "$(bin "${!b}" fp8kv)" ] || continue
    timeout 120 ncu --clock-control none -k regex:gdn_ --metrics gpu__time_duration.sum --csv --print-units base \
      "${!b}/fp8kv" bench latency $MODEL_27B_GDN --load-format dummy --backend cuda --kv-cache-dtype fp8 \
      --max-num-seqs 16 --batch-size 1 --input-len 8192 --output-len 2 --num-iters-warmup 0 --num-iters 1 \
      >"$d/$v.csv" 2>"$d/$v.log" || echo "gdnprof $v: rc $?"
  done
  # One launch of each kernel per linear_attention layer and step: 48 layers.
  python3 tools/ab_table.py ncu "$d" 48 >>"$G/rows.txt"
}

step_gdn32() {
  local d=$G/gdn32 kv
  for kv in fp8 bf16; do
    timeout 180 "$NEW/fp8kv" bench latency $MODEL_27B_GDN --load-format dummy --backend cuda --kv-cache-dtype $kv \
      --ignore-eos --json --batch-size 32 --input-len 16384 --output-len 64 --num-iters-warmup 0 --num-iters 1 \
      --max-num-seqs 32 --max-model-len 16448 >"$d/$kv.json" 2>"$d/$kv.log" || { echo "gdn32 $kv: rc $?"; tail -3 "$d/$kv.log"; }
  done
  python3 - "$d" >>"$G/rows.txt" <<'PY'
import json, sys
d = sys.argv[1]
def get(kv, key):
    try:
        return json.load(open(f"{d}/{kv}.json")).get(key)
    except (OSError, ValueError):
        return None
for key in ("decode_tokens_per_s", "ttft_ms"):
    f, b = get("fp8", key), get("bf16", key)
    ratio = f"{f / b:.3f}" if f and b else ""
    print(f"{'gdn32':<8} {'b32/16K ' + key:<30} {f if f is not None else '-':>12} {b if b is not None else '-':>12} {ratio:>9}  fp8 / bf16 KV")
PY
}

step_serve() {
  local d=$G/serve FP8KV=$NEW/fp8kv PORT=""
  SP=""
  start_server() {  # LOG ARGS...: serve on a free port; sets SP and PORT
    local log=$1; shift
    PORT=""
    "$FP8KV" serve "$@" --port 0 >"$log.out" 2>"$log" &
    SP=$!
    for _ in $(seq 480); do
      PORT=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$log" | sed 's/.*://')
      [ -n "$PORT" ] && return 0
      kill -0 $SP 2>/dev/null || { echo "serve exited early:"; tail -5 "$log"; SP=""; return 1; }
      sleep 0.25
    done
    echo "serve did not listen within 120 s"; kill $SP; wait $SP; SP=""; return 1
  }
  stop_server() { [ -n "$SP" ] && { kill -TERM $SP; wait $SP; SP=""; }; }
  trap '[ -n "${SP:-}" ] && kill "$SP" 2>/dev/null' EXIT
  # bench_serve NAME MODEL TOKENIZER N IN OUT ENGINE_ARGS...: one server, one bench serve.
  bench_serve() {
    local name=$1 model=$2 tok=$3 n=$4 in=$5 out=$6; shift 6
    if start_server "$d/serve_$name.log" "$model" --backend cuda --kv-cache-dtype fp8 "$@"; then
      timeout 150 "$FP8KV" bench serve --port "$PORT" --num-prompts "$n" --random-input-len "$in" --random-output-len "$out" \
        --ignore-eos --request-rate inf --tokenizer "$tok" --save-result --result-dir "$d" \
        --result-filename "bench_serve_$name.json" >"$d/bench_serve_$name.log" 2>&1 || echo "bench serve $name: rc $?"
      stop_server
    fi
    python3 - "$d/bench_serve_$name.json" "$name" "$n" "$in" "$out" <<'PY' >>"$G/rows.txt"
import json, sys
path, name, n, i, o = sys.argv[1:]
try:
    s = json.load(open(path))
    note = (f"{s['completed']}/{s['num_prompts']} done, {s['output_throughput']:.0f} out tok/s, "
            f"TTFT median {s['median_ttft_ms']:.0f} ms, TPOT median {s['median_tpot_ms']:.1f} ms")
    new = f"{s['output_throughput']:.0f}"
except Exception as e:
    note, new = f"FAIL: no result ({e})", ""
print(f"{'serve':8} {f'bench serve {name} {n}x{i}/{o}':30} {new:>12} {'':>12} {'':>9}  {note}")
PY
  }
  bench_serve mini models/fp8kv-mini models/fp8kv-mini 64 256 32
  # Prefix caching on vs off: the same greedy texts, hits only when on.
  local on
  for on in on off; do
    local flag=(); [ $on = off ] && flag=(--no-enable-prefix-caching)
    start_server "$d/serve_prefix_$on.log" models/fp8kv-mini --backend cuda --kv-cache-dtype fp8 "${flag[@]}" || continue
    python3 - "$PORT" "$d/prefix_$on.json" <<'PY'
import json, sys, urllib.request
port, path = sys.argv[1], sys.argv[2]
prefix = "The quick brown fox jumps over the lazy dog, and then it runs into the forest. " * 18
texts = []
for i in range(6):
    body = json.dumps({"prompt": f"{prefix}Question {i}: what happened next?", "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    texts.append(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
get = lambda k: sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("fp8kv:" + k))
json.dump({"texts": texts, "queries": get("prefix_cache_queries_total"), "hits": get("prefix_cache_hits_total")},
          open(path, "w"))
PY
    stop_server
  done
  python3 - "$d" <<'PY' >>"$G/rows.txt"
import json, sys
d = sys.argv[1]
try:
    on, off = (json.load(open(f"{d}/prefix_{x}.json")) for x in ("on", "off"))
    same = sum(a == b for a, b in zip(on["texts"], off["texts"]))
    ok = same == len(on["texts"]) and on["hits"] > 0
    note = (f"{'PASS' if ok else 'FAIL'}: greedy texts equal {same}/{len(on['texts'])}, "
            f"hits {on['hits']:.0f} of {on['queries']:.0f} query tokens (off: {off['hits']:.0f})")
except Exception as e:
    note = f"FAIL: no result ({e})"
print(f"{'serve':8} {'prefix caching on vs off':30} {'':>12} {'':>12} {'':>9}  {note}")
PY
  if [ -n "${TOKENIZER:-}" ]; then
    bench_serve 8b $MODEL_8B "$TOKENIZER" 256 1024 128 --load-format dummy --max-model-len 1152 --max-num-seqs 256
  else
    row serve "bench serve 8b" "" "" "" "skipped: set TOKENIZER=DIR (a Llama-3.1 tokenizer) to run it"
  fi
}

step_tp() {
  local d=$G/tp FP8KV=$NEW/fp8kv rc ngpu
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$ngpu" -ge 2 ] || { row tp "tensor parallelism" "" "" "" "skipped: $ngpu GPU"; return 0; }
  timeout 120 "$NEW/test_cuda" --gtest_filter='Comm*' >"$d/test_comm.log" 2>&1; rc=$?
  row tp "test_cuda Comm*" "" "" "" "$(gtest_status "$d/test_comm.log" $rc)"
  timeout 200 "$NEW/test_cuda_ops" --gtest_filter='CudaTensorParallel.*' >"$d/test_tp.log" 2>&1; rc=$?
  row tp "test_cuda_ops CudaTensorParallel" "" "" "" "$(gtest_status "$d/test_tp.log" $rc)"
  timeout 120 "$NEW/bench_allreduce" --json "$d/allreduce.jsonl" >"$d/allreduce.txt" 2>&1 || echo "bench_allreduce: rc $?"
  grep -E "faster than|threshold" "$d/allreduce.txt" | head -3 | while read -r l; do row tp bench_allreduce "" "" "" "$l"; done
  # Score TP 2 vs TP 1 (fp8kv-mini, fp8 cache), then the same as two processes.
  python3 -c "import json, random; random.seed(7); json.dump([[random.randrange(3, 4000) for _ in range(n)] for n in (700, 300)], open('$d/ids.json', 'w'))"
  local sc=(score models/fp8kv-mini --token-ids-file "$d/ids.json" --kv-cache-dtype fp8 --backend cuda --max-model-len 1024 --kv-memory 256MiB)
  for t in 1 2; do timeout 90 "$FP8KV" "${sc[@]}" --tp $t --output "$d/score_tp$t.json" >/dev/null 2>"$d/score_tp$t.log" || echo "score tp $t: rc $?"; done
  local port; port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  FP8KV_COMM_TIMEOUT_S=60 timeout 120 "$FP8KV" "${sc[@]}" --tp 2 --nnodes 2 --master-port "$port" --node-rank 1 \
    --output "$d/score_mp1.json" >/dev/null 2>"$d/score_mp1.log" &
  FP8KV_COMM_TIMEOUT_S=60 timeout 120 "$FP8KV" "${sc[@]}" --tp 2 --nnodes 2 --master-port "$port" --node-rank 0 \
    --output "$d/score_mp.json" >/dev/null 2>"$d/score_mp.log" || echo "multi-process rank 0: rc $?"
  wait
  python3 - "$d" <<'PY' >>"$G/rows.txt"
import json, sys
d = sys.argv[1]
def seqs(n):
    try:
        return json.load(open(f"{d}/score_{n}.json"))["sequences"]
    except Exception:
        return None
ref = seqs("tp1")
for n, what in (("tp2", "score TP 2 vs TP 1"), ("mp", "score 2 processes vs TP 1")):
    s = seqs(n)
    if not ref or not s:
        note = "FAIL: no result"
    else:
        dl = [abs(p - q) for x, y in zip(ref, s) for p, q in zip(x["logprobs"], y["logprobs"]) if p is not None]
        top = [p == q for x, y in zip(ref, s) for p, q in zip(x["top1_ids"], y["top1_ids"]) if p is not None]
        note = f"max |dlogprob| {max(dl):.4g}, mean {sum(dl) / len(dl):.5f}, top-1 {sum(top)}/{len(top)}"
    print(f"{'tp':8} {what:30} {'':>12} {'':>12} {'':>9}  {note}")
PY
  local t
  for t in 1 2; do
    timeout 150 "$FP8KV" bench latency $MODEL_8B "${ENGINE_COMMON[@]}" --tp $t --batch-size 1 --input-len 1024 \
      --output-len 64 --num-iters-warmup 1 --num-iters 2 >"$d/lat_tp$t.json" 2>"$d/lat_tp$t.log" || echo "bench tp $t: rc $?"
  done
  python3 - "$d" <<'PY' >>"$G/rows.txt"
import json, sys
d = sys.argv[1]
try:
    a, b = (json.load(open(f"{d}/lat_tp{t}.json"))["decode_ms_per_step"] for t in (1, 2))
    print(f"{'tp':8} {'lat_b1_1k TP 2 (ms/step)':30} {b:12.3f} {a:12.3f} {a / b:9.3f}  old = TP 1; TP 2 / TP 1 speed")
except Exception as e:
    print(f"{'tp':8} {'lat_b1_1k TP 2':30} {'':>12} {'':>12} {'':>9}  FAIL: no result ({e})")
PY
}

# ---- driver ---------------------------------------------------------------
step_goldens() {
  local d=$G/goldens rc
  python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" >"$d/versions.txt" 2>&1
  python3 tools/gen_gdn_goldens.py >"$d/gdn.log" 2>&1; rc=$?
  row goldens gen_gdn_goldens "" "" "" "$([ $rc = 0 ] && echo PASS || echo "FAIL rc $rc") ($(head -1 "$d/versions.txt"))"
  python3 tools/gen_fp8_weight_goldens.py --no-mini >"$d/fp8w.log" 2>&1; rc=$?
  row goldens gen_fp8_weight_goldens "" "" "" "$([ $rc = 0 ] && echo PASS || echo "FAIL rc $rc")"
  tar czf "$d/goldens.tgz" $(ls -d tests/golden/models_qwen3_5 tests/golden/fp8_weights 2>/dev/null)
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$d/goldens.tgz" "$OUT/goldens.tgz"; fi
  tail -3 "$d/gdn.log" "$d/fp8w.log"
}

# train_run STEP EXTRA_ARGS...: tools/train_bundled.py with TRAIN_ARGS, its
# export into $OUT (else $G/STEP/export), one summary row.
train_run() {
  local step=$1 d=$G/$1 rc exp summary; shift
  exp=${OUT:-$G/$step/export}
  summary=$exp/summary.json; [ "$step" = train_smoke ] && summary=$exp/smoke_summary.json
  if [ ! -f corpus/train.txt ]; then
    row "$step" train_bundled "" "" "" "FAIL: no corpus/train.txt (tools/prepare_corpus.sh here, then carry [\"corpus\"])"
    return 0
  fi
  mkdir -p "$exp"
  python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" \
    >"$d/versions.txt" 2>&1
  PYTHONUNBUFFERED=1 python3 tools/train_bundled.py "${TRAIN_ARGS[@]}" --export-dir "$exp" "$@" >"$d/train.log" 2>&1; rc=$?
  cp "$d/train.log" "$exp/$step.log" 2>/dev/null
  python3 - "$summary" "$step" "$rc" "$(head -1 "$d/versions.txt")" <<'PY' >>"$G/rows.txt"
import json, sys
path, step, rc, versions = sys.argv[1:]
try:
    s = json.load(open(path))
    if step == "train":
        note = (f"params {s['params']:,d}, {s['train']['steps']} steps, {s['train']['tokens_seen'] / 1e6:.1f}M tokens, "
                f"held-out ppl {s['heldout_ppl']['ppl']}, needle "
                + "/".join(f"{v['correct']}" for v in s["needle"].values()) + f" of {s['needle']['1024']['trials']}")
    else:
        note = f"params {s['params']:,d}, probe " + ", ".join(
            f"{k}: {v['tokens_per_second'] / 1e6:.2f}M tok/s" for k, v in s["probe"].items())
except Exception as e:
    note = f"no summary ({e.__class__.__name__})"
status = "PASS" if rc == "0" else f"FAIL rc {rc}"
print(f"{step:8} {'train_bundled --arch qwen3_5':30} {'':>12} {'':>12} {'':>9}  {status}: {note} ({versions})")
PY
  tail -5 "$d/train.log"
}
step_train() {
  train_run train --minutes "${TRAIN_MINUTES:-6}" --deadline-minutes "${TRAIN_DEADLINE_MINUTES:-9.0}"
}
step_train_smoke() { train_run train_smoke --smoke; }

run_steps() {
  local need_bins=0 st
  for st in "$@"; do [[ $NO_BINARIES == *" $st "* ]] || need_bins=1; done
  if [ $need_bins = 1 ]; then unpack || exit 1; fi
  # The bundled model's shards travel xz-compressed (serve and tp load it).
  [ -f scripts/expand_models.sh ] && { bash scripts/expand_models.sh || echo "expand_models.sh failed"; }
  rm -rf "${G:?}" && mkdir -p "$G"  # one call, one set of logs
  : >"$G/rows.txt"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    echo "new: $(cat .wt/COMMIT 2>/dev/null | paste -sd' ')$([ -d $PREV ] && echo "; old: $(cat .wt/PREV 2>/dev/null)")"
  } | tee "$G/env.txt"
  local s pid dog rc left limit
  for s in "$@"; do
    left=$(( ${DEADLINE_S:-570} - $(el) ))
    if [ "$left" -lt 30 ]; then row "$s" "(step)" "" "" "" "skipped: $left s left of DEADLINE_S"; continue; fi
    limit=${STEP_S[$s]}; [ "$limit" -gt "$left" ] && limit=$left
    rm -rf "${G:?}/$s" && mkdir -p "$G/$s"
    echo "== $s ($(el) s, limit $limit s)"
    # setsid in a background job keeps its pid as the new session's id. The
    # watchdog ends every process of that session (pkill -s: also those that
    # timeout put in groups of their own), and so does the end of the step:
    # nothing is left holding the GPU.
    setsid bash "$SELF" __step "$s" > >(tee "$G/$s/console.log") 2>&1 &
    pid=$!
    ( sleep "$limit"; echo "== $s: time limit" >>"$G/$s/console.log"
      pkill -TERM -s "$pid"; sleep 5; pkill -KILL -s "$pid" ) >/dev/null 2>&1 </dev/null &
    dog=$!
    wait "$pid"; rc=$?
    pkill -P "$dog" 2>/dev/null; kill "$dog" 2>/dev/null; wait "$dog" 2>/dev/null
    pkill -KILL -s "$pid" 2>/dev/null
    [ "$rc" = 0 ] || row "$s" "(step)" "" "" "" "FAIL rc $rc$([ "$rc" -ge 128 ] && echo ' (killed: time limit)')"
  done
  {
    echo
    cat "$G/env.txt"
    printf '%-8s %-30s %12s %12s %9s  %s\n' step case new old "speed n/o" note
    cat "$G/rows.txt"
    echo "(logs: $G/; $(el) s)"
  } >"$G/summary.txt"
  cat "$G/summary.txt"
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    tar czf "$OUT/logs.tgz" -C "$(dirname "$G")" "$(basename "$G")" && cp "$G/summary.txt" "$OUT/summary.txt"
    for s in "$@"; do [ -f "$G/$s/table.txt" ] && cp "$G/$s/table.txt" "$OUT/${s}_table.txt"; done
  fi
  ! grep -qE "FAIL|SLOWER|rc [0-9]" "$G/rows.txt"
}

case ${1:-} in
  ""|-h|--help|help) usage ;;
  pack) shift; pack "$@" ;;
  __step) "step_$2"; exit 0 ;;  # a step reports its failures as rows
  *)
    steps=()
    for a in "$@"; do
      case $a in
        all) steps+=(test kernels engine serve); [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && steps+=(tp) ;;
        test|kernels|prefill|engine|fp8w|gdn|gdnprof|gdn32|serve|tp|goldens|train|train_smoke) steps+=("$a") ;;
        *) echo "gpu.sh: unknown subcommand '$a'" >&2; usage >&2; exit 2 ;;
      esac
    done
    run_steps "${steps[@]}"
    ;;
esac
