// Rotary position embedding contract.
#pragma once

#include <string>
#include <vector>

namespace kiln::ops {

// How the rotated dimensions are paired.
enum class RopeStyle {
  kHalf,         // (x[i], x[i + d_rot/2]) pairs: Llama, Qwen, GLM, gpt-oss ("rotate_half")
  kInterleaved,  // (x[2i], x[2i+1]) pairs: DeepSeek / Kimi MLA rope part (GPT-J style)
};

// The frequencies of one RoPE variant, computed on the host from config.
struct RopeTable {
  int d_rot = 0;                  // rotated leading dims of each head (partial rotary: < d_head)
  std::vector<float> inv_freq;    // [d_rot / 2]
  float attention_factor = 1.0f;  // YaRN mscale: multiplies cos and sin
  RopeStyle style = RopeStyle::kHalf;
};

}  // namespace kiln::ops
