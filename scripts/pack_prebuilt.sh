#!/usr/bin/env bash
# Here (the development machine, same nvcc as the GPU machine): builds the
# GPU test and bench binaries and packs them for a device call into .wt/
# (ignored by .gitignore), with the two .debs whose
# libraries they need at run time (fetched by scripts/fetch_debs.sh).
#   bash scripts/pack_prebuilt.sh [TARGET ...]   (default: test_cuda bench_attention test_cuda_ops)
# Then: run(command="bash scripts/gpu_run.sh scripts/gpu_decode.sh", carry=[".wt"]).
# Keep the carried tree under the device's 64 MiB: the tracked files are
# ~55 MB (2026-12-04), the packed binaries ~3.5 MB; .debs is not carried.
# A previous build's bench for scripts/gpu_ab.sh: PREV=path/to/bench_attention
# packs it as .wt/prev_bench_attention.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=("$@"); [ ${#TARGETS[@]} -gt 0 ] || TARGETS=(test_cuda bench_attention test_cuda_ops)
[ -f build/CMakeCache.txt ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target "${TARGETS[@]}" -j "$(nproc)" >/dev/null
mkdir -p .wt/debs
stage=$(mktemp -d)
for t in "${TARGETS[@]}"; do cp "$(find build -type f -name "$t" -perm -u+x | head -1)" "$stage/"; done
XZ_OPT=${XZ_OPT:--9} tar cJf .wt/bin.tar.xz -C "$stage" .  # -9: the binaries share their fatbins (7.6 MB at -6, 3.5 at -9)
rm -rf "$stage"
[ -d .debs ] || ./scripts/fetch_debs.sh
cp .debs/libfmt9_*.deb .debs/libspdlog1.10_*.deb .wt/debs/
[ -n "${PREV:-}" ] && xz -c "$PREV" >.wt/prev_bench_attention.xz
git rev-parse --short HEAD >.wt/COMMIT
du -sh .wt
