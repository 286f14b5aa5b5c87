#!/usr/bin/env bash
# Bad input end to end (issue 15): each case must exit 2 with one line on
# stderr naming the file / tensor / field / option at fault, print nothing on
# stdout, and write nothing. Cases are numbered as in the issue.
# Usage: bash bad_input.sh <fp8kv-binary> <source-dir>
source "$(dirname "$0")/lib.sh"
python3 "$HERE/tiny_model.py" "$T/m" > /dev/null || fail "make tiny model"
M="$T/m"
printf 'Hello there. ' > "$T/good.txt"
printf 'ab\xff cd' > "$T/bad.txt"
mkdir -p "$T/dir"
cfg() {  # cfg DIR PYTHON-EXPR-ON-c : a copy of the tiny model's config.json, edited
  mkdir -p "$1"
  python3 - "$M/config.json" "$1/config.json" "$2" <<'PY' || fail "cfg $1"
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}
copy_model() { cp -r "$M" "$1"; }

# 1. Size products past 64 bits (64 layers x 1024 KV heads x head_dim 65536,
# --block-size 2^30: the page is exactly 2^64 bytes, which wrapped to 0 and
# died with SIGFPE). Refused naming every factor.
cfg "$T/c1" 'c.update(num_hidden_layers=64, num_attention_heads=1024, num_key_value_heads=1024, head_dim=65536)'
expect_refused "1 capacity page overflow" "KV page size (bytes of one block) does not fit in 64 bits: --block-size 1073741824" \
  "$BIN" capacity "$T/c1" --kv-memory 80GiB --block-size 1073741824
grep -qF "num_key_value_heads 1024 x head_dim 65536" "$T/err" || fail "1: factors not named: $(cat "$T/err")"
# 10. A budget of more blocks than 32-bit block ids names --kv-memory (it said
# "BlockPool: bad number of blocks"), in the engine and in capacity alike.
expect_refused "10 generate --kv-memory 1000000TiB" "lower --kv-memory" \
  "$BIN" generate "$M" --prompt "Hello" --max-tokens 2 --kv-memory 1000000TiB
grep -qF -- "--kv-memory: a KV budget of" "$T/err" || fail "10: --kv-memory not named first: $(cat "$T/err")"
expect_refused "10 capacity --kv-memory 1000000TiB" "block ids are 32-bit" \
  "$BIN" capacity "$M" --kv-memory 1000000TiB

# 3. A directory or a missing file given where a file is read.
expect_refused "3 score --text-file dir" "--text-file $T/dir: is a directory, expected a file" \
  "$BIN" score "$M" --text-file "$T/dir" --output "$T/o.json"
expect_refused "3 calibrate --corpus dir" "--corpus $T/dir: is a directory, expected a file" \
  "$BIN" calibrate "$M" --corpus "$T/dir" --output "$T/r.json"
expect_refused "3 niah --haystack missing" "--haystack $T/none.txt: no such file" \
  "$BIN" eval niah "$M" --haystack "$T/none.txt" --lengths 64 --depths 50 --trials 1
expect_refused "3 inject --report dir" "--report $T/dir: is a directory, expected a file" \
  "$BIN" inject "$M" --report "$T/dir" --output "$T/inj"
[ -e "$T/o.json" ] || [ -e "$T/r.json" ] || [ -e "$T/inj" ] && fail "3: an output was written"

# 4. A subnormal float32 scale (reciprocal inf) is refused by inspect, naming file and tensor.
copy_model "$T/sub"
python3 "$HERE/st_edit.py" "$T/sub/model.safetensors" add-f32 model.layers.1.self_attn.v_scale 1.4e-45
expect_refused "4 inspect subnormal v_scale" \
  "$T/sub/model.safetensors: model.layers.1.self_attn.v_scale is 1.40129846e-45, a subnormal float32" \
  "$BIN" inspect "$T/sub"
# ... and a report carrying one is refused by inject before any write.
write_report "$T/sub_report.json" complete 1.0:1.0 1.0:1e-40
expect_refused "4 inject subnormal v_scale" "v_scale is 9.9999461e-41, a subnormal float32" \
  "$BIN" inject "$M" --report "$T/sub_report.json" --output "$T/inj4"
[ -e "$T/inj4" ] && fail "4: inject wrote its output"
# A scale outside [2^-20, 2^20] loads, with a warning naming it.
copy_model "$T/big"
python3 "$HERE/st_edit.py" "$T/big/model.safetensors" add-f32 model.layers.0.self_attn.k_scale 4e6
expect_rc 0 "$BIN" inspect "$T/big"
grep -qF "model.layers.0.self_attn.k_scale is 4000000, outside [2^-20, 2^20]" "$T/err" || fail "4: no range warning: $(cat "$T/err")"
echo "ok   4 range warning"

# 6. NaN / inf in a weight: inspect says it does not scan values; --check-values names the tensor.
copy_model "$T/nan"
python3 "$HERE/st_edit.py" "$T/nan/model.safetensors" set-f32 model.layers.1.mlp.down_proj.weight 5 nan
expect_rc 0 "$BIN" inspect "$T/nan"
grep -q "^values: *not scanned" "$T/out" || fail "6: plain inspect does not say values are not scanned"
expect_rc 0 "$BIN" inspect "$T/nan" --json
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['values_checked'] is False" "$T/out" || fail "6: values_checked"
expect_refused "6 inspect --check-values NaN" \
  "$T/nan/model.safetensors: tensor model.layers.1.mlp.down_proj.weight (F32, shape [32, 64]) has NaN at element 5" \
  "$BIN" inspect "$T/nan" --check-values
# ... and running it names the tensor and its layer, not "internal error: non-finite logits".
expect_refused "6 generate with a NaN weight" "model.layers.1.mlp.down_proj.weight (layer 1) holds NaN at element 5" \
  "$BIN" generate "$T/nan" --prompt "Hello" --max-tokens 2
expect_refused "6 score with a NaN weight" "model.layers.1.mlp.down_proj.weight (layer 1) holds NaN" \
  "$BIN" score "$T/nan" --text-file "$T/good.txt" --output "$T/o6.json"
python3 "$HERE/st_edit.py" "$T/nan/model.safetensors" set-f32 model.layers.1.mlp.down_proj.weight 5 0.5
python3 "$HERE/st_edit.py" "$T/nan/model.safetensors" set-f32 model.embed_tokens.weight 7 -inf
expect_refused "6 inspect --check-values -inf" "tensor model.embed_tokens.weight (F32, shape [272, 32]) has -inf at element 7" \
  "$BIN" inspect "$T/nan" --check-values
expect_rc 0 "$BIN" inspect "$M" --check-values --json
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['values_checked'] is True" "$T/out" || fail "6: values_checked true"
echo "ok   6 clean model passes --check-values"

# 7. inject --output where the new directory cannot be made.
write_report "$T/report.json" complete 1.0:2.0 1.0:3.0
expect_refused "7 inject --output under a file" "--output $T/good.txt/new: $T/good.txt is not a directory" \
  "$BIN" inject "$M" --report "$T/report.json" --output "$T/good.txt/new"
if [ "$(id -u)" != 0 ]; then
  mkdir -p "$T/ro"; chmod 555 "$T/ro"
  expect_refused "7 inject --output in a read-only dir" "--output $T/ro/new: cannot write in $T/ro" \
    "$BIN" inject "$M" --report "$T/report.json" --output "$T/ro/new"
  chmod 755 "$T/ro"
fi

# 12. Invalid UTF-8 in a text input names the option and the file.
expect_refused "12 score --text-file" "--text-file $T/bad.txt: not valid UTF-8 (first invalid byte 0xFF at byte offset 2)" \
  "$BIN" score "$M" --text-file "$T/bad.txt" --output "$T/o.json"
expect_refused "12 calibrate second --corpus" "--corpus $T/bad.txt: not valid UTF-8" \
  "$BIN" calibrate "$M" --corpus "$T/good.txt" --corpus "$T/bad.txt" --output "$T/r.json"
expect_refused "12 niah --haystack" "--haystack $T/bad.txt: not valid UTF-8" \
  "$BIN" eval niah "$M" --haystack "$T/bad.txt" --lengths 64 --depths 50 --trials 1
expect_refused "12 compare --text-file" "--text-file $T/bad.txt: not valid UTF-8" \
  "$BIN" eval compare "$M" --text-file "$T/good.txt" --text-file "$T/bad.txt"

# 13. A rope factor that shrinks the context to nothing names config.json and the field.
cfg "$T/c13" 'c["rope_scaling"] = {"rope_type": "linear", "factor": 1e-300}'
expect_refused "13 rope_scaling.factor" "config.json: field 'rope_scaling.factor': 1e-300 scales the context of 128 positions" \
  "$BIN" capacity "$T/c13" --kv-memory 1GiB

# 14. Huge integers state the bound.
cfg "$T/c14" 'c["num_hidden_layers"] = 10**12'
expect_refused "14 num_hidden_layers 1e12" "field 'num_hidden_layers': expected a positive integer <= 2147483647 (2^31 - 1), got 1000000000000" \
  "$BIN" capacity "$T/c14" --kv-memory 1GiB
cfg "$T/c14b" 'c["sliding_window"] = 2**63 - 1; c["model_type"] = "mistral"; c["architectures"] = ["MistralForCausalLM"]'
expect_refused "14 sliding_window INT64_MAX" "field 'sliding_window': expected a positive integer <= 2147483647" \
  "$BIN" capacity "$T/c14b" --kv-memory 1GiB

# 15. An unknown subcommand is named, and the subcommands listed.
expect_refused "15 unknown subcommand" "unknown subcommand 'frobnicate' (subcommands: " "$BIN" frobnicate
grep -qF "inspect" "$T/err" || fail "15: subcommands not listed"

# 16. Output paths are checked before any computation.
expect_refused "16 compare --html in a missing dir" "--html $T/nodir/r.html: directory $T/nodir does not exist" \
  "$BIN" eval compare "$M" --text-file "$T/good.txt" --output "$T/cmp.json" --html "$T/nodir/r.html"
[ -e "$T/cmp.json" ] && fail "16: JSON written although --html was bad"
expect_refused "16 score --output is a dir" "--output $T/dir: is a directory, expected a file path" \
  "$BIN" score "$M" --text-file "$T/good.txt" --output "$T/dir"
expect_refused "16 calibrate --output in a missing dir" "--output $T/nodir/r.json: directory $T/nodir does not exist" \
  "$BIN" calibrate "$M" --corpus "$T/good.txt" --output "$T/nodir/r.json"

# 17. A niah length beyond max_model_len says so (not "haystack too short").
expect_refused "17 niah length > max_model_len" "--lengths: 100000 exceeds max_model_len 128" \
  "$BIN" eval niah "$M" --haystack "$T/good.txt" --lengths 100000 --depths 50 --trials 1

# 18. KV-scale errors name the arm and the file.
mkdir -p "$T/scales"
python3 "$HERE/st_edit.py" "$T/scales/model.safetensors" only-f32 model.layers.0.self_attn.k_scale -1
expect_refused "18 arm scales" "arm 'fp8:scales=$T/scales': $T/scales/model.safetensors: model.layers.0.self_attn.k_scale is negative" \
  "$BIN" eval compare "$M" --text-file "$T/good.txt" --arms "bf16,fp8:scales=$T/scales"

# 5, 8. Sizes that cannot be allocated: exit 2 with the flags to change, not
# "internal error: std::bad_alloc"; refused by arithmetic before the pool is
# reserved (one request of max_model_len must fit the machine: physical
# memory, ulimit -v, the cgroup). Under a 2 GB address-space limit so the
# test never takes the machine's memory (skipped under ASan, whose allocator
# needs far more address space).
if bin_has_asan; then
  echo "skip 5, 8 (ASan build)"
else
  expect_refused "5 generate --block-size 1e9" \
    "not even a 1-token request fits: it takes a block in each of the 1 KV-cache group(s), 128000000000 bytes each (--block-size 1000000000): lower --block-size" \
    bash -c 'ulimit -v 2000000; exec "$@"' _ "$BIN" generate "$M" --prompt "Hello" --max-tokens 2 --block-size 1000000000
  cfg "$T/c8" 'c["max_position_embeddings"] = 2**24'
  cp "$M"/*.safetensors "$M"/tokenizer*.json "$T/c8/"
  expect_refused "8 max_position_embeddings 2^24, no --kv-memory" \
    "max_model_len 16777216 (the model's limit: max_position_embeddings in config.json; --max-model-len not given) needs 2.00 GiB" \
    bash -c 'ulimit -v 2000000; exec "$@"' _ "$BIN" generate "$T/c8" --prompt "Hello" --max-tokens 2
  grep -qF -- "give --max-model-len 16000000 or less" "$T/err" || fail "8: --max-model-len not suggested: $(cat "$T/err")"
fi
echo "all bad-input cases passed"
