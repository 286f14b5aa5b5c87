// Device helpers shared by the prefill kernels (prefill_mma.cu,
// prefill_ws.cu): the paged-cache key lookup and the output epilogue.
#pragma once
#include "backend/cuda/common.cuh"

namespace fp8kv::cuda::detail {

// Byte offsets of keys of one (sequence, KV head) in the paged cache. Block
// sizes are multiples of 16; powers of two (the usual case) avoid the
// integer division.
struct PageMap {
  const int32_t* bt;  // this sequence's block table
  int64_t row_bytes;  // one token's K (or V) row of all KV heads
  int64_t head_off;   // this KV head inside the row
  int block_size, shift = 0;
  bool pow2;
  __device__ __forceinline__ PageMap(const PagedKvParams& p, int b, int kvh, int head_dim, int elem_bytes)
      : bt(p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq),
        row_bytes(static_cast<int64_t>(p.num_kv_heads) * head_dim * elem_bytes),
        head_off(static_cast<int64_t>(kvh) * head_dim * elem_bytes),
        block_size(p.block_size),
        pow2((p.block_size & (p.block_size - 1)) == 0) {
    shift = __ffs(p.block_size) - 1;
  }
  __device__ __forceinline__ int block_of(int j) const { return pow2 ? j >> shift : j / block_size; }
  __device__ __forceinline__ int in_block(int j) const { return pow2 ? j & (block_size - 1) : j % block_size; }
  // Offset of key j's row when its block id (bt[block_of(j)]) is already known.
  __device__ __forceinline__ int64_t slot_off_in(int32_t block_id, int j) const {
    return (static_cast<int64_t>(block_id) * block_size + in_block(j)) * row_bytes + head_off;
  }
  __device__ __forceinline__ int64_t slot_off(int j) const { return slot_off_in(bt[block_of(j)], j); }
};

// Epilogue of the mma.sync / wgmma fragment layout: this thread holds rows
// row0 and row0 + 8 (rr = 0, 1) of the output tile, columns 8 i + 2 t + {0, 1}
// for i < D / 8; get(i, rr, e) returns the unnormalized value. Sums l over
// the 4 threads of a row, scales by v_scale / l (0 for an empty row) and
// stores f32 or bf16 rows of query q_row0 (+ 8) of head h. Rows with
// valid[rr] false are skipped.
template <int D, class Get>
__device__ __forceinline__ void store_o_rows(const PagedKvParams& p, int64_t q_row0, int h, int t, const float (&l)[2],
                                             const bool (&valid)[2], float vs, Get get) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float L = l[rr];
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    if (!valid[rr]) continue;
    const float f = L > 0.0f ? vs / L : 0.0f;
    const int64_t base = ((q_row0 + rr * 8) * p.num_heads + h) * D;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int d = i * 8 + 2 * t;
      if (p.out_bf16) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + base + d) =
            __floats2bfloat162_rn(get(i, rr, 0) * f, get(i, rr, 1) * f);
      } else {
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + base + d) =
            make_float2(get(i, rr, 0) * f, get(i, rr, 1) * f);
      }
    }
  }
}

}  // namespace fp8kv::cuda::detail
