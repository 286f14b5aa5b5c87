// Helpers for the CUDA tests: device buffers, GPU presence, random paged-cache
// scenarios built through both store paths (CPU reference and CUDA kernel).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kv_ops.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/ops/ops.h"
#include "pth_bound.h"

namespace fp8kv::cudatest {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define FP8KV_REQUIRE_GPU() \
  if (!::fp8kv::cudatest::have_gpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)"

// The backend's owning device buffer (cuda/ops/ops.h) with typed host
// copies for the tests.
class DevBuf : public cuda::DeviceBuffer {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : DeviceBuffer(bytes) {}
  template <class T>
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size() * sizeof(T)) { upload(h); }
  template <class T>
  void upload(const std::vector<T>& h) {
    DeviceBuffer::upload(h.data(), h.size() * sizeof(T));
  }
  // After every kernel queued so far on the device.
  template <class T>
  std::vector<T> download() const {
    std::vector<T> h(bytes() / sizeof(T));
    check(cudaDeviceSynchronize(), "sync before download");
    DeviceBuffer::download(h.data(), h.size() * sizeof(T));
    return h;
  }
  void fill(uint8_t byte) { check(cudaMemset(get(), byte, bytes()), "memset"); }
};

// Fresh seed every run (printed so a failure can be replayed via FP8KV_SEED).
inline uint64_t test_seed() {
  if (const char* s = std::getenv("FP8KV_SEED")) return std::stoull(s);
  return std::random_device{}();
}

// A generator seeded with test_seed(), the seed printed.
inline std::mt19937_64 seeded_rng() {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

enum class ScaleMode { unity, per_tensor, per_head };

// K/V inputs on the device: f32, or (bf16_in) their bf16 bits (bf16-exact values).
inline void upload_inputs(const std::vector<float>& k, const std::vector<float>& v, bool bf16_in, DevBuf& dk,
                          DevBuf& dv) {
  if (bf16_in) {
    std::vector<uint16_t> kb(k.size()), vb(v.size());
    for (size_t i = 0; i < k.size(); ++i) { kb[i] = f32_to_bf16(k[i]); vb[i] = f32_to_bf16(v[i]); }
    dk = DevBuf(kb);
    dv = DevBuf(vb);
  } else {
    dk = DevBuf(k);
    dv = DevBuf(v);
  }
}

// A store batch's slots: T distinct random slots of the layout, every 7th
// token skipped (-1).
inline std::vector<int64_t> random_slots(std::mt19937_64& rng, const KvCacheLayout& L, int T) {
  std::vector<int64_t> all(static_cast<size_t>(L.num_blocks) * L.block_size), slots(T);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  for (int t = 0; t < T; ++t) slots[t] = t % 7 == 3 ? -1 : all[t];
  return slots;
}

// A paged cache holding `ctx[b]` tokens for each sequence, stored through
// store_kv_cpu and through the CUDA store (bytes compared by the caller via
// store_matches). Unwritten slots hold NaN codes.
struct Scenario {
  KvCacheLayout L;
  std::vector<int> ctx;
  int max_blocks = 0;
  std::vector<int32_t> block_tables;  // [batch][max_blocks], -1 beyond the sequence
  std::vector<float> k_scale, v_scale;
  std::vector<uint8_t> k_cache, v_cache;          // host copy (CPU store)
  std::vector<uint8_t> k_cache_gpu, v_cache_gpu;  // what the CUDA store wrote
  // Per-token-head dtypes: [num_blocks][block_size][num_kv_heads] scales (CPU
  // store; what the CUDA store wrote); unwritten slots hold NaN. Empty otherwise.
  std::vector<float> k_pth, v_pth, k_pth_gpu, v_pth_gpu;
  DevBuf dk, dv, dbt, dctx, dks, dvs, dkp, dvp;
  int64_t max_abs_v = 0;

  int batch() const { return static_cast<int>(ctx.size()); }
  bool pth() const { return kv_dtype_per_token_head(L.dtype); }
  // The CUDA store wrote the CPU store's bytes: caches and (bitwise) scales.
  bool store_matches() const {
    return k_cache_gpu == k_cache && v_cache_gpu == v_cache && k_pth.size() == k_pth_gpu.size() &&
           std::memcmp(k_pth.data(), k_pth_gpu.data(), k_pth.size() * 4) == 0 &&
           std::memcmp(v_pth.data(), v_pth_gpu.data(), v_pth.size() * 4) == 0;
  }
  ScaleRef kref() const { return ScaleRef{k_scale.data(), static_cast<int>(k_scale.size())}; }
  ScaleRef vref() const { return ScaleRef{v_scale.data(), static_cast<int>(v_scale.size())}; }
  cuda::PagedKv paged() const {
    cuda::PagedKv p;
    p.layout = L;
    p.k_cache = dk.get();
    p.v_cache = dv.get();
    p.block_tables = dbt.as<int32_t>();
    p.max_blocks_per_seq = max_blocks;
    p.context_lens = dctx.as<int32_t>();
    p.k_scale = {dks.as<float>(), static_cast<int>(k_scale.size())};
    p.v_scale = {dvs.as<float>(), static_cast<int>(v_scale.size())};
    p.k_scale_pth = dkp.as<float>();
    p.v_scale_pth = dvp.as<float>();
    return p;
  }
  PagedAttentionArgs cpu_args(int b) const {
    PagedAttentionArgs a;
    a.layout = L;
    a.k_cache = k_cache.data();
    a.v_cache = v_cache.data();
    a.block_table = block_tables.data() + static_cast<size_t>(b) * max_blocks;
    a.context_len = ctx[b];
    a.k_scale = kref();
    a.v_scale = vref();
    a.k_scale_pth = pth() ? k_pth.data() : nullptr;
    a.v_scale_pth = pth() ? v_pth.data() : nullptr;
    return a;
  }
};

inline uint16_t nan_code(KvDtype d) { return d == KvDtype::bf16 ? 0x7fc0 : 0x7f7f; }

inline Scenario make_scenario(std::mt19937_64& rng, int head_dim, int num_kv_heads, int block_size, KvDtype dtype,
                              ScaleMode mode, const std::vector<int>& ctx, bool bf16_input = false) {
  Scenario s;
  s.ctx = ctx;
  s.L.block_size = block_size;
  s.L.num_kv_heads = num_kv_heads;
  s.L.head_dim = head_dim;
  s.L.dtype = dtype;
  int total_blocks = 0;
  for (int c : ctx) {
    const int nb = (c + block_size - 1) / block_size;
    s.max_blocks = std::max(s.max_blocks, nb);
    total_blocks += nb;
  }
  s.L.num_blocks = total_blocks + 3;  // spare blocks stay NaN
  std::vector<int32_t> perm(s.L.num_blocks);
  for (int i = 0; i < s.L.num_blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  s.block_tables.assign(static_cast<size_t>(ctx.size()) * std::max(1, s.max_blocks), -1);
  s.max_blocks = std::max(1, s.max_blocks);
  int next = 0;
  std::vector<int64_t> slots;
  for (size_t b = 0; b < ctx.size(); ++b) {
    const int nb = (ctx[b] + block_size - 1) / block_size;
    for (int i = 0; i < nb; ++i) s.block_tables[b * s.max_blocks + i] = perm[next++];
    for (int j = 0; j < ctx[b]; ++j)
      slots.push_back(static_cast<int64_t>(s.block_tables[b * s.max_blocks + j / block_size]) * block_size + j % block_size);
  }
  // A few skipped tokens (slot -1) in the store batch.
  const int T = static_cast<int>(slots.size());
  std::vector<int64_t> slots_store = slots;
  const int extra = 3;
  for (int i = 0; i < extra; ++i) slots_store.push_back(-1);
  const int TS = T + extra;
  const int64_t row = static_cast<int64_t>(num_kv_heads) * head_dim;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  std::vector<float> head_amp_k(num_kv_heads), head_amp_v(num_kv_heads);
  for (int h = 0; h < num_kv_heads; ++h) { head_amp_k[h] = 2.0f * ud(rng); head_amp_v[h] = ud(rng); }
  std::vector<float> k(TS * row), v(TS * row);
  for (int64_t i = 0; i < TS * row; ++i) {
    const int h = static_cast<int>((i % row) / head_dim);
    k[i] = nd(rng) * head_amp_k[h];
    v[i] = nd(rng) * head_amp_v[h];
  }
  if (bf16_input) {
    for (auto& x : k) x = round_bf16(x);
    for (auto& x : v) x = round_bf16(x);
  }
  // Scales: unity, per tensor (amax / fmt_max * 0.8: the largest values saturate), per head.
  const float fmax = kv_dtype_max(dtype);
  auto amax_of = [&](const std::vector<float>& x, int head) {
    float m = 0.0f;
    for (int64_t i = 0; i < TS * row; ++i)
      if (head < 0 || (i % row) / head_dim == head) m = std::max(m, std::fabs(x[i]));
    return m;
  };
  if (mode == ScaleMode::unity || !kv_dtype_per_tensor_scaled(dtype)) {
    s.k_scale = {1.0f};
    s.v_scale = {1.0f};
  } else if (mode == ScaleMode::per_tensor) {
    s.k_scale = {amax_of(k, -1) / fmax * 0.8f};
    s.v_scale = {amax_of(v, -1) / fmax * 0.8f};
  } else {
    for (int h = 0; h < num_kv_heads; ++h) {
      s.k_scale.push_back(amax_of(k, h) / fmax * 0.8f * ud(rng));
      s.v_scale.push_back(amax_of(v, h) / fmax * 0.8f * ud(rng));
    }
  }
  const size_t cache_bytes = s.L.cache_bytes();
  s.k_cache.resize(cache_bytes);
  s.v_cache.resize(cache_bytes);
  const uint16_t nc = nan_code(dtype);
  for (size_t i = 0; i < cache_bytes; i += 2) {
    std::memcpy(&s.k_cache[i], &nc, 2);
    std::memcpy(&s.v_cache[i], &nc, 2);
  }
  if (kv_dtype_per_token_head(dtype)) {
    const size_t ns = static_cast<size_t>(s.L.num_blocks) * block_size * num_kv_heads;
    s.k_pth.assign(ns, NAN);
    s.v_pth.assign(ns, NAN);
    s.dkp = DevBuf(s.k_pth);
    s.dvp = DevBuf(s.v_pth);
  }
  store_kv_cpu(s.L, s.k_cache.data(), s.v_cache.data(), k.data(), v.data(), slots_store.data(), TS, s.kref(), s.vref(),
               s.pth() ? s.k_pth.data() : nullptr, s.pth() ? s.v_pth.data() : nullptr);

  // CUDA store into a NaN-filled cache.
  s.dk = DevBuf(s.k_cache.size());
  s.dv = DevBuf(s.v_cache.size());
  std::vector<uint8_t> nanfill(cache_bytes);
  for (size_t i = 0; i < cache_bytes; i += 2) std::memcpy(&nanfill[i], &nc, 2);
  s.dk.upload(nanfill);
  s.dv.upload(nanfill);
  s.dks = DevBuf(s.k_scale);
  s.dvs = DevBuf(s.v_scale);
  DevBuf dslots(slots_store);
  DevBuf din_k, din_v;
  upload_inputs(k, v, bf16_input, din_k, din_v);
  cuda::StoreKvArgs sa;
  sa.layout = s.L;
  sa.k_cache = s.dk.get();
  sa.v_cache = s.dv.get();
  sa.k = din_k.get();
  sa.v = din_v.get();
  sa.input_dtype = bf16_input ? cuda::ActDtype::bf16 : cuda::ActDtype::f32;
  sa.slot_mapping = dslots.as<int64_t>();
  sa.num_tokens = TS;
  sa.k_scale = {s.dks.as<float>(), static_cast<int>(s.k_scale.size())};
  sa.v_scale = {s.dvs.as<float>(), static_cast<int>(s.v_scale.size())};
  sa.k_scale_pth = s.dkp.as<float>();
  sa.v_scale_pth = s.dvp.as<float>();
  cuda::store_kv(sa, nullptr);
  s.k_cache_gpu = s.dk.download<uint8_t>();
  s.v_cache_gpu = s.dv.download<uint8_t>();
  // Attention tests read the CPU store's bytes (identical when the store test passes).
  s.dk.upload(s.k_cache);
  s.dv.upload(s.v_cache);
  if (s.pth()) {
    s.k_pth_gpu = s.dkp.download<float>();
    s.v_pth_gpu = s.dvp.download<float>();
    s.dkp.upload(s.k_pth);
    s.dvp.upload(s.v_pth);
  }
  s.dbt = DevBuf(s.block_tables);
  std::vector<int32_t> c32(ctx.begin(), ctx.end());
  s.dctx = DevBuf(c32);
  return s;
}

// Elementwise bound for GPU attention vs the fp32 CPU reference, derived in
// docs/cuda.md: |dO| <= v_scale * Vmax * (u_p + exp(2 * u_q * Smax) - 1) + 1e-5 * Vmax * v_scale
// u_q, u_p: unit roundoff of the MMA operand type (f16 2^-11 for fp8 caches,
// bf16 2^-8 for bf16 caches); Smax = max_j scale * sum_d |q_d| |k_jd| over the
// visible keys; Vmax = max |v| over the visible keys (stored values, unscaled).
struct Bound {
  double tol = 0;
};
inline double operand_roundoff(KvDtype d) { return d == KvDtype::bf16 ? 1.0 / 256 : 1.0 / 2048; }

// Per-token-head dtypes: pth_attention_bound over the visible keys [first, last].
inline double attention_bound_pth(const Scenario& s, int b, const float* q_head, int kv_head, int first, int last,
                                  float softmax_scale, float softcap) {
  const KvCacheLayout& L = s.L;
  return pth_attention_bound(
      last - first + 1, L.head_dim, q_head, softmax_scale, softcap, operand_roundoff(L.dtype),
      [&](int i, float* kq, float* vq, float& ks, float& vs) {
        const int j = first + i;
        const int64_t slot =
            static_cast<int64_t>(s.block_tables[b * s.max_blocks + j / L.block_size]) * L.block_size +
            j % L.block_size;
        const int64_t off = L.slot_offset(slot, kv_head);
        for (int d = 0; d < L.head_dim; ++d) {
          kq[d] = load_cache_elem(L, s.k_cache.data(), off + d);
          vq[d] = load_cache_elem(L, s.v_cache.data(), off + d);
        }
        ks = s.k_pth[L.scale_offset(slot, kv_head)];
        vs = s.v_pth[L.scale_offset(slot, kv_head)];
      });
}

inline double attention_bound(const Scenario& s, int b, const float* q_head, int kv_head, int qpos, int window,
                              float softmax_scale, float softcap = 0.0f) {
  const KvCacheLayout& L = s.L;
  const int D = L.head_dim;
  const int first = window > 0 ? std::max(0, qpos - window + 1) : 0;
  const int last = std::min(qpos, s.ctx[b] - 1);
  if (s.pth()) return attention_bound_pth(s, b, q_head, kv_head, first, last, softmax_scale, softcap);
  const bool fp8 = kv_dtype_is_fp8(L.dtype);
  const float ks = fp8 ? s.kref().at(kv_head) : 1.0f, vs = fp8 ? s.vref().at(kv_head) : 1.0f;
  double smax = 0, vmax = 0;
  for (int j = first; j <= last; ++j) {
    const int64_t slot = static_cast<int64_t>(s.block_tables[b * s.max_blocks + j / L.block_size]) * L.block_size +
                         j % L.block_size;
    const int64_t off = L.slot_offset(slot, kv_head);
    double a = 0;
    for (int d = 0; d < D; ++d) {
      a += std::fabs(q_head[d]) * std::fabs(load_cache_elem(L, s.k_cache.data(), off + d));
      vmax = std::max<double>(vmax, std::fabs(load_cache_elem(L, s.v_cache.data(), off + d)));
    }
    smax = std::max(smax, a * softmax_scale * ks);
  }
  const double u = operand_roundoff(L.dtype);
  return vs * vmax * (u + std::expm1(2.0 * u * smax) + 1e-5) + 1e-6;
}

}  // namespace fp8kv::cudatest
