// The CPU reference of Gated DeltaNet (ops::GatedDeltaNetArgs) and sigmoid_mul: the
// recurrence token by token in fp32, which is the chunked form transformers runs for a
// prompt, rearranged (the two agree to rounding; tests/models/family_test.cpp holds it
// to transformers' logits).
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_internal.h"

namespace kiln::cpu {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void CpuBackend::sigmoid_mul(const ops::SigmoidMulArgs& a) {
  check_activation(a.x, "sigmoid_mul x", 2);
  check_activation(a.gate, "sigmoid_mul gate", 2);
  check_activation(a.out, "sigmoid_mul out", 2);
  ops::check_sigmoid_mul_args(a);
  const int64_t rows = a.x.dim(0), n = a.x.dim(1), gn = a.gate.dim(1);
  const float* x = a.x.as<float>();
  const float* g = a.gate.as<float>();
  float* out = a.out.as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = x[r * n + i] * sigmoid(g[r * gn + (gn == 1 ? 0 : i)]);
  round_output(a.out);
}

void CpuBackend::copy_rows(const ops::CopyRowsArgs& a) {
  const int64_t bytes = ops::check_copy_rows_args(a);
  std::memmove(static_cast<char*>(a.dst.data) + a.dst_row * bytes, static_cast<const char*>(a.src.data) + a.src_row * bytes,
               size_t(bytes));
}

void CpuBackend::gated_delta_net(const ops::GatedDeltaNetArgs& a) {
  KILN_CHECK(a.batch != nullptr) << "gated_delta_net: no batch";
  const ops::BatchMeta& batch = *a.batch;
  const int64_t nk = a.n_k_heads, nv = a.n_v_heads, dk = a.d_k, dv = a.d_v;
  KILN_CHECK(nk > 0 && nv % nk == 0) << "gated_delta_net: " << nv << " value heads for " << nk << " key heads";
  const int64_t r = nv / nk, key_dim = nk * dk, value_dim = nv * dv, channels = 2 * key_dim + value_dim;
  const int64_t n_tokens = batch.n_tokens(), kernel = a.conv_weight.dim(1);
  check_activation(a.qkv, "gated_delta_net qkv", 2);
  check_activation(a.b, "gated_delta_net b", 2);
  check_activation(a.out, "gated_delta_net out", 2);
  check_float_dtype(a.conv_weight, "gated_delta_net conv weight");
  KILN_CHECK(a.qkv.dim(0) == n_tokens && a.b.dim(0) == n_tokens && a.out.dim(0) == n_tokens)
      << "gated_delta_net: rows of qkv / b / out vs the batch's " << n_tokens << " tokens";
  KILN_CHECK_EQ(a.qkv.dim(1), a.grouped ? channels + value_dim : channels) << "gated_delta_net: qkv width";
  KILN_CHECK_EQ(a.b.dim(1), a.grouped ? 2 * nv : nv) << "gated_delta_net: b width";
  if (!a.grouped) {
    check_activation(a.z, "gated_delta_net z", 2);
    check_activation(a.a, "gated_delta_net a", 2);
    KILN_CHECK(a.z.dim(1) == value_dim && a.a.dim(1) == nv) << "gated_delta_net: z / a width";
  }
  KILN_CHECK(a.conv_weight.dim(0) == channels && kernel >= 1) << "gated_delta_net: conv weight " << a.conv_weight.shape;
  KILN_CHECK_EQ(a.out.dim(1), value_dim) << "gated_delta_net: out width";
  KILN_CHECK(a.conv_state.dtype == DType::kF32 && a.recurrent_state.dtype == DType::kF32)
      << "gated_delta_net: the reference keeps both states in f32";
  KILN_CHECK(a.conv_state.dim(1) == channels && a.conv_state.dim(2) == kernel - 1) << "gated_delta_net: conv state " << a.conv_state.shape;
  KILN_CHECK(a.recurrent_state.dim(1) == nv && a.recurrent_state.dim(2) == dk && a.recurrent_state.dim(3) == dv)
      << "gated_delta_net: recurrent state " << a.recurrent_state.shape;
  KILN_CHECK_EQ(int64_t(batch.state_slots.size()), int64_t(batch.n_seqs())) << "gated_delta_net: state slots";
  // Speculative verification: the state after row t also goes to row snapshot(t) (-1: not).
  KILN_CHECK(batch.state_snapshots.empty() || int64_t(batch.state_snapshots.size()) == n_tokens)
      << "gated_delta_net: state snapshots for " << batch.state_snapshots.size() << " of " << n_tokens << " rows";
  for (int32_t row : batch.state_snapshots)
    KILN_CHECK(row < a.conv_state.dim(0) && row < a.recurrent_state.dim(0)) << "gated_delta_net: snapshot row " << row;
  const auto snapshot = [&](int64_t t) { return batch.state_snapshots.empty() ? -1 : batch.state_snapshots[size_t(t)]; };

  // Per token: the convolution's input x [q | k | v], the output gate z, beta and g.
  std::vector<float> x(static_cast<size_t>(n_tokens * channels)), z(static_cast<size_t>(n_tokens * value_dim));
  std::vector<float> beta(static_cast<size_t>(n_tokens * nv)), g(static_cast<size_t>(n_tokens * nv));
  const float* qkv = a.qkv.as<float>();
  const float* bb = a.b.as<float>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = &x[size_t(t * channels)];
    float* zt = &z[size_t(t * value_dim)];
    const float* row = qkv + t * a.qkv.dim(1);
    std::vector<float> b_t(static_cast<size_t>(nv)), a_t(static_cast<size_t>(nv));
    if (a.grouped) {
      const int64_t width = 2 * dk + 2 * r * dv;
      for (int64_t kh = 0; kh < nk; ++kh) {
        const float* grp = row + kh * width;
        for (int64_t i = 0; i < dk; ++i) {
          xt[kh * dk + i] = grp[i];
          xt[key_dim + kh * dk + i] = grp[dk + i];
        }
        for (int64_t i = 0; i < r * dv; ++i) {
          xt[2 * key_dim + kh * r * dv + i] = grp[2 * dk + i];
          zt[kh * r * dv + i] = grp[2 * dk + r * dv + i];
        }
        for (int64_t j = 0; j < r; ++j) {
          b_t[size_t(kh * r + j)] = bb[t * 2 * nv + kh * 2 * r + j];
          a_t[size_t(kh * r + j)] = bb[t * 2 * nv + kh * 2 * r + r + j];
        }
      }
    } else {
      std::copy(row, row + channels, xt);
      std::copy(a.z.as<float>() + t * value_dim, a.z.as<float>() + (t + 1) * value_dim, zt);
      for (int64_t h = 0; h < nv; ++h) {
        b_t[size_t(h)] = bb[t * nv + h];
        a_t[size_t(h)] = a.a.as<float>()[t * nv + h];
      }
    }
    for (int64_t h = 0; h < nv; ++h) {
      beta[size_t(t * nv + h)] = sigmoid(b_t[size_t(h)]);
      g[size_t(t * nv + h)] =
          -std::exp(load_f32(a.a_log, h)) * softplus(a_t[size_t(h)] + load_f32(a.dt_bias, h));
    }
  }

  // The causal convolution and SiLU, per sequence and channel; sequences at position 0
  // start from zero states.
  float* conv_state = a.conv_state.as<float>();
  float* rec_state = a.recurrent_state.as<float>();
  const int64_t n_seqs = batch.n_seqs(), rec_size = nv * dk * dv;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int32_t slot = batch.state_slots[size_t(s)];
    KILN_CHECK(slot >= 0 && slot < a.conv_state.dim(0)) << "gated_delta_net: state slot " << slot;
    if (batch.n_query(int32_t(s)) > 0 && batch.positions[size_t(batch.q_start[size_t(s)])] == 0) {
      std::fill_n(conv_state + slot * channels * (kernel - 1), channels * (kernel - 1), 0.0f);
      std::fill_n(rec_state + slot * rec_size, rec_size, 0.0f);
    }
  }
  pool_.parallel_for(n_seqs * channels, [&](int64_t i0, int64_t i1) {
    std::vector<float> ext;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / channels, c = i % channels;
      const int64_t q0 = batch.q_start[size_t(s)], n = batch.n_query(int32_t(s));
      float* state = conv_state + (batch.state_slots[size_t(s)] * channels + c) * (kernel - 1);
      ext.assign(state, state + kernel - 1);
      for (int64_t t = 0; t < n; ++t) ext.push_back(x[size_t((q0 + t) * channels + c)]);
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) acc += load_f32(a.conv_weight, c * kernel + j) * ext[size_t(t + j)];
        x[size_t((q0 + t) * channels + c)] = silu(acc);
        if (const int32_t row = snapshot(q0 + t); row >= 0)  // the window ending at row t
          std::copy(ext.begin() + t + 1, ext.begin() + t + kernel, conv_state + (row * channels + c) * (kernel - 1));
      }
      std::copy(ext.end() - (kernel - 1), ext.end(), state);
    }
  });

  // The delta rule per sequence and value head, then the gated RMSNorm of its output.
  float* out = a.out.as<float>();
  pool_.parallel_for(n_seqs * nv, [&](int64_t i0, int64_t i1) {
    std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), delta(static_cast<size_t>(dv)), o(static_cast<size_t>(dv));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / nv, h = i % nv, kh = h / r;
      const int64_t q0 = batch.q_start[size_t(s)], n = batch.n_query(int32_t(s));
      float* S = rec_state + (batch.state_slots[size_t(s)] * nv + h) * dk * dv;  // [dk, dv]
      for (int64_t t = q0; t < q0 + n; ++t) {
        const float* xt = &x[size_t(t * channels)];
        // L2 normalisation as transformers' l2norm: x * rsqrt(sum x^2 + 1e-6).
        float qq = 0.0f, kk = 0.0f;
        for (int64_t d = 0; d < dk; ++d) {
          q[size_t(d)] = xt[kh * dk + d];
          k[size_t(d)] = xt[key_dim + kh * dk + d];
          qq += q[size_t(d)] * q[size_t(d)];
          kk += k[size_t(d)] * k[size_t(d)];
        }
        const float qs = 1.0f / std::sqrt(qq + 1e-6f) / std::sqrt(float(dk)), ks = 1.0f / std::sqrt(kk + 1e-6f);
        for (int64_t d = 0; d < dk; ++d) {
          q[size_t(d)] *= qs;
          k[size_t(d)] *= ks;
        }
        const float decay = std::exp(g[size_t(t * nv + h)]), bt = beta[size_t(t * nv + h)];
        const float* v = xt + 2 * key_dim + h * dv;
        for (int64_t e = 0; e < dk * dv; ++e) S[e] *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          float mem = 0.0f;
          for (int64_t d = 0; d < dk; ++d) mem += S[d * dv + j] * k[size_t(d)];
          delta[size_t(j)] = (v[j] - mem) * bt;
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t j = 0; j < dv; ++j) S[d * dv + j] += k[size_t(d)] * delta[size_t(j)];
        if (const int32_t row = snapshot(t); row >= 0) std::copy(S, S + dk * dv, rec_state + (row * nv + h) * dk * dv);
        float ss = 0.0f;
        for (int64_t j = 0; j < dv; ++j) {
          float acc = 0.0f;
          for (int64_t d = 0; d < dk; ++d) acc += S[d * dv + j] * q[size_t(d)];
          o[size_t(j)] = acc;
          ss += acc * acc;
        }
        const float inv = 1.0f / std::sqrt(ss / float(dv) + a.norm_eps);
        const float* zt = &z[size_t(t * value_dim + h * dv)];
        for (int64_t j = 0; j < dv; ++j)
          out[t * value_dim + h * dv + j] = o[size_t(j)] * inv * load_f32(a.norm_weight, j) * silu(zt[j]);
      }
    }
  });
  round_output(a.out);
}

}  // namespace kiln::cpu
