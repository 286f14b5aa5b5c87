#!/usr/bin/env bash
# Installs what fp8kv's build and tests need from Debian's packages (idempotent).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git python3
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libutf8proc-dev
  libssl-dev libopenblas0-openmp libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev zlib1g-dev clang-14 libclang-rt-14-dev zstd curl)
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
