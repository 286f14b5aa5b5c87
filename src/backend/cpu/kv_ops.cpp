#include "backend/cpu/kv_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace fp8kv {

float load_cache_elem(const KvCacheLayout& layout, const void* cache, int64_t off) {
  if (layout.dtype == KvDtype::bf16) return bf16_to_f32(static_cast<const uint16_t*>(cache)[off]);
  return kv_byte_to_f32(static_cast<const uint8_t*>(cache)[off], layout.dtype);
}

namespace {

// pth_scale: the per-token-head scale array (per-token-head dtypes only).
// Returns the elements that saturated (per-tensor-scaled fp8 only; 0 for the
// others, see kv_ops.h): y = x / s is computed once and both quantized and
// tested, so the stored bytes are those of the plain conversion.
uint64_t store_one(const KvCacheLayout& L, void* cache, const float* x, int64_t slot, ScaleRef scale,
                   float* pth_scale) {
  const float max_finite = kv_dtype_elem_max(L.dtype);
  uint64_t clipped = 0;
  for (int h = 0; h < L.num_kv_heads; ++h) {
    const int64_t off = L.slot_offset(slot, h);
    const float* src = x + static_cast<int64_t>(h) * L.head_dim;
    if (L.dtype == KvDtype::bf16) {
      uint16_t* dst = static_cast<uint16_t*>(cache) + off;
      for (int d = 0; d < L.head_dim; ++d) dst[d] = f32_to_bf16(src[d]);
    } else {
      uint8_t* dst = static_cast<uint8_t*>(cache) + off;
      float s;
      if (kv_dtype_per_token_head(L.dtype)) {
        s = per_token_head_scale({src, static_cast<size_t>(L.head_dim)}, L.dtype);
        pth_scale[L.scale_offset(slot, h)] = s;
      } else {
        s = scale.at(h);
      }
      if (L.dtype == KvDtype::fp8_e5m2) {
        for (int d = 0; d < L.head_dim; ++d) {
          const float y = src[d] / s;
          dst[d] = f32_to_e5m2(y);
          clipped += std::fabs(y) > max_finite;
        }
      } else if (L.dtype == KvDtype::int8_pth) {
        for (int d = 0; d < L.head_dim; ++d) dst[d] = f32_to_int8_sat(src[d] / s);
      } else if (L.dtype == KvDtype::fp8_e4m3) {
        for (int d = 0; d < L.head_dim; ++d) {
          const float y = src[d] / s;
          dst[d] = f32_to_e4m3(y);
          clipped += std::fabs(y) > max_finite;
        }
      } else {  // fp8_e4m3_pth: the peak maps to the max finite, nothing clips
        for (int d = 0; d < L.head_dim; ++d) dst[d] = f32_to_e4m3(src[d] / s);
      }
    }
  }
  return clipped;
}

// Dequantizes (without scale) head_dim elements at offset into dst.
void load_row(const KvCacheLayout& L, const void* cache, int64_t off, float* dst, const float* table) {
  if (L.dtype == KvDtype::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(cache) + off;
    for (int d = 0; d < L.head_dim; ++d) dst[d] = bf16_to_f32(src[d]);
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(cache) + off;
    for (int d = 0; d < L.head_dim; ++d) dst[d] = table[src[d]];
  }
}

}  // namespace

void store_kv_cpu(const KvCacheLayout& L, void* k_cache, void* v_cache, const float* k, const float* v,
                  const int64_t* slot_mapping, int num_tokens, ScaleRef k_scale, ScaleRef v_scale, float* k_scale_pth,
                  float* v_scale_pth, KvClipCounts* clips) {
  if (kv_dtype_per_token_head(L.dtype) && (!k_scale_pth || !v_scale_pth))
    throw std::invalid_argument("store_kv_cpu: a per-token-head cache needs its k/v scale arrays");
  const int64_t stride = L.token_stride();
  const int64_t capacity = static_cast<int64_t>(L.num_blocks) * L.block_size;
  KvClipCounts local;  // one update of *clips per call, not per element
  for (int t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    if (slot >= capacity) throw std::out_of_range("store_kv_cpu: slot beyond the cache");
    local.k += store_one(L, k_cache, k + t * stride, slot, k_scale, k_scale_pth);
    local.v += store_one(L, v_cache, v + t * stride, slot, v_scale, v_scale_pth);
    local.stored += static_cast<uint64_t>(L.num_kv_heads) * static_cast<uint64_t>(L.head_dim);
  }
  if (clips) *clips += local;
}

void paged_attention_cpu(const PagedAttentionArgs& a, const float* q, const int32_t* q_pos, int num_q,
                         int num_heads, float* out) {
  const KvCacheLayout& L = a.layout;
  const int D = L.head_dim, Hkv = L.num_kv_heads;
  if (num_heads % Hkv != 0) throw std::invalid_argument("paged_attention_cpu: num_heads not a multiple of num_kv_heads");
  const int group = num_heads / Hkv;
  const bool pth = kv_dtype_per_token_head(L.dtype);
  const bool tensor_scaled = kv_dtype_per_tensor_scaled(L.dtype);  // k_scale / v_scale apply
  if (pth && (!a.k_scale_pth || !a.v_scale_pth))
    throw std::invalid_argument("paged_attention_cpu: a per-token-head cache needs its k/v scale arrays");
  if (num_q == 0) return;
  float table[256];
  if (L.dtype != KvDtype::bf16) for (int i = 0; i < 256; ++i) table[i] = kv_byte_to_f32(static_cast<uint8_t>(i), L.dtype);

  // Range of keys any query can see.
  int lo = a.context_len, hi = 0;
  for (int i = 0; i < num_q; ++i) {
    const int p = q_pos[i];
    const int first = a.window > 0 ? std::max(0, p - a.window + 1) : 0;
    lo = std::min(lo, first);
    hi = std::max(hi, std::min(p + 1, a.context_len));
  }
  if (hi <= lo) {  // no visible keys: output zeros
    std::fill(out, out + static_cast<int64_t>(num_q) * num_heads * D, 0.0f);
    return;
  }
  const int nk = hi - lo;

  parallel_for(Hkv, 1, [&](int64_t kvh_begin, int64_t kvh_end) {
  for (int kvh = static_cast<int>(kvh_begin); kvh < kvh_end; ++kvh) {
    // Gather this head's keys and values once (dequantized, unscaled).
    // Per-token-head: each key's K and V scale (1 otherwise).
    std::vector<float> K(static_cast<size_t>(nk) * D), V(static_cast<size_t>(nk) * D), KS(nk, 1.0f), VS(nk, 1.0f);
    for (int j = lo; j < hi; ++j) {
      const int32_t phys = a.block_table[j / L.block_size];
      const int64_t slot = static_cast<int64_t>(phys) * L.block_size + j % L.block_size;
      const int64_t off = L.slot_offset(slot, kvh);
      load_row(L, a.k_cache, off, &K[static_cast<size_t>(j - lo) * D], table);
      load_row(L, a.v_cache, off, &V[static_cast<size_t>(j - lo) * D], table);
      if (pth) {
        KS[j - lo] = a.k_scale_pth[L.scale_offset(slot, kvh)];
        VS[j - lo] = a.v_scale_pth[L.scale_offset(slot, kvh)];
      }
    }
    const float ks = tensor_scaled ? a.k_scale.at(kvh) : 1.0f;
    const float vs = tensor_scaled ? a.v_scale.at(kvh) : 1.0f;
    std::vector<float> scores(nk), qbuf(D), acc(D);
    for (int i = 0; i < num_q; ++i) {
      const int p = q_pos[i];
      const int first = a.window > 0 ? std::max(0, p - a.window + 1) : 0;
      const int last = std::min(p, a.context_len - 1);
      for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        const float* qi = q + (static_cast<int64_t>(i) * num_heads + h) * D;
        float* o = out + (static_cast<int64_t>(i) * num_heads + h) * D;
        float scale = a.softmax_scale * ks;
        if (a.quantize_q && tensor_scaled) {
          const float qs = a.q_scale.at(h);
          for (int d = 0; d < D; ++d) qbuf[d] = fp8_to_f32(f32_to_fp8(qi[d] / qs, L.dtype), L.dtype);
          scale *= qs;
        } else {
          std::memcpy(qbuf.data(), qi, sizeof(float) * D);
        }
        if (last < first) { std::fill(o, o + D, 0.0f); continue; }
        float m = -INFINITY;
        for (int j = first; j <= last; ++j) {
          const float* kj = &K[static_cast<size_t>(j - lo) * D];
          float s = 0.0f;
          for (int d = 0; d < D; ++d) s += qbuf[d] * kj[d];
          if (pth) s = s * KS[j - lo] * scale;  // dot * ks_j * softmax_scale
          else s *= scale;
          if (a.logit_softcap > 0.0f) s = a.logit_softcap * std::tanh(s / a.logit_softcap);
          scores[j - first] = s;
          m = std::max(m, s);
        }
        float denom = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = first; j <= last; ++j) {
          const float pj = std::exp(scores[j - first] - m);
          denom += pj;
          const float pv = pth ? pj * VS[j - lo] : pj;  // the V scale folds into p for P.V only
          const float* vj = &V[static_cast<size_t>(j - lo) * D];
          for (int d = 0; d < D; ++d) acc[d] += pv * vj[d];
        }
        const float f = vs / denom;
        for (int d = 0; d < D; ++d) o[d] = acc[d] * f;
      }
    }
  }
  });
}

}  // namespace fp8kv
