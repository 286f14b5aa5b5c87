#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "io/errors.h"

namespace fp8kv {

namespace {

double yarn_get_mscale(double scale, double mscale = 1.0) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(const RopeParams& p, int head_dim, int max_position_embeddings) {
  rot_dim_ = static_cast<int>(head_dim * p.partial_rotary_factor);
  rot_dim_ -= rot_dim_ % 2;
  if (rot_dim_ <= 0 || rot_dim_ > head_dim) throw InputError("rope: bad partial_rotary_factor");
  const int half = rot_dim_ / 2;
  const float base = static_cast<float>(p.theta);
  inv_freq_.resize(half);
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all fp32.
  std::vector<float> pos_freq(half);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim_);
    pos_freq[i] = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv_freq_[i] = 1.0f / pos_freq[i];
  }
  const float factor = static_cast<float>(p.factor);
  if (p.type == "default" || p.type == "dynamic") {
    // dynamic NTK only changes inv_freq beyond the original context.
  } else if (p.type == "linear") {
    // transformers divides inv_freq by the factor.
    for (auto& f : inv_freq_) f = f / factor;
  } else if (p.type == "llama3") {
    const double old_ctx = p.original_max_position_embeddings > 0 ? p.original_max_position_embeddings : 8192;
    const double low_wl = old_ctx / p.low_freq_factor;
    const double high_wl = old_ctx / p.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const float f = inv_freq_[i];
      const float wavelen = static_cast<float>(2.0 * M_PI) / f;
      float g = wavelen > static_cast<float>(low_wl) ? f / factor : f;
      const bool medium = !(wavelen < static_cast<float>(high_wl)) && !(wavelen > static_cast<float>(low_wl));
      if (medium) {
        const float smooth = (static_cast<float>(old_ctx) / wavelen - static_cast<float>(p.low_freq_factor)) /
                             static_cast<float>(p.high_freq_factor - p.low_freq_factor);
        g = (1.0f - smooth) * g / factor + smooth * g;
      }
      inv_freq_[i] = g;
    }
  } else if (p.type == "yarn") {
    const double orig =
        p.original_max_position_embeddings > 0 ? p.original_max_position_embeddings : max_position_embeddings;
    double af = yarn_get_mscale(p.factor);
    if (p.attention_factor) {
      af = *p.attention_factor;
    } else if (p.mscale && p.mscale_all_dim && *p.mscale != 0.0 && *p.mscale_all_dim != 0.0) {
      af = yarn_get_mscale(p.factor, *p.mscale) / yarn_get_mscale(p.factor, *p.mscale_all_dim);
    }
    attention_factor_ = static_cast<float>(af);
    double low = yarn_correction_dim(p.beta_fast, rot_dim_, p.theta, orig);
    double high = yarn_correction_dim(p.beta_slow, rot_dim_, p.theta, orig);
    if (p.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(rot_dim_ - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low),
                                    0.0f, 1.0f);
      const float extra_factor = 1.0f - ramp;
      const float interp = 1.0f / (factor * pos_freq[i]);
      const float extra = 1.0f / pos_freq[i];
      inv_freq_[i] = interp * (1.0f - extra_factor) + extra * extra_factor;
    }
  } else {
    throw InputError("rope: unsupported rope type '" + p.type + "' (supported: default, linear, llama3, yarn, dynamic)");
  }
}

void RopeTable::fill(const int* pos, int n, float* cos, float* sin) const {
  const int half = rot_dim_ / 2;
  for (int t = 0; t < n; ++t) {
    const float pf = static_cast<float>(pos[t]);
    for (int i = 0; i < half; ++i) {
      const float f = inv_freq_[i] * pf;  // fp32 product, as the fp32 matmul in transformers
      cos[t * half + i] = static_cast<float>(std::cos(static_cast<double>(f))) * attention_factor_;
      sin[t * half + i] = static_cast<float>(std::sin(static_cast<double>(f))) * attention_factor_;
    }
  }
}

}  // namespace fp8kv
