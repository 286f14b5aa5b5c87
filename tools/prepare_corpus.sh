#!/usr/bin/env bash
# Build the bundled model's training corpus from Debian packages.
#
#   tools/prepare_corpus.sh [CORPUS_DIR=corpus] [EVAL_DIR=models/fp8kv-mini/eval]
#
# Runs HERE (Debian 12, apt-get works), not on the GPU machine. Downloads the
# .debs with `apt-get download` into $WORK (default /tmp/fp8kv_corpus, outside
# the repo), unpacks them with `dpkg -x` (never into /), dumps the KJV text
# with the packaged `bible` program, then tools/corpus_clean.py writes
#   CORPUS_DIR/train.txt  CORPUS_DIR/heldout.txt  (documents separated by a
#   line "<|endoftext|>"; split by document), CORPUS_DIR/manifest.json,
#   CORPUS_DIR/copyright/<pkg>  (each package's Debian copyright file),
# and the tracked eval texts EVAL_DIR/heldout_N.txt + EVAL_DIR/haystack.txt
# (held-out split only). corpus/ is git-ignored and travels to the GPU machine
# with carry ["corpus"]; keep it well under 40 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-corpus}
EVAL=${2:-models/fp8kv-mini/eval}
WORK=${WORK:-/tmp/fp8kv_corpus}
PKGS=(bible-kjv bible-kjv-text dict-devil dict-jargon python3.11-doc postgresql-doc-15 sqlite3-doc)

mkdir -p "$WORK/debs" "$WORK/x" "$CORPUS/copyright"
chmod 777 "$WORK/debs" 2>/dev/null || true   # let _apt write there (no sandbox warning)
if ! (cd "$WORK/debs" && apt-get download "${PKGS[@]}" >/dev/null); then
  echo "apt-get download failed; trying apt-get update first" >&2
  apt-get update -qq
  (cd "$WORK/debs" && apt-get download "${PKGS[@]}" >/dev/null)
fi

versions="{"
for p in "${PKGS[@]}"; do
  deb=$(ls -t "$WORK/debs/${p}_"*.deb | head -1)
  rm -rf "$WORK/x/$p"; mkdir -p "$WORK/x/$p"
  dpkg -x "$deb" "$WORK/x/$p"
  v=$(dpkg-deb -f "$deb" Version)
  versions+="\"$p\": \"$v\","
  cp "$WORK/x/$p/usr/share/doc/"*/copyright "$CORPUS/copyright/$p" 2>/dev/null || true
done
versions="${versions%,}}"
rm -f "$CORPUS/copyright/bible-kjv"   # the reader program only; its text is not used

# The KJV text ships compressed in the bible program's own format: dump it.
"$WORK/x/bible-kjv/usr/bin/bible" -p "$WORK/x/bible-kjv-text/usr/lib" -f "gen1:1-rev22:21" \
  </dev/null >"$WORK/kjv.txt"
test "$(wc -l <"$WORK/kjv.txt")" -gt 30000 || { echo "KJV dump too short" >&2; exit 1; }

mkdir -p "$EVAL"
python3 tools/corpus_clean.py --src "$WORK" --out "$CORPUS" --versions "$versions" --eval-dir "$EVAL"
du -sh "$CORPUS" "$EVAL" >&2
ls -l "$CORPUS" "$EVAL" >&2
