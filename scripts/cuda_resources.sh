#!/usr/bin/env bash
# Registers, stack frame and spills of every CUDA kernel (ptxas -v), one line
# per kernel; exit 1 if any attention kernel spills. Runs here (no GPU needed):
#   bash scripts/cuda_resources.sh [file.cu ...]
set -uo pipefail
cd "$(dirname "$0")/.."
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(src/backend/cuda/*.cu src/backend/cuda/*/*.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
for f in "${files[@]}"; do
  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Xptxas -v -c "$f" -o "$tmp/o.o" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; exit 1; }
  # ptxas prints: Compiling entry function '...'; Function properties for X; N bytes stack frame, ... spill ...; Used R registers, ...
  awk '/Function properties for/ {name=$NF}
       /bytes stack frame/ {stack=$1; sst=$5; sld=$9}
       /Used [0-9]+ registers/ {regs=$0; sub(/.*Used /,"",regs); sub(/ registers.*/,"",regs);
         sm=$0; if (sm ~ /bytes smem/) {sub(/.*barriers?, /,"",sm); sub(/ bytes smem.*/,"",sm)} else sm=0;
         printf "%s regs=%s stack=%s spill_st=%s spill_ld=%s smem=%s\n", name, regs, stack, sst, sld, sm}' "$tmp/log" |
    sed -E 's/^_ZN[^ ]*[0-9]+(decode_reduce_kernel|decode_kernel|prefill_kernel|store_kernel|absmax_kernel)(ILi([0-9]+)E(Li([0-9]+)E)?(Lb([01])E)?(Lb([01])E)?)?[^ ]*/\1<\3,\5,\7\9>/'
done | sort | tee "$tmp/all"
if grep -E "^(decode|prefill)_kernel" "$tmp/all" | grep -vqE "stack=0 spill_st=0 spill_ld=0"; then
  echo "SPILLS: attention kernels above use local memory"; bad=1
fi
exit $bad
