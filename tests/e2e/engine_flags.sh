#!/usr/bin/env bash
# e2e: the engine flags mean the same in every command that runs the engine
# (cli/engine_flags.h): bad values exit 2 with one "--flag must be ..." line,
# --threads above the hardware is capped with a warning, --load-format dummy
# runs from config.json alone, --tokenizer points elsewhere.
# Usage: bash engine_flags.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$SRC/tests/e2e/tiny_model.py" "$T/m" --bf16 > /dev/null || fail "could not make the tiny model"
python3 -c "import json; json.dump([[5, 6, 7, 8, 9, 10, 11, 12]], open('$T/ids.json', 'w'))"
printf 'hello there, a short corpus.\n' > "$T/c.txt"
for i in $(seq 200); do printf 'hello there, haystack line %d.\n' "$i"; done > "$T/hay.txt"

# One invocation per command, with the extra flags appended.
run_cmd() {  # run_cmd CMD FLAGS...
  local cmd=$1; shift
  case $cmd in
    generate) "$BIN" generate "$T/m" --prompt "Hello" --max-tokens 2 "$@" ;;
    score) "$BIN" score "$T/m" --token-ids-file "$T/ids.json" --output "$T/s.json" "$@" ;;
    calibrate) "$BIN" calibrate "$T/m" --corpus-ids-file "$T/ids.json" --min-tokens 8 --output "$T/r.json" "$@" ;;
    kvstats) "$BIN" eval kvstats "$T/m" --token-ids-file "$T/ids.json" --scales unity "$@" ;;
    compare) "$BIN" eval compare "$T/m" --token-ids-file "$T/ids.json" --bootstrap 100 "$@" ;;
    niah) "$BIN" eval niah "$T/m" --haystack "$T/hay.txt" --lengths 128 --depths 50 --arms bf16 "$@" ;;
    bench) "$BIN" bench latency "$T/m" --input-len 4 --output-len 2 --num-iters 1 "$@" ;;
    serve) timeout 60 "$BIN" serve "$T/m" --port 0 "$@" ;;  # only refusals are run: it must not start
  esac
}
# refused MESSAGE CMD FLAGS...: exit 2, nothing on stdout, MESSAGE on stderr
# (lib.sh's expect_refused), and never CLI11's "not in range" text.
refused() {
  local msg=$1; shift
  expect_refused "$*" "$msg" "$@" > /dev/null
  ! grep -q "not in range" "$T/err" || fail "'$*': CLI11 range text: $(cat "$T/err")"
}
for cmd in generate score calibrate kvstats compare niah bench serve; do
  refused "must be > 0" run_cmd $cmd --kv-memory 0
  refused "threads must be >= 0" run_cmd $cmd --threads -1
  refused "threads must be >= 0" run_cmd $cmd --threads -3
  refused "max-num-seqs must be >= 1" run_cmd $cmd --max-num-seqs 0
  refused "max-num-batched-tokens must be >= 1" run_cmd $cmd --max-num-batched-tokens 0
  refused "block-size must be >= 1" run_cmd $cmd --block-size 0
  refused "not both" run_cmd $cmd --kv-memory 1MiB --gpu-memory-utilization 0.5
  refused "cuda only" run_cmd $cmd --backend cpu --gpu-memory-utilization 0.5
  refused "must be in (0, 1]" run_cmd $cmd --gpu-memory-utilization 1.5
  refused "load-format must be auto or dummy" run_cmd $cmd --load-format bogus
  refused "backend must be auto, cpu or cuda" run_cmd $cmd --backend tpu
  refused "--mamba-cache-dtype must be auto, bfloat16 or float32 (got 'fp8')" run_cmd $cmd --mamba-cache-dtype fp8
  refused "--mamba-ssm-cache-dtype: float16 (a vLLM value) is not supported" run_cmd $cmd --mamba-ssm-cache-dtype float16
  refused "--mamba-ssm-cache-dtype must be auto, float32 or bfloat16 (got '')" run_cmd $cmd --mamba-ssm-cache-dtype ""
done
# capacity takes --kv-memory and --block-size too: same words (issue 15 items 9, 11).
refused "--kv-memory must be > 0" "$BIN" capacity "$T/m" --kv-memory 0
refused "--gpu-memory must be > 0" "$BIN" capacity "$T/m" --gpu-memory 0
refused "--block-size must be >= 1" "$BIN" capacity "$T/m" --kv-memory 1GiB --block-size 0
refused "--max-num-seqs must be >= 1" "$BIN" capacity "$T/m" --kv-memory 1GiB --max-num-seqs 0

# Counts checked by CLI11 say "must be >= N", never CLI11's "Value 0 not in
# range 0.000000 to 1797..." (issue 15 item 11).
refused "--max-tokens: must be >= 1 (got 0)" "$BIN" generate "$T/m" --prompt "Hello" --max-tokens 0
refused "--temperature: must be >= 0 (got -1)" "$BIN" generate "$T/m" --prompt "Hello" --temperature -1
refused "--top-k: must be >= 0 (got -2)" "$BIN" generate "$T/m" --prompt "Hello" --top-k -2
refused "--chunk-size: must be >= 1 (got -1)" run_cmd score --chunk-size -1
refused "--chunk-size: must be >= 1 (got 0)" run_cmd score --chunk-size 0
refused "--batch-size: must be >= 1 (got 0)" run_cmd bench --batch-size 0
refused "--input-len: must be >= 1 (got 0)" run_cmd bench --input-len 0
refused "--output-len: must be >= 2 (got 1)" run_cmd bench --output-len 1
refused "--num-iters: must be >= 1 (got 0)" run_cmd bench --num-iters 0
refused "--num-iters-warmup: must be >= 0 (got -1)" run_cmd bench --num-iters-warmup -1
refused "--num-prompts: must be >= 1 (got 0)" "$BIN" bench throughput "$T/m" --input-len 4 --output-len 2 --num-prompts 0

# Ranges and the other numeric checks use the project's validators
# (cli/commands.h at_least / greater_than / in_range), never CLI::Range,
# PositiveNumber or NonNegativeNumber (issue 15).
refused "--top-p: must be in (0, 1], got 2" "$BIN" generate "$T/m" --prompt "Hello" --top-p 2
refused "--top-p: must be in (0, 1], got 0" "$BIN" generate "$T/m" --prompt "Hello" --top-p 0
refused "--top-p: must be in (0, 1], got -0.5" "$BIN" generate "$T/m" --prompt "Hello" --top-p -0.5
refused "--port: must be in [1, 65535], got 0" "$BIN" bench serve --port 0
refused "--port: must be in [1, 65535], got 65536" "$BIN" bench serve --port 65536
refused "--num-prompts: must be >= 1 (got 0)" "$BIN" bench serve --num-prompts 0
refused "--max-concurrency: must be >= 1 (got 0)" "$BIN" bench serve --max-concurrency 0
refused "--random-input-len: must be >= 1 (got 0)" "$BIN" bench serve --random-input-len 0
refused "--random-output-len: must be >= 1 (got -3)" "$BIN" bench serve --random-output-len -3
refused "--num-warmups: must be >= 0 (got -1)" "$BIN" bench serve --num-warmups -1
refused "--request-timeout: must be > 0 (got 0)" "$BIN" bench serve --request-timeout 0
refused "--port must be in [0, 65535]" timeout 60 "$BIN" serve "$T/m" --port 70000
refused "--max-waiting must be >= 0" run_cmd serve --max-waiting -1
refused "--shutdown-grace must be >= 0" run_cmd serve --shutdown-grace -1

# --backend cuda: refused in one line until the CUDA engine lands (or no GPU here).
if ! command -v nvidia-smi > /dev/null 2>&1; then
  refused "--backend cuda" run_cmd generate --backend cuda
  # ... at once: before --load-format dummy makes an 8B model's weights (tens
  # of GB on the host; the check used to come after them).
  refused "--backend cuda" timeout 20 "$BIN" generate "$SRC/tests/data/configs/llama-3.1-8b" --load-format dummy \
    --tokenizer "$T/m" --backend cuda --prompt "Hello" --max-tokens 2
fi

# --threads above the hardware threads: capped, with a warning, same output.
expect_rc 0 run_cmd generate --threads 1
cp "$T/out" "$T/g1"
expect_rc 0 run_cmd generate --threads 100000
grep -q "exceeds the .* CPUs this process may run on" "$T/err" || fail "no warning for --threads 100000: $(cat "$T/err")"
cmp -s "$T/g1" "$T/out" || fail "capped threads changed the output"

# --load-format dummy: config.json alone is enough.
mkdir -p "$T/cfgonly"
cp "$T/m/config.json" "$T/cfgonly/"
expect_rc 0 "$BIN" score "$T/cfgonly" --token-ids-file "$T/ids.json" --output "$T/d.json" --load-format dummy
grep -q "dummy" "$T/err" || fail "no dummy-weights log line"
expect_rc 2 "$BIN" score "$T/cfgonly" --token-ids-file "$T/ids.json" --output "$T/d.json"

# --tokenizer: a model directory without tokenizer.json, tokenizer from elsewhere.
cp "$T/m/config.json" "$T/cfgonly/config.json"
expect_rc 0 "$BIN" generate "$T/cfgonly" --prompt "Hello" --max-tokens 2 --load-format dummy --tokenizer "$T/m"
expect_rc 2 "$BIN" generate "$T/cfgonly" --prompt "Hello" --max-tokens 2 --load-format dummy

# New flags are accepted where they apply.
expect_rc 0 run_cmd score --max-num-seqs 4 --max-num-batched-tokens 16 --enforce-eager

# The linear-attention state dtypes on a model without such layers (this
# Llama): accepted and ignored, as vLLM does: the same scores.
expect_rc 0 run_cmd score
cp "$T/s.json" "$T/s_default.json"
expect_rc 0 run_cmd score --mamba-cache-dtype float32 --mamba-ssm-cache-dtype bfloat16
cmp -s "$T/s.json" "$T/s_default.json" || fail "--mamba-*-cache-dtype changed a dense model's scores"
echo "engine_flags: ok"
