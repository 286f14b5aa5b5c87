// Observer attached at the single store point of every layer (calibration,
// eval kvstats). It sees exactly the values about to be quantized into the KV
// cache: K after k_norm and RoPE, V as projected, Q after q_norm and RoPE.
// Arrays are host memory, fp32, [num_tokens][heads][head_dim], valid only
// during the call. The CPU backend passes its own buffers; a device backend
// passes host copies (calibration is offline, the copy is fine).
#pragma once

namespace fp8kv {

class StoreObserver {
 public:
  virtual ~StoreObserver() = default;
  virtual void observe(int layer, const float* q, int num_q_heads, const float* k, const float* v,
                       int num_kv_heads, int head_dim, int num_tokens) = 0;
};

}  // namespace fp8kv
