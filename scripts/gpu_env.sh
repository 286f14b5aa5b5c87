#!/usr/bin/env bash
# Source on the GPU machine (Ubuntu 24.04 image, no package registry): unpacks
# the Debian 12 .debs carried in .debs/ (fetched here by scripts/fetch_debs.sh)
# into a private prefix and points CMake / pkg-config / the loader at it.
#   source scripts/gpu_env.sh && cmake -S . -B build-gpu ...
P=${FP8KV_PREFIX:-/tmp/fp8kv-prefix}
if [ ! -f "$P/.done" ]; then
  mkdir -p "$P"
  for f in .debs/*.deb; do dpkg -x "$f" "$P"; done
  # Relocate pkg-config files.
  for pc in $(find "$P" -name '*.pc'); do
    sed -i -e "s|^prefix=/usr|prefix=$P/usr|" -e "s|=/usr/include|=$P/usr/include|" \
           -e "s|=/usr/lib|=$P/usr/lib|" "$pc"
  done
  touch "$P/.done"
fi
export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$P/usr/lib/x86_64-linux-gnu/pkgconfig:$P/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$P/usr/include${CPATH:+:$CPATH}"
