// The Backend interface: every op kiln's models use, in coarse units (a whole
// attention call, a whole MoE layer) so each backend can fuse inside.
//
// Conventions for every op:
// - activations are in backend.activation_dtype() (fp32 on the CPU reference),
//   contiguous row-major, with the shapes written next to each field;
// - weights are in their stored dtype (see weight.h);
// - outputs are fully overwritten (never accumulated into) unless a field says so;
// - a call with inconsistent shapes is a bug in the caller and fails a KILN_CHECK.
#pragma once

#include <algorithm>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/batch.h"
#include "ops/rope.h"
#include "ops/weight.h"

namespace kiln::ops {

// Where an embedding's ids come from: a tensor, or the step's batch (uploaded by
// begin_step, so a recorded step replays with new ids).
enum class BatchIds { kNone, kTokens, kLogitRows, kInputRows };

// out[t, :] = table[ids[t], :]. Also the row gather of activations (table = a
// [rows, d] activation tensor, ids = the rows to keep).
// Vocab-parallel tables (tensor parallelism): the table holds rows [id_begin,
// id_begin + table.dim(0)) of a vocab_size-row embedding; ids outside that range give
// zero rows (another rank holds them; the ranks' outputs are summed).
struct EmbeddingArgs {
  Tensor table;  // [vocab or this rank's slice, d_model] stored dtype, or an activation tensor
  // [n_tokens] i32, when from_batch is kNone: host ids, or ids this backend wrote in its
  // own memory (ArgmaxArgs::out: not checked against the vocabulary on the host).
  Tensor ids;
  Tensor out;    // [n_tokens, d_model]
  BatchIds from_batch = BatchIds::kNone;  // else ids = batch->token_ids, logit_rows or input_rows
  const BatchMeta* batch = nullptr;
  int64_t id_begin = 0;
  int64_t vocab_size = 0;  // ids must be in [0, vocab_size); 0: table.dim(0)
};

// The ids of an embedding call, on the host (host ids or the batch's).
std::span<const int32_t> embedding_ids(const EmbeddingArgs& a);
// A host-memory backend's token ids of `batch`: token_ids with device_token_rows' ids in
// place (BatchMeta::device_token_rows).
std::vector<int32_t> batch_token_ids(const BatchMeta& batch);

// Greedy ids of the rows of logits [n_rows, vocab]: the tokens sample() picks at
// temperature 0 (the largest logit, the lowest id on ties), written to out [>= n_rows] i32
// (this backend's alloc) without waiting for them, so a later op reads them where they
// are (EmbeddingArgs::ids: MTP drafts chain on the device) and to_host_i32 brings them
// back once.
struct ArgmaxArgs {
  Tensor logits;  // [n_rows, vocab] activation dtype
  Tensor out;     // [n_rows] i32
};

// dst[r, dst_col_begin + j] = src[r, col_begin + j] for j < n_cols (n_cols 0: dst.dim(1)
// - dst_col_begin); other columns of dst are left as they are. Splits fused projections
// (MLA's per-head [nope | rope] query and [latent | rope] kv) and assembles the
// vocab-parallel logits of tensor parallelism.
struct SliceColumnsArgs {
  Tensor src;            // [rows, n_src]
  int64_t col_begin = 0;
  Tensor dst;            // [rows, n_dst]
  int64_t dst_col_begin = 0;
  int64_t n_cols = 0;    // col_begin + n_cols <= n_src, dst_col_begin + n_cols <= n_dst
};
// The columns a SliceColumnsArgs copies.
inline int64_t slice_width(const SliceColumnsArgs& a) {
  return a.n_cols > 0 ? a.n_cols : a.dst.dim(1) - a.dst_col_begin;
}

// If `residual` is defined: residual += x (in place), then out = norm(residual).
// Else out = norm(x). norm(v) = v / sqrt(mean(v^2) + eps) * weight, over the last dim.
// x may be [rows, dim] with dim = weight size (per-head QK-norm passes [n_tokens*n_heads, d_head]).
// `out` may alias `x`.
struct RmsNormArgs {
  Tensor x;         // [rows, dim]
  Tensor weight;    // [dim] stored dtype
  Tensor residual;  // [rows, dim] or undefined
  Tensor out;       // [rows, dim]
  float eps = 1e-6f;
};

// out = x W^T (+ bias). fp32 accumulation.
struct LinearArgs {
  Tensor x;                // [n_tokens, n_in]
  const Weight* w = nullptr;
  Tensor out;              // [n_tokens, n_out]
};

// out[i] = x W_i^T (+ bias_i) for up to three linears that read the same x (an attention
// layer's q, k and v; an MLP's gate and up): a backend may compute them in one pass.
struct LinearsArgs {
  Tensor x;                              // [n_tokens, n_in]
  std::array<const Weight*, 3> w{};      // the first ones set, the rest nullptr
  std::array<Tensor, 3> out{};           // [n_tokens, w[i]->n_out()]
};

// Rotates the first table.d_rot dims of every head of x in place, by the
// angle batch.positions[t] * inv_freq[i], cos/sin multiplied by attention_factor.
struct RopeArgs {
  Tensor x;                    // [n_tokens, n_heads, d_head]
  const BatchMeta* batch = nullptr;
  const RopeTable* table = nullptr;
};

// Per-head RMSNorm (where a weight is given) and then RoPE of one attention layer's
// queries and keys, in place: q [n_tokens, n_heads, d_head], k [n_tokens, n_kv_heads,
// d_head]. The same as rms_norm over the [n_tokens * heads, d_head] rows followed by rope,
// which is what Backend's default does; the CUDA backend does both tensors in one launch.
// With `store`, the keys as they leave this op and the values are then written into the
// paged cache, as kv_store(*store) after it would (store->k is this op's k); the CUDA
// backend does that in the same launch for a bf16 cache.
struct KvStoreArgs;
struct QkNormRopeArgs {
  Tensor q, k;
  Tensor q_norm, k_norm;  // [d_head] stored dtype, or undefined: no norm
  float eps = 1e-6f;
  const BatchMeta* batch = nullptr;
  const RopeTable* table = nullptr;
  const KvStoreArgs* store = nullptr;
};

// The paged KV cache holds either the activation dtype (the values as they are) or
// e4m3 codes with one fp32 scale per stored row (--kv-cache-dtype fp8; the scaling
// rule, shared by every backend, is in ops/kv_quant.h). The cache tensors' dtype says
// which: kF8E4M3 caches come with their scale tensors, other caches without.

// Writes the new tokens' K and V into the paged cache at batch.slot_mapping (an e4m3
// cache: quantized, each (token, kv head) row with its own scale).
struct KvStoreArgs {
  Tensor k, v;               // [n_tokens, n_kv_heads, d_head]
  Tensor k_cache, v_cache;   // [n_blocks, block_size, n_kv_heads, d_head] activation dtype or e4m3
  Tensor k_scale, v_scale;   // e4m3 caches: [n_blocks, block_size, n_kv_heads] f32; else undefined
  const BatchMeta* batch = nullptr;
};

// Causal paged attention. For query token t of sequence s at position p and
// head h (kv head h / (n_heads / n_kv_heads)), over cached positions j <= p
// (and j > p - sliding_window when sliding_window > 0):
//   out[t,h] = sum_j softmax_j(scale * q.k_j) v_j
// With sinks, the softmax denominator also has exp(sinks[h]) (a virtual key
// with no value; gpt-oss).
// An e4m3 cache is read as k_j = e4m3_value(code) * k_scale[slot, kv head] (likewise v).
struct AttentionArgs {
  Tensor q;                  // [n_tokens, n_heads, d_head]
  Tensor k_cache, v_cache;   // [n_blocks, block_size, n_kv_heads, d_head] activation dtype or e4m3
  Tensor k_scale, v_scale;   // e4m3 caches: [n_blocks, block_size, n_kv_heads] f32; else undefined
  Tensor out;                // [n_tokens, n_heads, d_head]
  Tensor sinks;              // [n_heads] stored dtype, or undefined
  const BatchMeta* batch = nullptr;
  float scale = 1.0f;
  int32_t sliding_window = 0;  // 0: full causal
};

// Writes the new tokens' MLA latents into the latent cache at batch.slot_mapping:
// cache[slot] = concat(kv_latent[t], k_rope[t]). An e4m3 cache quantizes the latent and
// the rope part of a token as two rows, each with its own scale.
struct MlaStoreArgs {
  Tensor kv_latent;     // [n_tokens, d_latent] (after kv_a_layernorm)
  Tensor k_rope;        // [n_tokens, d_rope] (rope applied)
  Tensor latent_cache;  // [n_blocks, block_size, d_latent + d_rope] activation dtype or e4m3
  Tensor latent_scale;  // e4m3 caches: [n_blocks, block_size, 2] f32 (latent, rope); else undefined
  const BatchMeta* batch = nullptr;
};

// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) over the latent cache.
// kv_b = kv_b_proj.weight [n_heads * (d_nope + d_v), d_latent]; for head h its rows
// [h*(d_nope+d_v), +d_nope) are W_uk[h], the next d_v rows W_uv[h]. For cached j:
//   k_j = concat(W_uk[h] c_j, r_j),  v_j = W_uv[h] c_j
//   out[t,h] = sum_j softmax_j(scale * (q_nope.W_uk[h] c_j + q_rope.r_j)) v_j
// causal over positions like AttentionArgs.
// An e4m3 cache is read as c_j = e4m3_value(code) * latent_scale[slot, 0] and
// r_j = e4m3_value(code) * latent_scale[slot, 1].
//
// DeepSeek sparse attention: with `selected` defined, token t attends only to the
// positions selected[t, :] lists (each <= positions[t]; -1 entries are unused), in the
// order listed, instead of every j <= positions[t] (DsaSelectArgs makes the list).
struct MlaArgs {
  Tensor q_nope;        // [n_tokens, n_heads, d_nope]
  Tensor q_rope;        // [n_tokens, n_heads, d_rope] (rope applied)
  Tensor latent_cache;  // [n_blocks, block_size, d_latent + d_rope] activation dtype or e4m3
  Tensor latent_scale;  // e4m3 caches: [n_blocks, block_size, 2] f32 (latent, rope); else undefined
  const Weight* kv_b = nullptr;
  Tensor out;           // [n_tokens, n_heads, d_v]
  const BatchMeta* batch = nullptr;
  float scale = 1.0f;
  Tensor selected;      // [n_tokens, top_k] i32 positions, or undefined: all j <= p
};

// ---- DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) ---------------------------
// The lightning indexer keeps one key of d_index values per token in its own paged cache
// (model::LayerKv::index_k, slots as the latent's) and, per query token, scores every
// cached position of its sequence and keeps the top_k; MLA then attends to those only.
// These ops, and mla_attention's `selected`, are optional (OptionalOp::kDsa).

// out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias over the last dim (biased
// variance: torch.nn.LayerNorm). `out` may alias `x`.
struct LayerNormArgs {
  Tensor x;       // [rows, dim]
  Tensor weight;  // [dim] stored dtype
  Tensor bias;    // [dim] stored dtype, or undefined
  Tensor out;     // [rows, dim]
  float eps = 1e-6f;
};

// Writes the new tokens' indexer keys into the index cache at batch.slot_mapping (an
// e4m3 cache: each key one row with its own scale, ops/kv_quant.h).
struct DsaIndexStoreArgs {
  Tensor k;            // [n_tokens, d_index] (LayerNorm and rope applied)
  Tensor index_cache;  // [n_blocks, block_size, d_index] activation dtype or e4m3
  Tensor index_scale;  // e4m3 caches: [n_blocks, block_size] f32; else undefined
  const BatchMeta* batch = nullptr;
};

// Top-k selection of the lightning indexer. For query token t of sequence s at position
// p and every cached position j <= p (k_j from the index cache):
//   score[t, j] = sum_h (weights[t, h] * weight_scale) * relu(scale * q[t, h] . k_j)
// (fp32, heads in ascending order). selected[t, :] lists the top_k positions of highest
// score, ties to the lower position (so a row's selection depends on its own scores only,
// never on how its sequence is split into steps; transformers' torch.topk breaks exact
// ties in an implementation-defined way, so the DSA fixtures are made without ties), in
// ascending position order; when p + 1 <= top_k
// every j <= p is listed (dense), and the rest of the row is -1. Positions past p never
// count (causal), as transformers' additive mask makes them -inf before its topk.
struct DsaSelectArgs {
  Tensor q;            // [n_tokens, n_index_heads, d_index] (rope applied)
  Tensor weights;      // [n_tokens, n_index_heads] (weights_proj x)
  Tensor index_cache;  // [n_blocks, block_size, d_index] activation dtype or e4m3
  Tensor index_scale;  // e4m3 caches: [n_blocks, block_size] f32; else undefined
  Tensor selected;     // [n_tokens, top_k] i32 (output)
  const BatchMeta* batch = nullptr;
  float scale = 1.0f;         // index_head_dim^-0.5
  float weight_scale = 1.0f;  // index_n_heads^-0.5
};

// Ops a backend may lack. Backend's default of each fails naming the op; a model that
// needs one is refused at load (model::check_backend_support) on a backend whose
// supports_op says no, so the default is never reached from a loaded model.
enum class OptionalOp {
  kDsa,  // layer_norm, dsa_index_store, dsa_select and MlaArgs::selected
  kGatedDeltaNet,  // gated_delta_net, sigmoid_mul and copy_rows (Qwen3-Next, Qwen3.5)
  kStateSnapshots,  // gated_delta_net with BatchMeta::state_snapshots (speculative decoding)
};
const char* optional_op_name(OptionalOp op);

enum class GluKind {
  kSilu,         // act = silu(gate) * up
  kGptOssClamp,  // gate = min(gate, limit); up = clamp(up, -limit, limit);
                 // act = (up + 1) * gate * sigmoid(alpha * gate)
};

struct GluParams {
  GluKind kind = GluKind::kSilu;
  float alpha = 1.702f;
  float limit = 7.0f;
};

// out[t, i] = glu(gate[t, i], up[t, i]).
struct GluArgs {
  Tensor gate, up;  // [n_tokens, d_ff]
  Tensor out;       // [n_tokens, d_ff]
  GluParams params;
};

// out = a + b (elementwise); out may alias a or b.
struct AddArgs {
  Tensor a, b, out;
};

// out = x * sigmoid(gate), elementwise, gate broadcast over x's columns when it has one
// column: gated attention's output gate (Qwen3-Next, Qwen3.5) and the shared expert's
// gate of their MoE. out may alias x.
struct SigmoidMulArgs {
  Tensor x;     // [rows, n]
  Tensor gate;  // [rows, n] or [rows, 1]
  Tensor out;   // [rows, n]
};

// dst[dst_row] = src[src_row]: one row (the first dimension) of a tensor copied into a
// row of another of the same dtype and row shape (or the same tensor): the recurrent
// state rows' checkpoints (runtime/state_cache.h).
struct CopyRowsArgs {
  Tensor src;
  int64_t src_row = 0;
  Tensor dst;
  int64_t dst_row = 0;
};

// The shape contracts of SigmoidMulArgs and CopyRowsArgs, checked by every backend at entry
// (after its own dtype and device checks); check_copy_rows returns the bytes of one row.
inline void check_sigmoid_mul_args(const SigmoidMulArgs& a) {
  KILN_CHECK_EQ(a.out.shape, a.x.shape) << "sigmoid_mul: out.shape vs x.shape";
  const int64_t gn = a.gate.dim(1);
  KILN_CHECK(a.gate.dim(0) == a.x.dim(0) && (gn == a.x.dim(1) || gn == 1))
      << "sigmoid_mul: gate " << a.gate.shape << " for x " << a.x.shape;
}
inline int64_t check_copy_rows_args(const CopyRowsArgs& a) {
  KILN_CHECK(a.src.dtype == a.dst.dtype && a.src.rank() >= 1 && a.dst.rank() == a.src.rank())
      << "copy_rows: " << a.src.shape << " " << dtype_name(a.src.dtype) << " into " << a.dst.shape << " "
      << dtype_name(a.dst.dtype);
  const int64_t row_elems = a.src.numel() / a.src.dim(0);
  KILN_CHECK(a.dst.numel() / a.dst.dim(0) == row_elems) << "copy_rows: row shapes differ";
  KILN_CHECK(a.src_row >= 0 && a.src_row < a.src.dim(0) && a.dst_row >= 0 && a.dst_row < a.dst.dim(0))
      << "copy_rows: row " << a.src_row << " of " << a.src.dim(0) << " into " << a.dst_row << " of " << a.dst.dim(0);
  return row_elems * dtype_bits(a.src.dtype) / 8;
}

// Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention with a recurrent state per
// sequence, over the step's tokens in order, as transformers computes it:
//   x = [q | k | v] (per token, nk dk + nk dk + nv dv channels) through a causal
//   depthwise convolution of conv_kernel taps (the last conv_kernel - 1 inputs of the
//   sequence are its conv state) and SiLU; q, k L2-normalised per key head, q scaled by
//   1/sqrt(dk); value head h reads key head h / (nv / nk);
//   g = -exp(a_log[h]) softplus(a + dt_bias[h]), beta = sigmoid(b);
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q      (S: [dk, dv] per head)
//   out = rms_norm(o) * norm_weight * silu(z)   (per value head, over dv)
// The projections come flat (Qwen3.5: qkv = in_proj_qkv's [T, 2 nk dk + nv dv], z, b, a
// their own) or grouped (Qwen3-Next: qkv = in_proj_qkvz's [T, nk (2 dk + 2 r dv)] in
// per-key-head groups [q | k | v (r heads) | z (r heads)], b = in_proj_ba's [T, nk 2r]
// groups [b (r) | a (r)], r = nv / nk; z and a undefined).
// The state rows are batch->state_slots[s]; a sequence whose first token in the step is
// at position 0 starts from zeros. Both states are updated in place.
struct GatedDeltaNetArgs {
  Tensor qkv, z, b, a;
  bool grouped = false;
  Tensor conv_weight;      // [2 nk dk + nv dv, conv_kernel] (the checkpoint's [C, 1, K])
  Tensor a_log, dt_bias;   // [nv]
  Tensor norm_weight;      // [dv]
  float norm_eps = 1e-6f;
  Tensor conv_state;       // [n_slots, 2 nk dk + nv dv, conv_kernel - 1]
  Tensor recurrent_state;  // [n_slots, nv, dk, dv] f32
  Tensor out;              // [T, nv dv]
  const BatchMeta* batch = nullptr;
  int64_t n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0;
};

enum class RouterKind {
  // p = softmax(logits) over all experts; take top-k of p; renormalise the k if
  // norm_topk_prob. (Qwen3-MoE, Mixtral)
  kSoftmaxTopK,
  // take top-k of logits; weights = softmax over those k. (gpt-oss)
  kTopKSoftmax,
  // s = sigmoid(logits); choice = s + correction_bias; keep the topk_group groups
  // with the largest sum of their top-2 choice scores; top-k of choice in them;
  // weights = s of the chosen (renormalised if norm_topk_prob, + 1e-20) times
  // routed_scaling_factor. (DeepSeek-V3, Kimi K2, GLM-4.5+)
  kSigmoidGroupedTopK,
};

struct RouterParams {
  RouterKind kind = RouterKind::kSoftmaxTopK;
  int32_t n_experts = 0;
  int32_t top_k = 0;
  int32_t n_group = 1;
  int32_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// out[i] = mean + stddev * unit_normal(seed, i) (ops/random.h) for every element, in out's
// dtype (f32 or bf16): the weights of --load-format dummy, the same on every backend.
struct FillRandomArgs {
  Tensor out;
  uint64_t seed = 0;
  float mean = 0.0f;
  float stddev = 1.0f;
};

// Expert weights of one MoE layer. Either fused gate_up (n_out = 2 * d_ff, halves
// concatenated or interleaved gate/up/gate/up...) or separate gate and up.
// Expert parallelism: the vectors hold experts [first_expert, first_expert + n_local)
// of routing.n_experts only; tokens routed to other experts get nothing from them here
// (another rank computes those, and the ranks' outputs are summed).
struct MoeExperts {
  std::vector<Weight> gate_up;  // [n_local], each [2*d_ff, d_model]; or empty
  bool gate_up_interleaved = false;
  std::vector<Weight> gate, up; // [n_local], each [d_ff, d_model]; or empty
  std::vector<Weight> down;     // [n_local], each [d_model, d_ff]
  int64_t d_ff = 0;
  int32_t first_expert = 0;

  int32_t n_local() const { return int32_t(down.size()); }
  // The index into the vectors of global expert e, or -1 when this rank lacks it.
  int32_t local(int32_t e) const {
    return e >= first_expert && e < first_expert + n_local() ? e - first_expert : -1;
  }
};

// A whole routed-MoE layer (shared experts are separate dense MLPs in the model):
//   logits = x router^T (+ router bias), fp32
//   y[t] = sum_{e in topk, e held here} w[t,e] * down_e(glu(gate_e(x[t]), up_e(x[t])))
struct MoeArgs {
  Tensor x;                       // [n_tokens, d_model]
  const Weight* router = nullptr; // [n_experts, d_model] (+ bias [n_experts])
  Tensor correction_bias;         // [n_experts] (kSigmoidGroupedTopK) or undefined
  const MoeExperts* experts = nullptr;
  RouterParams routing;
  GluParams glu;
  Tensor out;                     // [n_tokens, d_model]
};

// Per-row sampling parameters. The kept candidates are the logits sorted descending
// (ids ascending on ties), cut to the first top_k, then to the shortest prefix whose
// probability (softmax(logits / temperature) over the top_k) sums to >= top_p, then to the
// prefix with p >= min_p * p_max (at least one token).
struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties); filters are ignored
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off; in (0, 1]
  float min_p = 0.0f;        // 0: off; in [0, 1]
};
constexpr int32_t kMaxTopLogprobs = 20;

// Per-row penalties on the tokens a sequence has seen (OpenAI presence / frequency,
// HF / vLLM repetition). For each listed token of a row, with n = times it was generated
// (0 when it occurs in the prompt only):
//   x = logits[token];  x = x > 0 ? x / repetition : x * repetition;
//   x -= frequency * n + presence * (n > 0)
struct PenaltyParams {
  float repetition = 1.0f;  // 1: off; > 0
  float presence = 0.0f;    // 0: off
  float frequency = 0.0f;   // 0: off
};

// Samples one token per row of logits. Penalties, when given, are applied to the row first
// (in place: the logits tensor holds the penalised values afterwards). The draw is given:
// uniform[r] in [0, 1) selects the token at which the cumulative probability over the kept
// candidates (sorted by logit descending, ids ascending on ties) first exceeds
// uniform[r] * (kept mass). Logprobs are log_softmax of the (penalised) logits, before
// temperature or filtering. Logits are finite or -inf (never NaN). Outputs are in host
// memory when the call returns.
struct SampleArgs {
  Tensor logits;                           // [n_rows, vocab] activation dtype
  std::span<const SamplingParams> params;  // [n_rows]
  std::span<const float> uniform;          // [n_rows], each in [0, 1)
  int32_t n_top = 0;                       // alternatives per row, 0..kMaxTopLogprobs (<= vocab)
  std::span<int32_t> tokens;               // [n_rows] host output
  std::span<float> logprobs;               // [n_rows] host output (logprob of tokens[r]), or empty
  std::span<int32_t> top_ids;              // [n_rows * n_top] host output: logprob descending, ids
                                           // ascending on ties (the same order as the candidates)
  std::span<float> top_logprobs;           // [n_rows * n_top] host output
  // Optional penalties: empty, or penalties [n_rows] with the tokens row r has seen at
  // penalty_tokens[penalty_start[r] .. penalty_start[r + 1]) (distinct ids) and their
  // generated counts at the same indices of penalty_counts.
  std::span<const PenaltyParams> penalties;  // [n_rows] or empty
  std::span<const int32_t> penalty_start;    // [n_rows + 1]
  std::span<const int32_t> penalty_tokens;   // [penalty_start[n_rows]]
  std::span<const int32_t> penalty_counts;   // [penalty_start[n_rows]]
  // Optional token masks (structured output): empty, or token_mask_words(vocab) 32-bit
  // words per row, bit t % 32 of word t / 32 set where token t may be sampled (a row of
  // all ones is unconstrained; every row allows at least one token). Applied after the
  // penalties: a masked token's logit becomes -inf, so the sample, its logprob and the
  // alternatives are those of the constrained distribution.
  std::span<const uint32_t> allowed;  // [n_rows * token_mask_words(vocab)] or empty
};

inline int64_t token_mask_words(int64_t vocab) { return (vocab + 31) / 32; }
inline bool token_allowed(std::span<const uint32_t> row_mask, int64_t t) {
  return (row_mask[size_t(t / 32)] >> (t % 32)) & 1u;
}

// The contract of SampleArgs, checked by every backend at entry (a violation is a bug in
// the caller: the engine validates request parameters before they get here).
inline void check_sample_args(const SampleArgs& a) {
  KILN_CHECK_EQ(a.logits.rank(), 2) << "sample: logits " << a.logits.shape;
  const size_t n_rows = size_t(a.logits.dim(0));
  const int64_t vocab = a.logits.dim(1);
  KILN_CHECK_EQ(a.params.size(), n_rows) << "sample: params per row";
  KILN_CHECK_EQ(a.uniform.size(), n_rows) << "sample: uniform per row";
  KILN_CHECK_EQ(a.tokens.size(), n_rows) << "sample: tokens per row";
  KILN_CHECK(a.logprobs.empty() || a.logprobs.size() == n_rows) << "sample: logprobs " << a.logprobs.size();
  KILN_CHECK(a.n_top >= 0 && a.n_top <= kMaxTopLogprobs && a.n_top <= vocab) << "sample: n_top " << a.n_top;
  KILN_CHECK_EQ(a.top_ids.size(), n_rows * size_t(a.n_top)) << "sample: top_ids";
  KILN_CHECK_EQ(a.top_logprobs.size(), n_rows * size_t(a.n_top)) << "sample: top_logprobs";
  for (size_t r = 0; r < n_rows; ++r) {
    const SamplingParams& p = a.params[r];
    KILN_CHECK(a.uniform[r] >= 0.0f && a.uniform[r] < 1.0f) << "sample: uniform " << a.uniform[r] << " row " << r;
    KILN_CHECK(p.top_k >= 0 && p.top_p > 0.0f && p.top_p <= 1.0f && p.min_p >= 0.0f && p.min_p <= 1.0f)
        << "sample: row " << r << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
  }
  if (!a.allowed.empty()) {
    const size_t words = size_t(token_mask_words(vocab));
    KILN_CHECK_EQ(a.allowed.size(), n_rows * words) << "sample: token masks";
    for (size_t r = 0; r < n_rows; ++r) {
      const auto row = a.allowed.subspan(r * words, words);
      // Whole words first; the last word counts only its bits below vocab.
      const uint32_t tail = vocab % 32 == 0 ? ~0u : (1u << (vocab % 32)) - 1u;
      bool any = (row[words - 1] & tail) != 0;
      for (size_t w = 0; w + 1 < words && !any; ++w) any = row[w] != 0;
      KILN_CHECK(any) << "sample: row " << r << "'s token mask allows no token";
    }
  }
  if (a.penalties.empty()) {
    KILN_CHECK(a.penalty_tokens.empty() && a.penalty_counts.empty()) << "sample: penalty tokens without penalties";
    return;
  }
  KILN_CHECK_EQ(a.penalties.size(), n_rows) << "sample: penalties per row";
  KILN_CHECK_EQ(a.penalty_start.size(), n_rows + 1) << "sample: penalty_start";
  KILN_CHECK(a.penalty_start[0] == 0 && size_t(a.penalty_start[n_rows]) == a.penalty_tokens.size() &&
             a.penalty_counts.size() == a.penalty_tokens.size())
      << "sample: penalty lists " << a.penalty_tokens.size() << " / " << a.penalty_counts.size();
  for (size_t r = 0; r < n_rows; ++r) {
    KILN_CHECK(a.penalty_start[r] <= a.penalty_start[r + 1]) << "sample: penalty_start row " << r;
    KILN_CHECK(a.penalties[r].repetition > 0.0f) << "sample: repetition penalty " << a.penalties[r].repetition;
  }
  for (int32_t t : a.penalty_tokens) KILN_CHECK(t >= 0 && t < vocab) << "sample: penalty token " << t;
}

// The penalised value of one logit (PenaltyParams).
inline float apply_penalty(float x, const PenaltyParams& p, int32_t n_generated) {
  x = x > 0.0f ? x / p.repetition : x * p.repetition;
  return x - (p.frequency * float(n_generated) + (n_generated > 0 ? p.presence : 0.0f));
}

// A device backend's memory, for sizing the KV cache (the CPU reference has none).
// Device memory a backend may hold for recorded steps beyond the step it measured (a CUDA
// graph keeps every block its kernels used, so a recorded step holds the sum of its
// allocations, and each batch shape has its own): 1/32 of the device, 256 MiB to 8 GiB.
// The KV cache leaves it free (runtime::device_reserve_bytes); a backend records no step
// that would take it past this.
inline int64_t graph_memory_budget(int64_t device_total) {
  return std::clamp<int64_t>(device_total / 32, int64_t(256) << 20, int64_t(8) << 30);
}

struct MemoryInfo {
  int64_t device_total = 0;  // bytes on the device
  int64_t available = 0;     // free on the device plus what the backend's cache holds unused
  int64_t in_use = 0;        // held by live tensors of this backend
  int64_t peak_in_use = 0;   // the most in_use since reset_peak_memory
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType activation_dtype() const = 0;

  // Memory. alloc: uninitialised device memory. upload: a checkpoint tensor made
  // usable by this backend's ops (the CPU backend returns it as is: zero copy).
  virtual Tensor alloc(DType dtype, Shape shape) = 0;
  // alloc for a tensor that lives as long as the model (generated weights): a backend
  // may place it with less slack than its activation cache (the CUDA backend's slabs).
  virtual Tensor alloc_weight(DType dtype, Shape shape) { return alloc(dtype, shape); }
  virtual Tensor upload(const Tensor& host) = 0;
  // Copy a backend tensor into host fp32 (tests, logits).
  virtual void to_host_f32(const Tensor& t, float* out) = 0;
  // Copy host fp32 values into a backend tensor of activation dtype.
  virtual void from_host_f32(const float* src, Tensor& t) = 0;
  // Copy an i32 backend tensor to the host, after the work queued before it (default: a
  // host-memory backend's copy).
  virtual void to_host_i32(const Tensor& t, int32_t* out);
  virtual void synchronize() {}
  // Called on a tensor a collective (an all-reduce over the ranks) has just written: a
  // backend that emulates a storage precision (the CPU reference's bf16-activation mode)
  // rounds it as it rounds its ops' outputs, as a GPU's bf16 all-reduce does.
  virtual void after_collective(Tensor& t) {}
  // Called on a thread before it uses this backend (a rank's thread with several GPUs in
  // one process: a GPU backend makes its device current there).
  virtual void bind_thread() {}
  // Device memory (std::nullopt on a host backend), and the peak's reset.
  virtual std::optional<MemoryInfo> memory_info() { return std::nullopt; }
  virtual void reset_peak_memory() {}
  // Called once per forward step before any op that reads `batch` (a GPU backend
  // uploads the metadata here). `batch` must stay alive and unchanged until the
  // step's last op.
  virtual void begin_step(const BatchMeta& batch) {}
  // Called inside a step, before any op that reads `part`: a sub-batch of the step's
  // batch (split_rows: model::CausalLM's micro-batches) whose ops run in this step too.
  // `part` must stay alive and unchanged until the step's last op. Not in a step that
  // may be recorded (may_record).
  virtual void add_step_batch(const BatchMeta& part) {}
  // The parts added so far are read by no later op of this step (their host copies may go).
  virtual void end_step_batches() {}
  // Runs one forward step: begin_step(batch), then `ops` (which issues the
  // step's ops and returns its output). A GPU backend may record the ops of a
  // decode-shaped step once and replay the recording on later steps with the
  // same `key` and batch shape (CUDA graphs); the caller guarantees that the
  // same key issues the same ops on the same tensors, with every per-step input
  // taken from `batch` (BatchIds). The returned tensor is valid until the next step.
  virtual Tensor run_step(const BatchMeta& batch, uint64_t key, const std::function<Tensor()>& ops) {
    begin_step(batch);
    return ops();
  }
  // Whether run_step may record a step of `batch`'s shape (such a step's ops must be
  // the same every time: no micro-batches, add_step_batch).
  virtual bool may_record(const BatchMeta& batch) const { return false; }
  // Steps run_step ran with a one-time cost so far: a shape's first, eager run and its
  // recording (milliseconds where a replay takes microseconds). Timing that measures the
  // steady state (the speculation depth policy) leaves such steps out.
  virtual int64_t one_time_steps() const { return 0; }
  // Drops what past steps keep (after the work queued so far): the steps run_step
  // recorded and the last step's scratch. Before the communicators the recordings'
  // collectives use are released (NCCL does not free a communicator while a CUDA graph
  // that captured one of its collectives lives), and after a step run only to measure.
  virtual void release_step_memory() {}
  // A quantized weight in its checkpoint layout (host tensors, formats/quant.h) made
  // usable by this backend's ops. The default uploads each tensor as it is (the CPU
  // reference reads the checkpoint layout); a GPU backend repacks it into its kernels'
  // layout (QuantizedTensor::packed_group > 0) or says which format or shape it cannot run.
  // The bytes upload_quantized's result would take on this backend, from q's shapes and
  // dtypes alone (sizing a model before loading it: runtime/sizing.h).
  virtual Result<int64_t> quantized_bytes(const formats::QuantizedTensor& q) const { return int64_t(q.nbytes()); }
  virtual Result<formats::QuantizedTensor> upload_quantized(const formats::QuantizedTensor& q) {
    formats::QuantizedTensor out = q;
    for (Tensor* t : {&out.data, &out.scale, &out.scale2})
      if (t->defined()) *t = upload(*t);
    return out;
  }
  // Whether this backend can compute with `w` (its dtype / quantized format);
  // checked at load so an unsupported checkpoint fails with a clear error.
  virtual Status supports(const Weight& w) const { return Status::Ok(); }
  // Whether its cache ops take a KV cache of `dtype` (the activation dtype always;
  // kF8E4M3 where the backend implements ops/kv_quant.h); checked when the cache is made.
  virtual Status supports_kv_cache(DType dtype) const {
    if (dtype == activation_dtype()) return Status::Ok();
    return unsupported("the " + name() + " backend has no KV cache in " + std::string(dtype_name(dtype)));
  }

  // The kernels that compute with `w` here, in words (`expert`: one of a MoE layer's
  // routed experts): the path records kiln inspect prints and the engine logs at load.
  virtual std::string weight_path(const Weight& w, bool expert) const {
    return w.quantized() ? "fp32 loops over rows dequantized from " + std::string(formats::quant_kind_name(w.quant.kind))
                         : "fp32 loops";
  }

  virtual void embedding(const EmbeddingArgs& a) = 0;
  virtual void rms_norm(const RmsNormArgs& a) = 0;
  virtual void linear(const LinearArgs& a) = 0;
  virtual void linears(const LinearsArgs& a);  // default: one linear each (ops.cpp)
  // Whether linears() computes dense weights that lie one after the other in memory (row
  // views of one matrix) as one product, so that a loader should place the linears of one
  // input that way (model::WeightLoader::adjacent_linears: an attention's q, k and v).
  virtual bool fuses_adjacent_linears() const { return false; }
  virtual void rope(const RopeArgs& a) = 0;
  virtual void qk_norm_rope(const QkNormRopeArgs& a);  // default: rms_norm, rope, kv_store (ops.cpp)
  virtual void kv_store(const KvStoreArgs& a) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  virtual void mla_store(const MlaStoreArgs& a) = 0;
  virtual void mla_attention(const MlaArgs& a) = 0;
  virtual void glu(const GluArgs& a) = 0;
  virtual void add(const AddArgs& a) = 0;
  virtual void slice_columns(const SliceColumnsArgs& a) = 0;
  virtual void moe(const MoeArgs& a) = 0;
  virtual void sample(const SampleArgs& a) = 0;
  virtual void argmax(const ArgmaxArgs& a);  // default: sample() at temperature 0, host memory
  virtual void fill_random(const FillRandomArgs& a) = 0;

  // Optional ops (OptionalOp): the defaults (ops.cpp) fail naming the op.
  virtual Status supports_op(OptionalOp op) const;
  virtual void layer_norm(const LayerNormArgs& a);
  virtual void dsa_index_store(const DsaIndexStoreArgs& a);
  virtual void dsa_select(const DsaSelectArgs& a);
  virtual void sigmoid_mul(const SigmoidMulArgs& a);
  virtual void gated_delta_net(const GatedDeltaNetArgs& a);
  virtual void copy_rows(const CopyRowsArgs& a);
};

}  // namespace kiln::ops
