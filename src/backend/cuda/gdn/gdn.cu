// Gated DeltaNet kernels (gdn.h): simple, one thread per output column, the
// CPU reference's operation order (backend/cpu/gdn.cpp).
#include <cuda_bf16.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/gdn/gdn.h"

namespace fp8kv::cuda {

namespace {

__device__ __forceinline__ float silu_f(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float round_bf16_f(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// One thread per (sequence, channel): the channel's last K-1 inputs in
// registers, walked over the sequence's tokens.
__global__ void gdn_conv_kernel(GdnSeqs seqs, int64_t C, int K, const float* __restrict__ x,
                                const float* __restrict__ w, void* state, bool bf16, float* __restrict__ out) {
  const int s = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = seqs.q_start[s], n = seqs.q_start[s + 1] - r0;
  if (n <= 0) return;
  const int slot = seqs.slots[s];
  if (slot < 0) {
    for (int t = 0; t < n; ++t) out[(r0 + t) * C + c] = 0.0f;
    return;
  }
  const int P = K - 1;
  const bool fresh = seqs.context_lens[s] - n == 0;
  const int64_t base = (static_cast<int64_t>(slot) * C + c) * P;
  auto* s16 = static_cast<__nv_bfloat16*>(state);
  auto* s32 = static_cast<float*>(state);
  float win[kGdnMaxConvKernel], wc[kGdnMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kGdnMaxConvKernel; ++j) {
    win[j] = 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
  }
  if (!fresh) {
#pragma unroll
    for (int i = 0; i < kGdnMaxConvKernel - 1; ++i)
      if (i < P) win[i] = bf16 ? __bfloat162float(s16[base + i]) : s32[base + i];
  }
  for (int t = 0; t < n; ++t) {
    const float xi = x[(r0 + t) * C + c];
    // win[0..P-1]: the previous P inputs (oldest first); win[P]: this one.
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel; ++j)
      if (j == P) win[j] = bf16 ? round_bf16_f(xi) : xi;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel; ++j)
      if (j < K) acc = __fadd_rn(acc, __fmul_rn(wc[j], win[j]));
    out[(r0 + t) * C + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel - 1; ++j)
      if (j < P) win[j] = win[j + 1];
  }
#pragma unroll
  for (int i = 0; i < kGdnMaxConvKernel - 1; ++i)
    if (i < P) {
      if (bf16)
        s16[base + i] = __float2bfloat16_rn(win[i]);  // exact: win holds bf16 values
      else
        s32[base + i] = win[i];
    }
}

// One CTA per (value head, sequence); thread d owns column d of the head's
// state S [Dk][Dv] (shared memory), so every sum over Dk is one thread's
// sequential loop, in the CPU's order. Shared: S, then q and k of the token.
__global__ void gdn_rule_kernel(GdnSeqs seqs, GdnDims dm, const float* __restrict__ qkv, const float* __restrict__ a,
                                const float* __restrict__ b, const float* __restrict__ A_log,
                                const float* __restrict__ dt_bias, float* pool, float* __restrict__ out) {
  extern __shared__ float sm[];
  const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
  const int Hk = dm.num_k_heads, Hv = dm.num_v_heads, Dk = dm.k_head_dim, Dv = dm.v_head_dim;
  const int64_t KD = dm.key_dim(), VD = dm.value_dim(), C = dm.conv_dim();
  const int r0 = seqs.q_start[s], n = seqs.q_start[s + 1] - r0;
  if (n <= 0) return;
  const int slot = seqs.slots[s];
  const bool col = d < Dv;
  if (slot < 0) {
    if (col)
      for (int t = 0; t < n; ++t) out[(r0 + t) * VD + static_cast<int64_t>(h) * Dv + d] = 0.0f;
    return;
  }
  float* Ssh = sm;
  float* qs = sm + Dk * Dv;
  float* ks = qs + Dk;
  float* S = pool + (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv;
  const bool fresh = seqs.context_lens[s] - n == 0;
  if (col)
    for (int i = 0; i < Dk; ++i) Ssh[i * Dv + d] = fresh ? 0.0f : S[static_cast<int64_t>(i) * Dv + d];
  const int kh = h / (Hv / Hk);
  const float scale = __fdiv_rn(1.0f, sqrtf(static_cast<float>(Dk)));
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];
  for (int t = 0; t < n; ++t) {
    const int64_t r = r0 + t;
    const float* row = qkv + r * C;
    __syncthreads();  // the previous token's q, k are read
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qs[i] = row[static_cast<int64_t>(kh) * Dk + i];
      ks[i] = row[KD + static_cast<int64_t>(kh) * Dk + i];
    }
    __syncthreads();
    if (!col) continue;
    // l2norm_into: x / sqrt(sum x^2 + 1e-6), then * scale (q) or * 1 (k: exact).
    float ssq = 0.0f, ssk = 0.0f;
    for (int i = 0; i < Dk; ++i) {
      ssq = __fadd_rn(ssq, __fmul_rn(qs[i], qs[i]));
      ssk = __fadd_rn(ssk, __fmul_rn(ks[i], ks[i]));
    }
    const float invq = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ssq, 1e-6f)));
    const float invk = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ssk, 1e-6f)));
    // gdn_gates (torch's softplus, threshold 20).
    const float xg = __fadd_rn(a[r * Hv + h], dtb);
    const float sp = xg > 20.0f ? xg : log1pf(expf(xg));
    const float decay = expf(__fmul_rn(neg_A, sp));
    const float beta = sigmoid_f(b[r * Hv + h]);
    // S *= decay; mem = S^T k; delta = (v - mem) beta; S += k delta^T; o = S^T q.
    float mem = 0.0f;
    for (int i = 0; i < Dk; ++i) {
      const float sv = __fmul_rn(Ssh[i * Dv + d], decay);
      Ssh[i * Dv + d] = sv;
      mem = __fadd_rn(mem, __fmul_rn(sv, __fmul_rn(ks[i], invk)));
    }
    const float v = row[2 * KD + static_cast<int64_t>(h) * Dv + d];
    const float delta = __fmul_rn(__fsub_rn(v, mem), beta);
    float o = 0.0f;
    for (int i = 0; i < Dk; ++i) {
      const float sv = __fadd_rn(Ssh[i * Dv + d], __fmul_rn(__fmul_rn(ks[i], invk), delta));
      Ssh[i * Dv + d] = sv;
      o = __fadd_rn(o, __fmul_rn(sv, __fmul_rn(__fmul_rn(qs[i], invq), scale)));
    }
    out[r * VD + static_cast<int64_t>(h) * Dv + d] = o;
  }
  if (col)
    for (int i = 0; i < Dk; ++i) S[static_cast<int64_t>(i) * Dv + d] = Ssh[i * Dv + d];
}

// One CTA per (token, head) row: thread 0 sums the squares in order (the
// CPU's), then every thread scales its elements.
__global__ void gdn_gated_rmsnorm_kernel(const float* x, const float* __restrict__ z, int Dv,
                                         const float* __restrict__ w, float eps, float* y) {
  __shared__ float inv;
  const int64_t r = blockIdx.x;
  const float* xr = x + r * Dv;
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    for (int i = 0; i < Dv; ++i) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
    inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(Dv)), eps)));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
    const float xv = xr[i], zv = z[r * Dv + i];
    y[r * Dv + i] = __fmul_rn(__fmul_rn(w[i], __fmul_rn(xv, inv)), silu_f(zv));
  }
}

__global__ void split_q_gate_kernel(const float* __restrict__ qg, int64_t rows, int D, float* __restrict__ q,
                                    float* __restrict__ gate) {
  // rows = T * Hq; element i of row r.
  const int64_t n = rows * D;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = j / D, i = j % D;
    q[j] = qg[r * 2 * D + i];
    gate[j] = qg[r * 2 * D + D + i];
  }
}

__global__ void mul_sigmoid_kernel(float* x, const float* __restrict__ gate, int64_t n) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[j] = __fmul_rn(x[j], sigmoid_f(gate[j]));
}

unsigned grid_1d(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

void check_dims(const GdnDims& d, const char* op) {
  if (d.num_k_heads <= 0 || d.num_v_heads <= 0 || d.num_v_heads % d.num_k_heads != 0 || d.k_head_dim <= 0 ||
      d.v_head_dim <= 0 || d.conv_kernel < 1 || d.conv_kernel > kGdnMaxConvKernel)
    throw std::invalid_argument(std::string("cuda::") + op + ": bad Gated DeltaNet shape (Hk " +
                                std::to_string(d.num_k_heads) + ", Hv " + std::to_string(d.num_v_heads) + ", Dk " +
                                std::to_string(d.k_head_dim) + ", Dv " + std::to_string(d.v_head_dim) +
                                ", conv kernel " + std::to_string(d.conv_kernel) + ", at most " +
                                std::to_string(kGdnMaxConvKernel) + ")");
}

// The rule kernel's dynamic shared memory above 48 KB needs an opt-in per
// device; set once per device, outside any graph capture (the first call
// is the runner's eager warm-up).
void allow_rule_smem(size_t bytes) {
  static std::mutex mu;
  static size_t allowed[64] = {};
  int dev = 0;
  FP8KV_CU(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= 0 && dev < 64 && allowed[dev] >= bytes) return;
  FP8KV_CU(cudaFuncSetAttribute(gdn_rule_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(bytes)));
  if (dev >= 0 && dev < 64) allowed[dev] = bytes;
}

}  // namespace

void gdn_conv(const GdnDims& d, const GdnSeqs& seqs, const float* x, const float* w, void* conv_state,
              bool state_bf16, float* out, cudaStream_t stream) {
  check_dims(d, "gdn_conv");
  if (seqs.num_seqs <= 0) return;
  const int64_t C = d.conv_dim();
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(seqs.num_seqs));
  gdn_conv_kernel<<<grid, kThreads, 0, stream>>>(seqs, C, d.conv_kernel, x, w, conv_state, state_bf16, out);
  FP8KV_CU_LAUNCH();
}

void gdn_rule(const GdnDims& d, const GdnSeqs& seqs, const float* qkv, const float* a, const float* b,
              const float* A_log, const float* dt_bias, float* ssm_state, float* out, cudaStream_t stream) {
  check_dims(d, "gdn_rule");
  if (seqs.num_seqs <= 0) return;
  const size_t smem = (static_cast<size_t>(d.k_head_dim) * d.v_head_dim + 2 * static_cast<size_t>(d.k_head_dim)) *
                      sizeof(float);
  int dev = 0, max_smem = 0;
  FP8KV_CU(cudaGetDevice(&dev));
  FP8KV_CU(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > static_cast<size_t>(max_smem) || d.v_head_dim > 1024)
    throw std::invalid_argument("cuda::gdn_rule: a head's state (Dk " + std::to_string(d.k_head_dim) + " x Dv " +
                                std::to_string(d.v_head_dim) + " f32, " + std::to_string(smem) +
                                " bytes with q and k) does not fit in the " + std::to_string(max_smem) +
                                " bytes of shared memory of one block (or Dv > 1024)");
  if (smem > 48 * 1024) allow_rule_smem(smem);
  const int threads = (d.v_head_dim + 31) / 32 * 32;
  const dim3 grid(static_cast<unsigned>(d.num_v_heads), static_cast<unsigned>(seqs.num_seqs));
  gdn_rule_kernel<<<grid, threads, smem, stream>>>(seqs, d, qkv, a, b, A_log, dt_bias, ssm_state, out);
  FP8KV_CU_LAUNCH();
}

void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps,
                       float* y, cudaStream_t stream) {
  const int64_t rows = T * Hv;
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::invalid_argument("cuda::gdn_gated_rmsnorm: too many rows");
  const int threads = Dv >= 128 ? 128 : (Dv + 31) / 32 * 32;
  gdn_gated_rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, z, Dv, w, eps, y);
  FP8KV_CU_LAUNCH();
}

void split_q_gate(const float* qg, int64_t T, int Hq, int D, float* q, float* gate, cudaStream_t stream) {
  const int64_t n = T * Hq * D;
  if (n <= 0) return;
  split_q_gate_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(qg, T * Hq, D, q, gate);
  FP8KV_CU_LAUNCH();
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  mul_sigmoid_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(x, gate, n);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
