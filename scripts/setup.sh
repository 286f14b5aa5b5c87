#!/usr/bin/env bash
# Installs what fp8kv needs from Debian's packages (idempotent).
#   scripts/setup.sh       the build, the tests, the benchmarks and the Node
#                          client tests of `fp8kv serve` (scripts/test.sh)
#   scripts/setup.sh run   only what the fp8kv binary builds from (scripts/run.sh)
set -euo pipefail
MODE=${1:-all}
PKGS=(build-essential cmake ninja-build pkg-config git python3
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libutf8proc-dev
  libssl-dev libopenblas0-openmp libopenblas-dev libcpp-httplib-dev zlib1g-dev)
[ "$MODE" = run ] || PKGS+=(libgtest-dev libgmock-dev libbenchmark-dev clang-14 libclang-rt-14-dev zstd curl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present" >&2
fi

# Node client tests of `fp8kv serve` (tests/server, openai@^6 pinned by the
# lockfile): npm ci when node_modules is missing or older than the lockfile.
cd "$(dirname "$0")/.."
if [ "$MODE" = run ]; then
  :
elif command -v npm >/dev/null 2>&1; then
  d=tests/server
  if [ ! -f "$d/node_modules/.package-lock.json" ] || [ "$d/package-lock.json" -nt "$d/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $d" >&2
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "setup: npm not found: the server client tests (tests/server) will be skipped" >&2
fi

# The bundled model's weight shards are tracked xz-compressed: expand them.
./scripts/expand_models.sh
