// The decode kernels of the plan table (decode_plan.h), instantiated from its
// rows, and their launch and occupancy query.
//
// The kernel body (decode_body.cuh): one template, its MMA feed chosen at
// compile time (docs/cuda.md, decode):
// - ring (bf16 D = 256): each warp owns a ring of S tile stages in shared
//   memory, filled by cp.async, S tiles in flight. Every thread copies exactly
//   the 16-byte chunks it later reads (layout [chunk][lane][16 B]), so a
//   cp.async.wait_group orders the data for it without barriers.
// - reg: register-staged tiles, the next tile's loads in flight while this
//   tile's math runs (when the registers allow).
// - FAST: the reg loop's tiles, order and arithmetic (bitwise its results)
//   with fewer instructions per tile: block-table entries 32 tiles at a time
//   one per lane, fetched 32 tiles ahead; tile addresses as a 64-bit base plus
//   hoisted 32-bit per-thread offsets; the register stages ping-pong; the
//   accumulator rescale skipped when no row's running max moved; masks only on
//   tiles that cross [first, s_end).
// - LEAN (F4, fp8 e4m3 d128): FAST without its second register stage (one
//   stage refilled as it frees), so it fits 128 registers and 4 CTAs per SM.
// - DEEP (bf16 d128 FAST): the next tile in registers (~200 registers).
#include <array>
#include <atomic>
#include <stdexcept>
#include <utility>

#include "backend/cuda/attention/decode_body.cuh"

namespace fp8kv::cuda::decode {
namespace {

// The paged decode kernel (flash-decoding). One CTA = (KV head, chunk of up
// to kMaxGroup of its query heads, sequence, split of the keys); kWarps warps
// take 16-key tiles in turn.
// Grid: (num_kv_heads * gchunks, batch, max_splits); block: kWarps * 32;
// dynamic shared memory: DecodeCfg<D, DT, REG>::SMEM.
// Parameters (DecodeParams p; D = head_dim):
//   q             [batch][num_heads][D], f32 or bf16 (q_bf16)
//   k_cache, v_cache  [num_blocks][block_size][num_kv_heads][D] of DT
//   block_tables  [batch][max_blocks_per_seq] int32; context_lens [batch]
//   k_scale, v_scale  [1] or [num_kv_heads] f32 (fp8 caches)
//   out           [batch][num_heads][D], f32 or bf16 (out_bf16): sequences of one split
//   part_o        [batch][num_heads][max_splits][D] f32, part_lse [batch][num_heads][max_splits]
//                 (log2 domain): sequences of several splits (decode_reduce_kernel combines them)
//   k_scale_pth, v_scale_pth  [num_blocks][block_size][num_kv_heads] f32 (per-token-head
//                 dtypes, DecodePthParams): the K scale multiplies a key's score after
//                 the dot product, the V scale its probability in P V (not in the sum)
template <int D, int DT, DecodeLoop LOOP, int STAGES, int MIN_CTAS>
__global__ void __launch_bounds__(kWarps * 32, MIN_CTAS) decode_kernel(const DecodeParamsOf<DT> p) {
  constexpr bool FAST = LOOP == DecodeLoop::fast || LOOP == DecodeLoop::fast_refill;
  constexpr bool LEAN = LOOP == DecodeLoop::fast_refill;
  constexpr bool DEEP = DT == kBf16 && D == 128 && FAST;
  constexpr bool REG = D == 256 && LOOP != DecodeLoop::ring;
  decode_body<D, DT, DEEP, LEAN, REG, FAST>(p);
}

constexpr int dtype_code(KvDtype dt) { return static_cast<int>(dt); }  // = the element codes (common.cuh)

// Row I's kernel (WIDE: its wide kernel): attributes, occupancy, launch.
template <int I, bool WIDE>
struct RowKernel {
  static constexpr DecodePlanRow kRow = kDecodePlan[I];
  static constexpr DecodeKernelSpec kSpec = WIDE ? kRow.wide : kRow.kernel;
  static constexpr int D = kRow.head_dim, DT = dtype_code(kRow.dtype);
  static constexpr bool kRing = kSpec.loop == DecodeLoop::ring;
  static constexpr int kSmem = DecodeCfg<D, DT, D == 256 && !kRing>::SMEM;
  static constexpr auto kernel = decode_kernel<D, DT, kSpec.loop, kSpec.stages, kSpec.min_ctas>;

  // Dynamic shared memory above 48 KB and, for the ring, all of the unified
  // L1 as shared memory (2 CTAs of 96 KB per SM). Kernel attributes are per
  // device: set once per device by set_func_attribute_once (common.cuh).
  static void prepare() {
    set_func_attribute_once(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if constexpr (kRing)
      set_func_attribute_once(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  static void launch(const DecodePthParams& p, dim3 grid, cudaStream_t stream) {
    prepare();
    kernel<<<grid, dim3(kWarps * 32), kSmem, stream>>>(static_cast<const DecodeParamsOf<DT>&>(p));
    FP8KV_CUDA_CHECK(cudaGetLastError());
  }
  // Resident CTAs per SM (occupancy API) after prepare(); 0 when it cannot be
  // asked (no device). Cached per device (thread-safe: atomics; 0 = not asked yet).
  static int resident() {
    static std::array<std::atomic<int>, 64> cache{};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    const bool cached = dev >= 0 && dev < static_cast<int>(cache.size());
    if (cached) {
      const int n = cache[dev].load(std::memory_order_relaxed);
      if (n > 0) return n;
    }
    int c = 0;
    bool ok = false;
    try {
      prepare();
      ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, kernel, kWarps * 32, kSmem) == cudaSuccess;
    } catch (const std::runtime_error&) {
    }
    if (!ok) {
      (void)cudaGetLastError();  // the failed query must not surface at the next launch check
      return 0;
    }
    if (cached) cache[dev].store(c, std::memory_order_relaxed);
    return c;
  }
};

template <bool WIDE, int... I>
void launch_row(int row, const DecodePthParams& p, dim3 grid, cudaStream_t stream, std::integer_sequence<int, I...>) {
  (void)((row == I && (RowKernel<I, WIDE>::launch(p, grid, stream), true)) || ...);
}
template <bool WIDE, int... I>
int resident_row(int row, std::integer_sequence<int, I...>) {
  int n = 0;
  (void)((row == I && (n = RowKernel<I, WIDE>::resident(), true)) || ...);
  return n;
}
using Rows = std::make_integer_sequence<int, kDecodePlanRows>;

}  // namespace

void launch_decode_kernel(int row, bool wide, const DecodePthParams& p, dim3 grid, cudaStream_t stream) {
  if (wide) launch_row<true>(row, p, grid, stream, Rows{});
  else launch_row<false>(row, p, grid, stream, Rows{});
}

int decode_resident_ctas(int row, bool wide) {
  return wide ? resident_row<true>(row, Rows{}) : resident_row<false>(row, Rows{});
}

}  // namespace fp8kv::cuda::decode
