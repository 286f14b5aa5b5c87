// Saturation counts of the KV store (docs/robustness.md "KV clipping"): how
// many K and V elements were stored as the fp8 format's +-max because
// |x / scale| was beyond it. Per layer, summed over the calls (and ranks).
#pragma once
#include <cstdint>

namespace fp8kv {

struct KvClipCounts {
  uint64_t k = 0, v = 0;  // elements that saturated, per stream
  uint64_t stored = 0;    // elements stored, per stream (tokens x KV heads x head_dim)
  KvClipCounts& operator+=(const KvClipCounts& o) {
    k += o.k;
    v += o.v;
    stored += o.stored;
    return *this;
  }
};

}  // namespace fp8kv
