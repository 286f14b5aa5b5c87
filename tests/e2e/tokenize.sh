#!/usr/bin/env bash
# e2e: fp8kv tokenize / detokenize on the hand-made fixtures
# (tests/data/tokenizers) and, when present, the HF goldens.
# Usage: bash tokenize.sh <path-to-fp8kv> <source-dir>
source "$(dirname "$0")/lib.sh"
FIX="$SRC/tests/data/tokenizers"
fails=0
tmp=$T

check() {  # name, expected-substring, command...
  local name="$1" want="$2"
  shift 2
  local out rc
  out=$("$@" 2>"$tmp/err")
  rc=$?
  if [[ $rc -ne 0 || "$out" != *"$want"* ]]; then
    echo "FAIL $name: rc=$rc out=$out want~$want stderr=$(cat "$tmp/err")"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

check_rc() {  # name, expected-rc, stderr-substring, command...
  local name="$1" want_rc="$2" want_err="$3"
  shift 3
  local out rc
  out=$("$@" 2>"$tmp/err")
  rc=$?
  if [[ $rc -ne $want_rc || "$(cat "$tmp/err")" != *"$want_err"* || -n "$out" ]]; then
    echo "FAIL $name: rc=$rc (want $want_rc) stdout=$out stderr=$(cat "$tmp/err")"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

# Encode (ids derived by hand in tests/tokenizer/test_tokenizer_fixtures.cpp).
check "spm encode" '"ids":[1,271,276]' "$BIN" tokenize "$FIX/spm_llama2.json" --text "hello world"
check "spm encode --no-special" '"ids":[271,276]' "$BIN" tokenize "$FIX/spm_llama2.json" --text "hello world" --no-special
check "bytelevel special in text" '"ids":[260,267,119,262,264]' "$BIN" tokenize "$FIX/bytelevel.json" --text "hello<|endoftext|>world"
check "version in output" '"fp8kv_version"' "$BIN" tokenize "$FIX/bytelevel.json" --text "hello"
printf 'hello world' >"$tmp/in.txt"
check "text-file" '"ids":[260,265]' "$BIN" tokenize "$FIX/bytelevel.json" --text-file "$tmp/in.txt"
check "model dir" '"ids":[1,271]' "$BIN" tokenize "$FIX/keep_post_dir" --text "hello"
check "empty text" '"ids":[]' "$BIN" tokenize "$FIX/bytelevel.json" --text ""

# Decode.
check "spm decode keeps special" '"text":"<s> hello world"' "$BIN" detokenize "$FIX/spm_llama2.json" --ids 1,271,276
check "spm decode --skip-special" '"text":"hello world"' "$BIN" detokenize "$FIX/spm_llama2.json" --ids 1,271,276 --skip-special
check "invalid utf-8 -> U+FFFD" '"text":"�a"' "$BIN" detokenize "$FIX/bytelevel.json" --ids "228, 184, 97"
check "ids as JSON array" '"text":"hello world"' "$BIN" detokenize "$FIX/bytelevel.json" --ids "[260,265]"

# Bad input: exit 2, one clear line on stderr, nothing on stdout.
printf 'ab\xc3' >"$tmp/bad.txt"
check_rc "invalid utf-8 text" 2 "--text-file $tmp/bad.txt: not valid UTF-8 (first invalid byte 0xC3 at byte offset 2)" "$BIN" tokenize "$FIX/bytelevel.json" --text-file "$tmp/bad.txt"
# Issue 15 item 3: a directory (or a missing file) given as --text-file is refused, not read as empty.
check_rc "text-file is a dir" 2 "--text-file $tmp: is a directory, expected a file" "$BIN" tokenize "$FIX/bytelevel.json" --text-file "$tmp"
check_rc "text-file missing" 2 "--text-file $tmp/none.txt: no such file" "$BIN" tokenize "$FIX/bytelevel.json" --text-file "$tmp/none.txt"
check_rc "missing tokenizer" 2 "no such file" "$BIN" tokenize "$tmp/nope.json" --text x
printf '{"model": {"type": "Unigram", "vocab": []}}' >"$tmp/uni.json"
check_rc "unigram unsupported" 2 'model type "Unigram" is unsupported' "$BIN" tokenize "$tmp/uni.json" --text x
printf '{"model": ' >"$tmp/trunc.json"
check_rc "malformed json" 2 "not valid JSON" "$BIN" tokenize "$tmp/trunc.json" --text x
check_rc "bad ids" 2 "--ids '1,-2': '-2' is not an integer in [0, 2147483647]" "$BIN" detokenize "$FIX/bytelevel.json" --ids 1,-2
check_rc "no text" 2 "--text" "$BIN" tokenize "$FIX/bytelevel.json"
check_rc "text and text-file" 2 "" "$BIN" tokenize "$FIX/bytelevel.json" --text a --text-file "$tmp/in.txt"

# Goldens (HF references), when generated: a few cases through the CLI.
G="$SRC/tests/golden/tokenizer"
if [[ -f "$G/llama3.cases.json.gz" ]] && command -v python3 >/dev/null; then
  python3 - "$G" "$BIN" <<'PY' || fails=$((fails + 1))
import gzip, json, subprocess, sys
g, binary = sys.argv[1], sys.argv[2]
bad = 0
for name, path in [("llama3", "llama3/tokenizer.json"), ("llama2", "llama2/tokenizer.json"), ("qwen2_dir", "qwen2_dir")]:
    doc = json.load(gzip.open(f"{g}/{name}.cases.json.gz", "rt", encoding="utf-8"))
    for c in doc["cases"][:12]:
        if "\x00" in c["text"]:
            continue  # argv cannot carry NUL
        out = subprocess.run([binary, "tokenize", f"{g}/{path}", "--text", c["text"]], capture_output=True)
        got = json.loads(out.stdout)["ids"] if out.returncode == 0 else None
        if got != c["ids"]:
            bad += 1
            print(f"FAIL golden {name} {c['text']!r}: {got} != {c['ids']}")
        ids = ",".join(map(str, c["ids"]))
        out = subprocess.run([binary, "detokenize", f"{g}/{path}", "--ids", ids], capture_output=True)
        got = json.loads(out.stdout)["text"] if out.returncode == 0 else None
        if got != c["decoded"]:
            bad += 1
            print(f"FAIL golden decode {name} {ids}: {got!r} != {c['decoded']!r}")
print("ok   goldens via CLI" if bad == 0 else f"FAIL goldens via CLI: {bad}")
sys.exit(1 if bad else 0)
PY
fi

if [[ $fails -ne 0 ]]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "all tokenize e2e checks passed"
