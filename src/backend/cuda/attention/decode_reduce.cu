// The decode split combine: out = sum_s w_s O_s / sum_s w_s per (sequence,
// head), w_s = exp2(lse_s - max lse), in a fixed order (deterministic).
#include <stdexcept>
#include <string>

#include "backend/cuda/attention/decode_common.cuh"
#include "backend/cuda/pdl_launch.cuh"

namespace fp8kv::cuda::decode {
namespace {

// Combines the splits of one (sequence, head). 256 threads: R = 256 / (D/4)
// rows of D/4 threads (a float4 column each); row rho takes splits rho,
// rho + R, ... (float4 loads, several in flight), then the R partial sums
// are added in a fixed order.
// Grid: (num_heads, batch); block: kReduceThreads.
// Parameters (DecodeParams p):
//   context_lens  [batch] (the sequence's split count, as the decode kernel's)
//   part_o        [batch][num_heads][max_splits][D] f32 (the decode kernel's)
//   part_lse      [batch][num_heads][max_splits] f32, log2 domain
//   v_scale       [1] or [num_kv_heads] (fp8 caches; null for bf16)
//   out           [batch][num_heads][D], f32 or bf16 (out_bf16); sequences
//                 of one split are left alone (the decode kernel wrote them)
// The context length is read before griddepcontrol.wait (a step input), and
// each thread's first PRE splits (log-sum-exp and float4 of partials) are
// loaded together with the log-sum-exps of the maximum, so the kernel waits
// on one round trip to the partials instead of three.
template <int D>
__global__ void __launch_bounds__(kReduceThreads) decode_reduce_kernel(const DecodeParams p) {
  static_assert(kReduceThreads % (D / 4) == 0, "float4 columns");
  constexpr int TPS = D / 4, R = kReduceThreads / TPS;
  __shared__ __align__(16) float red[R][D];
  __shared__ float wsum[R], smax[kReduceThreads / 32];
  constexpr int PRE = 4;
  const int head = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, c0 = blockIdx.z * D;
  const int ctx = p.context_lens[b];
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the decode kernel's results are visible
  int first, tstart, nsplits;
  seq_range(p, ctx, first, tstart, nsplits);
  if (nsplits <= 1) return;
  const int64_t base = (static_cast<int64_t>(b) * p.num_heads + head) * p.max_splits;
  const int rho = tid / TPS, col = tid % TPS;
  float pre_lse[PRE];
  float4 pre_o[PRE];
#pragma unroll
  for (int i = 0; i < PRE; ++i) {
    const int s = rho + i * R;
    pre_lse[i] = 0.0f;
    pre_o[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (s < nsplits) {
      pre_lse[i] = p.part_lse[base + s];
      pre_o[i] = *reinterpret_cast<const float4*>(p.part_o + (base + s) * D + c0 + col * 4);
    }
  }
  float M = -INFINITY;
  for (int s = tid; s < nsplits; s += kReduceThreads) M = fmaxf(M, p.part_lse[base + s]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if ((tid & 31) == 0) smax[tid >> 5] = M;
  __syncthreads();
  M = smax[0];
#pragma unroll
  for (int w = 1; w < kReduceThreads / 32; ++w) M = fmaxf(M, smax[w]);
  const float Mref = M == -INFINITY ? 0.0f : M;
  float W = 0.0f;
  float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < PRE; ++i) {
    if (rho + i * R < nsplits) {
      const float w = exp2f(pre_lse[i] - Mref);
      const float4 v = pre_o[i];
      W += w;
      O.x += w * v.x; O.y += w * v.y; O.z += w * v.z; O.w += w * v.w;
    }
  }
#pragma unroll 4
  for (int s = rho + PRE * R; s < nsplits; s += R) {
    const float w = exp2f(p.part_lse[base + s] - Mref);
    const float4 v = *reinterpret_cast<const float4*>(p.part_o + (base + s) * D + c0 + col * 4);
    W += w;
    O.x += w * v.x; O.y += w * v.y; O.z += w * v.z; O.w += w * v.w;
  }
  *reinterpret_cast<float4*>(&red[rho][col * 4]) = O;
  if (col == 0) wsum[rho] = W;
  __syncthreads();
  const int kvh = head / p.group;
  const float vs = p.v_scale == nullptr ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  for (int d = tid; d < D; d += kReduceThreads) {
    float Wt = 0.0f, Ot = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      Wt += wsum[i];
      Ot += red[i][d];
    }
    store_act(p.out, (static_cast<int64_t>(b) * p.num_heads + head) * D + c0 + d, Wt > 0.0f ? Ot / Wt * vs : 0.0f,
              p.out_bf16);
  }
}

template <int D>
void launch_reduce(const DecodeParams& p, int batch, cudaStream_t stream) {
  // Programmatic dependent launch: the reduce grid is set up while the
  // decode grid drains (the decode kernel's griddepcontrol.launch_dependents);
  // griddepcontrol.wait in it orders the reads.
  FP8KV_CUDA_CHECK(launch_maybe_pdl(true, decode_reduce_kernel<D>, dim3(p.num_heads, batch, 1),
                                    dim3(kReduceThreads), 0, stream, p));
}

}  // namespace

void launch_decode_reduce(const DecodeParams& p, int head_dim, int batch, cudaStream_t stream) {
  switch (head_dim) {
    case 64: launch_reduce<64>(p, batch, stream); break;
    case 128: launch_reduce<128>(p, batch, stream); break;
    case 256: launch_reduce<256>(p, batch, stream); break;
    default: throw std::invalid_argument("decode reduce: head_dim " + std::to_string(head_dim));
  }
}

}  // namespace fp8kv::cuda::decode
