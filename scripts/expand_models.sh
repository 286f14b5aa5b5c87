#!/usr/bin/env bash
# Expands the bundled model's weight shards, tracked xz-compressed to keep the
# repo small (models/*/NAME.safetensors.xz), into NAME.safetensors beside them
# (ignored by git), and checks each against the model's SHA256SUMS.
# Idempotent and safe to run concurrently: a shard whose hash already matches
# is left alone; a new one is written to a temporary name and renamed.
# Run by scripts/setup.sh and by ctest (the fixture bundled_model).
set -euo pipefail
cd "$(dirname "$0")/.."
hash_of() { sha256sum <"$1" | cut -d' ' -f1; }
for packed in models/*/*.safetensors.xz; do
  [ -e "$packed" ] || continue
  out=${packed%.xz}
  dir=$(dirname "$out") name=$(basename "$out")
  want=$(awk -v n="$name" '$2 == n {print $1}' "$dir/SHA256SUMS" 2>/dev/null || true)
  if [ -z "$want" ]; then
    echo "expand_models: $name is not listed in $dir/SHA256SUMS" >&2
    exit 1
  fi
  [ -f "$out" ] && [ "$(hash_of "$out")" = "$want" ] && continue
  tmp="$out.tmp.$$"
  python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)' "$packed" "$tmp"
  if [ "$(hash_of "$tmp")" != "$want" ]; then
    rm -f "$tmp"
    echo "expand_models: $packed does not expand to the $name that $dir/SHA256SUMS lists" >&2
    exit 1
  fi
  mv -f "$tmp" "$out"
  echo "expand_models: $out" >&2
done
