#!/usr/bin/env bash
# Re-runs the 18 numbered reproductions of issue 15 against BIN and prints
# one markdown row each: item, command, exit code, message (docs/robustness.md).
# Usage: bash scripts/issue15_table.sh build/fp8kv .
# prints "| item | command | rc | message |" rows
BIN=$1; HERE=$2/tests/e2e; T=$(mktemp -d)
python3 "$HERE/tiny_model.py" "$T/m" > /dev/null; M=$T/m
printf 'Hello there. ' > "$T/good.txt"; printf 'ab\xff cd' > "$T/bad.txt"; mkdir -p "$T/dir"
cfg() { mkdir -p "$1"; python3 - "$M/config.json" "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[3]); json.dump(c, open(sys.argv[2], "w"))
PY
}
row() { local item=$1; shift; local disp="$*"; disp=${disp//$T/\$T}; disp=${disp//$BIN/fp8kv}
  local out; out=$(timeout 120 "$@" 2>&1 >/dev/null); local rc=$?
  if printf '%s' "$out" | grep -q '^error:'; then out=$(printf '%s' "$out" | grep '^error:' | head -1)
  else out=$(printf '%s' "$out" | grep -v '^\[' | tail -2 | tr '\n' ' '); fi
  out=${out//$T/\$T}; out=${out//|/\\|}
  printf '| %s | `%s` | %s | %s |\n' "$item" "$disp" "$rc" "${out:0:230}"; }
cfg $T/c1 'c.update(num_hidden_layers=64, num_attention_heads=1024, num_key_value_heads=1024, head_dim=65536)'
row 1 $BIN capacity $T/c1 --kv-memory 80GiB --block-size 1073741824
row 2 $BIN generate $M --prompt Hello --max-tokens 3 --threads 10000
row 3 $BIN tokenize $M --text-file $T/dir
cp -r $M $T/sub; python3 $HERE/st_edit.py $T/sub/model.safetensors add-f32 model.layers.1.self_attn.v_scale 1.4e-45
row 4 $BIN inspect $T/sub
cat > $T/sub_report.json <<'JSON'
{"status": "complete", "target": "fp8_e4m3", "rule": "safety:1.3", "layers": [
 {"layer": 0, "k_scale": 1.0, "v_scale": 1.0, "q_scale": 1.0},
 {"layer": 1, "k_scale": 1.0, "v_scale": 1.4e-45, "q_scale": 1.0}]}
JSON
row 4 $BIN inject $M --report $T/sub_report.json --output $T/inj4
row 5 bash -c 'ulimit -v 4000000; exec "$@"' _ $BIN generate $M --prompt Hello --max-tokens 2 --block-size 1000000000
cp -r $M $T/nan; python3 $HERE/st_edit.py $T/nan/model.safetensors set-f32 model.layers.1.mlp.down_proj.weight 5 nan
row 6 $BIN generate $T/nan --prompt Hello --max-tokens 2
row 6 $BIN inspect $T/nan --check-values
cat > $T/report.json <<'JSON'
{"status": "complete", "target": "fp8_e4m3", "rule": "safety:1.3", "layers": [
 {"layer": 0, "k_scale": 1.0, "v_scale": 2.0, "q_scale": 1.0},
 {"layer": 1, "k_scale": 1.0, "v_scale": 3.0, "q_scale": 1.0}]}
JSON
mkdir -p $T/ro; chmod 555 $T/ro
row 7 $BIN inject $M --report $T/report.json --output /proc/new
cfg $T/c8 'c["max_position_embeddings"] = 2**24'; cp $M/*.safetensors $M/tokenizer*.json $T/c8/
row 8 bash -c 'ulimit -v 4000000; exec "$@"' _ $BIN generate $T/c8 --prompt Hello --max-tokens 2
row 9 $BIN generate $M --prompt Hello --max-tokens 2 --kv-memory 0
row 9 $BIN calibrate $M --corpus $T/good.txt --output $T/r.json --threads -3
row 10 $BIN generate $M --prompt Hello --max-tokens 2 --kv-memory 1000000TiB
row 11 $BIN generate $M --prompt Hello --block-size 0
row 11 $BIN generate $M --prompt Hello --max-tokens 0
row 12 $BIN tokenize $M --text-file $T/bad.txt
row 12 $BIN calibrate $M --corpus $T/good.txt --corpus $T/bad.txt --output $T/r.json
row 12 $BIN eval niah $M --haystack $T/bad.txt --lengths 64 --depths 50 --trials 1
cfg $T/c13 'c["rope_scaling"] = {"rope_type": "linear", "factor": 1e-300}'
row 13 $BIN capacity $T/c13 --kv-memory 1GiB
cfg $T/c14 'c["num_hidden_layers"] = 10**12'
row 14 $BIN capacity $T/c14 --kv-memory 1GiB
cfg $T/c14b 'c["hidden_size"] = 2**62'
row 14 $BIN capacity $T/c14b --kv-memory 1GiB
cfg $T/c14c 'c["sliding_window"] = 2**63 - 1; c["model_type"] = "mistral"; c["architectures"] = ["MistralForCausalLM"]'
row 14 $BIN capacity $T/c14c --kv-memory 1GiB
cp -r $M $T/at; python3 - $T/at/tokenizer.json <<'PY'
import json,sys; t=json.load(open(sys.argv[1])); t["added_tokens"][0]["id"]=2**40; json.dump(t,open(sys.argv[1],"w"))
PY
row 14 $BIN tokenize $T/at --text hi
row 15 $BIN frobnicate
chmod 555 $T/ro
row 16 $BIN eval compare $M --text-file $T/good.txt --output $T/cmp.json --html /proc/r.html
row 17 $BIN eval niah $M --haystack $T/good.txt --lengths 100000 --depths 50 --trials 1
mkdir -p $T/scales; python3 $HERE/st_edit.py $T/scales/model.safetensors only-f32 model.layers.0.self_attn.k_scale -1
row 18 $BIN eval compare $M --text-file $T/good.txt --arms bf16,fp8:scales=$T/scales
chmod 755 $T/ro; rm -rf $T
