#!/usr/bin/env bash
# e2e: fp8kv generate on a tiny random checkpoint (made here with python3, stdlib only).
source "$(dirname "$0")/lib.sh"
python3 "$SRC/tests/e2e/tiny_model.py" "$T/m" --bf16 || fail "could not make the tiny model"

expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello there" --max-tokens 12
cp "$T/out" "$T/g1"
grep -q "tok/s" "$T/err" || fail "no tokens/s on stderr"
grep -q "KV cache: " "$T/err" || fail "no KV cache line on stderr"
[ -s "$T/g1" ] || fail "nothing on stdout"
expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello there" --max-tokens 12 --threads 1
cmp -s "$T/g1" "$T/out" || fail "greedy generation not reproducible across runs/threads"
expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello there" --max-tokens 12 --kv-cache-dtype fp8_e5m2
expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello there" --max-tokens 12 --temperature 0.8 --top-p 0.9 --top-k 20 --seed 7
cp "$T/out" "$T/s1"
expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello there" --max-tokens 12 --temperature 0.8 --top-p 0.9 --top-k 20 --seed 7
cmp -s "$T/s1" "$T/out" || fail "seeded sampling not reproducible"
# Generation stops at max_model_len (finish: length), no error.
expect_rc 0 "$BIN" generate "$T/m" --prompt "Hello" --max-tokens 100 --max-model-len 10
grep -q "finish: length" "$T/err" || fail "no finish reason"

expect_rc 2 "$BIN" generate "$T/m" --prompt ""
expect_rc 2 "$BIN" generate "$T/m"
expect_rc 2 "$BIN" generate "$T/m" --prompt "hi" --bogus
expect_rc 2 "$BIN" generate "$T/m" --prompt "a much longer prompt than the context" --max-model-len 8
grep -q "max_model_len" "$T/err" || fail "prompt-too-long error does not say why"
expect_rc 2 "$BIN" generate "$T/m" --prompt "hi" --top-p 0
expect_rc 2 "$BIN" generate "$T/m" --prompt "hi" --max-tokens 0
echo "generate e2e: OK"
