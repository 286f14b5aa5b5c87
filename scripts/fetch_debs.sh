#!/usr/bin/env bash
# Here (Debian 12): download the .debs the GPU machine's build needs into .debs/
# (ignored by git, carried with `carry: [".debs"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs && cd .debs
apt-get download nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 \
  libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian libcpp-httplib-dev \
  libcpp-httplib0.11 libbrotli-dev libbrotli1
