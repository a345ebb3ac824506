#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln::model {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

namespace {

// inv_freq[i] = 1 / base^(2i / dim), as fp32 like transformers computes it.
std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> f(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = float(2 * i) / float(dim);
    f[size_t(i)] = 1.0f / std::pow(float(base), exponent);
  }
  return f;
}

void apply_llama3(const formats::RopeConfig& r, std::vector<float>& inv_freq) {
  const double old_ctx = double(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_ctx / r.low_freq_factor;
  const double high_freq_wavelen = old_ctx / r.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = float(f / r.factor);  // low frequency: fully interpolated
    } else if (wavelen >= high_freq_wavelen) {
      // medium: blend between interpolated and original
      const double smooth = (old_ctx / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f = float((1.0 - smooth) * f / r.factor + smooth * f);
    }
  }
}

// YaRN (arXiv 2309.00071) as in transformers' _compute_yarn_parameters.
float apply_yarn(const formats::RopeConfig& r, int dim, std::vector<float>& inv_freq) {
  const double base = r.theta, factor = r.factor;
  double attention_factor;
  if (r.attention_factor) {
    attention_factor = *r.attention_factor;
  } else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0) {
    attention_factor = yarn_get_mscale(factor, *r.mscale) / yarn_get_mscale(factor, *r.mscale_all_dim);
  } else {
    attention_factor = yarn_get_mscale(factor, 1.0);
  }
  const double max_pos = double(r.original_max_position_embeddings);
  auto correction_dim = [&](double n_rot) {
    return (dim * std::log(max_pos / (n_rot * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // avoid a singular ramp
  for (int i = 0; i < dim / 2; ++i) {
    const float extrapolation = inv_freq[size_t(i)];
    const float interpolation = float(extrapolation / factor);
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    inv_freq[size_t(i)] =
        float(interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight);
  }
  return float(attention_factor);
}

}  // namespace

Result<ops::RopeTable> make_rope_table(const formats::RopeConfig& rope, int64_t d_head,
                                       ops::RopeStyle style) {
  ops::RopeTable t;
  t.style = style;
  t.d_rot = int(double(d_head) * rope.partial_rotary_factor);
  if (t.d_rot <= 0 || t.d_rot % 2 != 0 || t.d_rot > d_head) {
    return unsupported("rotary dimension " + std::to_string(t.d_rot) + " (head size " +
                       std::to_string(d_head) + ", partial_rotary_factor " +
                       std::to_string(rope.partial_rotary_factor) + ") must be even and in (0, head size]");
  }
  t.inv_freq = default_inv_freq(rope.theta, t.d_rot);
  if (rope.type == "linear") {
    for (float& f : t.inv_freq) f = float(f / rope.factor);
  } else if (rope.type == "llama3") {
    apply_llama3(rope, t.inv_freq);
  } else if (rope.type == "yarn") {
    t.attention_factor = apply_yarn(rope, t.d_rot, t.inv_freq);
  } else if (rope.type != "default") {
    return unsupported("rope type " + rope.type);
  }
  return t;
}

}  // namespace kiln::model
