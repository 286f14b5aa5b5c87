// GPU sampling (ops.h sample_rows): one block per row.
//
// Method: every thread owns a contiguous chunk of ids, so "ties -> lower ids"
// is a block prefix count. The top-k cut and the top-p cut are each found by
// a radix select over a monotone 32-bit key of the logit (4 passes of a
// 256-bin histogram): the largest key kappa whose cumulative weight (count
// for top-k, probability mass for top-p), counted from the top, reaches the
// target. The kept set is then {key > kappa} plus the first r ids with
// key == kappa. Probability masses are exp((x - max) / t) in 2^-40 fixed point
// (the max has mass 2^40), summed as 64-bit integers: the result does not
// depend on the order of atomics, so a (seed, counter) always draws the same
// token from the same logits.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdexcept>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/argmax.cuh"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

namespace {

constexpr int kThreads = 512;
using u64 = unsigned long long;

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__host__ __device__ inline double uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t r = splitmix64(seed ^ splitmix64(counter));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

// Larger float -> larger key (NaN excluded by the caller).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The kept set: key > kappa, or key == kappa and among the first r such ids.
struct Cut {
  uint32_t kappa = 0;  // 0: every non-NaN logit (all their keys are > 0)
  int r = 0;
};

__global__ void sample_kernel(const float* __restrict__ logits, int V, const SampleParams* __restrict__ params,
                              int32_t* __restrict__ out) {
  using IntScan = cub::BlockScan<int, kThreads>;
  using U64Scan = cub::BlockScan<u64, kThreads>;
  using U64Reduce = cub::BlockReduce<u64, kThreads>;
  __shared__ union {
    ArgMaxTemp<kThreads> am;
    typename IntScan::TempStorage is;
    typename U64Scan::TempStorage us;
    typename U64Reduce::TempStorage ur;
  } tmp;
  __shared__ u64 hist[256];
  __shared__ ArgMax best_s;
  __shared__ int flag_s;
  __shared__ uint32_t sel_s;
  __shared__ u64 above_s, total_s;

  const int row = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * V;
  const SampleParams p = params[row];
  const int chunk = (V + kThreads - 1) / kThreads;
  const int beg = min(V, static_cast<int>(threadIdx.x) * chunk), end = min(V, beg + chunk);

  // 1. max (ties -> lowest id) and NaN check. The (value, lowest id) max and
  // the NaN flag do not depend on which thread sees which id, so this pass
  // reads the row coalesced and 16 bytes at a time (thread j: float4s j,
  // j + kThreads, ...) instead of by the chunks below (docs/cuda_backend.md
  // "Batch-1 step": one block streams the row; same result bitwise).
  ArgMax best{-INFINITY, V};
  int nan = 0;
  auto see = [&](float v, int i) {
    if (v != v) nan = 1;
    else if (v > best.v || (v == best.v && i < best.i)) best = ArgMax{v, i};
  };
  if ((reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    const int V4 = V / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
    for (int j = threadIdx.x; j < V4; j += kThreads) {
      const float4 q = x4[j];
      see(q.x, 4 * j);
      see(q.y, 4 * j + 1);
      see(q.z, 4 * j + 2);
      see(q.w, 4 * j + 3);
    }
    for (int i = 4 * V4 + threadIdx.x; i < V; i += kThreads) see(x[i], i);
  } else {
    for (int i = threadIdx.x; i < V; i += kThreads) see(x[i], i);
  }
  block_argmax<kThreads>(best, nan, tmp.am, best_s, flag_s);
  const float m = best_s.v;
  if (flag_s || m == -INFINITY) {  // NaN, or no finite logit
    if (threadIdx.x == 0) out[row] = -1;
    return;
  }
  if (p.temperature <= 0.0f || p.top_k == 1 || m == INFINITY) {
    if (threadIdx.x == 0) out[row] = best_s.i;
    return;
  }
  const float t = p.temperature;
  auto mass = [&](float v) -> u64 { return __float2ull_rz(expf(__fdiv_rn(v - m, t)) * 0x1.0p40f); };

  Cut cut;
  int eq_prefix = 0;  // ids with key == cut.kappa in earlier chunks
  // Calls f(i, v, key) for every kept id of this thread's chunk, in id order.
  auto walk = [&](auto&& f) {
    int eq = eq_prefix;
    for (int i = beg; i < end; ++i) {
      const float v = x[i];
      const uint32_t key = order_key(v);
      const bool keep = key > cut.kappa || (key == cut.kappa && eq++ < cut.r);
      if (keep) f(i, v, key);
    }
  };
  auto refresh_eq_prefix = [&]() {
    int n = 0;
    for (int i = beg; i < end; ++i) n += order_key(x[i]) == cut.kappa;
    __syncthreads();
    IntScan(tmp.is).ExclusiveSum(n, eq_prefix);
    __syncthreads();
  };
  auto block_sum = [&](u64 v) {
    __syncthreads();
    const u64 s = U64Reduce(tmp.ur).Sum(v);
    if (threadIdx.x == 0) total_s = s;
    __syncthreads();
    return total_s;
  };
  // Radix select over the kept set: the largest key whose cumulative weight
  // from the top reaches target; returns it, with the weight strictly above.
  auto radix_select = [&](bool by_mass, u64 target, u64& weight_above) -> uint32_t {
    uint32_t prefix = 0, mask = 0;
    u64 above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      walk([&](int, float v, uint32_t key) {
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], by_mass ? mass(v) : u64{1});
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        u64 cum = above;
        uint32_t sel = 0;
        for (int bin = 255; bin >= 0; --bin) {
          if (cum + hist[bin] >= target) {
            sel = static_cast<uint32_t>(bin);
            break;
          }
          cum += hist[bin];
        }
        sel_s = sel;
        above_s = cum;
      }
      __syncthreads();
      prefix |= sel_s << shift;
      mask |= 255u << shift;
      above = above_s;
      __syncthreads();
    }
    weight_above = above;
    return prefix;
  };

  // 2. top-k.
  if (p.top_k > 0 && p.top_k < V) {
    u64 above = 0;
    const uint32_t kappa = radix_select(false, static_cast<u64>(p.top_k), above);
    cut.kappa = kappa;
    cut.r = p.top_k - static_cast<int>(above);
    refresh_eq_prefix();
  }
  // 3. top-p over the kept set.
  if (p.top_p < 1.0f) {
    u64 local = 0;
    walk([&](int, float v, uint32_t) { local += mass(v); });
    const u64 S = block_sum(local);
    const u64 target = static_cast<u64>(ceil(static_cast<double>(p.top_p) * static_cast<double>(S)));
    u64 above = 0;
    const uint32_t kappa = radix_select(true, target > 0 ? target : 1, above);
    const u64 p_eq = mass(key_value(kappa));
    const u64 need = target > above ? target - above : 0;
    const int n_eq = p_eq > 0 ? static_cast<int>((need + p_eq - 1) / p_eq) : 1;
    if (kappa > cut.kappa) {
      cut.kappa = kappa;
      cut.r = n_eq;
      refresh_eq_prefix();
    } else {
      cut.r = min(cut.r, n_eq);
    }
  }
  // 4. draw: u in [0, S) over the kept masses in id order.
  u64 local = 0;
  walk([&](int, float v, uint32_t) { local += mass(v); });
  __syncthreads();
  u64 before = 0, S = 0;
  U64Scan(tmp.us).ExclusiveSum(local, before, S);
  const double u01 = uniform01(p.seed, p.counter);
  u64 u = static_cast<u64>(u01 * static_cast<double>(S));
  if (u >= S) u = S - 1;
  if (before <= u && u < before + local) {
    u64 acc = before;
    int chosen = -1;
    walk([&](int i, float v, uint32_t) {
      if (chosen >= 0) return;
      acc += mass(v);
      if (u < acc) chosen = i;
    });
    out[row] = chosen;
  }
}

}  // namespace

double sample_uniform(uint64_t seed, uint64_t counter) { return uniform01(seed, counter); }

void sample_rows(const float* logits, int rows, int V, const SampleParams* params, int32_t* out_ids,
                 cudaStream_t stream) {
  if (rows == 0) return;
  if (!logits || !params || !out_ids || rows < 0 || V <= 0) throw std::invalid_argument("cuda::sample_rows: bad arguments");
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, V, params, out_ids);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
