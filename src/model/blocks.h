// Model building blocks, written once against ops::Backend. Each block holds its
// bound weights (shapes in the comments) and a forward over a flattened batch.
#pragma once

#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "comm/communicator.h"
#include "ops/backend.h"

namespace kiln::model {

// Per-layer paged KV storage. GQA: k, v [n_blocks, block_size, n_kv_heads, d_head].
// MLA: latent [n_blocks, block_size, d_latent + d_rope]. An e4m3 cache (ops/kv_quant.h)
// adds its scales: k_scale, v_scale [n_blocks, block_size, n_kv_heads] or latent_scale
// [n_blocks, block_size, 2] f32; they are undefined otherwise.
// DeepSeek sparse attention adds the indexer's keys, paged like the latent: index_k
// [n_blocks, block_size, d_index] (+ index_k_scale [n_blocks, block_size] f32 when e4m3).
// A recurrent layer (Gated DeltaNet) has no per-token cache but a state per sequence
// (ops::BatchMeta::state_slots): conv_state [n_slots, conv_channels, conv_kernel - 1] in
// the activation dtype and recurrent_state [n_slots, state_heads, state_d_k, state_d_v] f32.
struct LayerKv {
  Tensor k, v;
  Tensor latent;
  Tensor k_scale, v_scale;
  Tensor latent_scale;
  Tensor index_k, index_k_scale;
  Tensor conv_state, recurrent_state;
};

// What a layer needs from the KV cache, per token slot (and per sequence for recurrent ones).
struct KvLayout {
  bool mla = false;
  int64_t n_kv_heads = 0, d_head = 0;  // GQA
  int64_t d_latent_rope = 0;           // MLA: d_latent + d_rope
  int64_t d_index = 0;                 // DeepSeek sparse attention: the indexer key (0: none)
  bool recurrent = false;              // Gated DeltaNet: no per-token cache, the state below
  int64_t conv_channels = 0, conv_kernel = 0;
  int64_t state_heads = 0, state_d_k = 0, state_d_v = 0;
};

// down(glu(gate x, up x)); the dense SwiGLU MLP and MoE shared experts.
struct Mlp {
  ops::Weight gate;  // [d_ff, d_model]
  ops::Weight up;    // [d_ff, d_model]
  ops::Weight down;  // [d_model, d_ff]
  void forward(ops::Backend& be, const Tensor& x, Tensor& out) const;
};

// An RMSNorm over the concatenation of all heads of q (or k) rather than per head
// (MiniMax-M2: q_norm [n_heads * d_head], k_norm [n_kv_heads * d_head], both over every
// rank's heads). Under tensor parallelism a rank holds `width` columns of the row:
// it gathers the group's parts, takes part `sources[j]` as the row's j-th `width`
// columns, normalises the whole row, and keeps its own columns from `col_begin`. The
// gather makes it exact (the same sums as one rank) with existing ops only.
struct FullWidthNorm {
  Tensor weight;              // [n_heads_total * d_head] (all ranks' heads)
  int64_t col_begin = 0;      // this rank's first column of the full row
  std::vector<int> sources;   // tp rank holding each `width`-column part of the row, in order

  // x: [n_tokens, width] this rank's columns, normalised in place.
  void apply(ops::Backend& be, Tensor& x, float eps, comm::Communicator* tp) const;
};

// Multi-head attention with grouped KV heads, optional q/k/v/o bias, per-head
// QK-norm (before RoPE) or one over all heads (FullWidthNorm), attention sinks and a
// sliding window.
struct Attention {
  int64_t n_heads = 0, n_kv_heads = 0, d_head = 0;
  ops::Weight q;       // [n_heads * d_head, d_model]
  ops::Weight k, v;    // [n_kv_heads * d_head, d_model]
  ops::Weight o;       // [d_model, n_heads * d_head]
  Tensor q_norm, k_norm;  // [d_head] or undefined
  std::optional<FullWidthNorm> q_norm_full, k_norm_full;  // instead of q_norm / k_norm
  float norm_eps = 1e-6f;
  Tensor sinks;        // [n_heads] or undefined
  ops::RopeTable rope;
  float scale = 1.0f;
  int32_t sliding_window = 0;
  // Gated attention (Qwen3-Next, Qwen3.5): q is [n_heads * 2 * d_head, d_model], per head
  // [query | gate], and the attention output is multiplied by sigmoid(gate) before o.
  bool output_gate = false;

  // tp: the tensor-parallel group (null: one rank), which a full-width QK-norm gathers over.
  void forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
               Tensor& out, comm::Communicator* tp) const;
};

// The lightning indexer of DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): per token a
// key k = rope(LayerNorm(wk x)) kept in the index cache; per query token n_heads queries
// q_h = rope(wq_b q_resid) (q_resid: the MLA's normalised q_a output) and head weights
// w = weights_proj x score the cached keys (ops::DsaSelectArgs) and keep the top_k
// positions. Rope rotates the first d_rope of d_index dims, half-split on DeepSeek-V3.2,
// interleaved on GLM-5. transformers' Hadamard-free form (q.k is unchanged by it).
struct DsaIndexer {
  int64_t n_heads = 0, d_index = 0, top_k = 0;
  ops::Weight wq_b;          // [n_heads * d_index, q_lora_rank]
  ops::Weight wk;            // [d_index, d_model]
  Tensor k_norm, k_norm_bias;  // [d_index] (LayerNorm, eps 1e-6)
  ops::Weight weights_proj;  // [n_heads, d_model]
  ops::RopeTable rope;       // over the first d_rope dims
  float scale = 1.0f;        // d_index^-0.5
  float weight_scale = 1.0f; // n_heads^-0.5

  // Stores the batch's keys in kv.index_k and writes each row's selection into
  // `selected` ([n_tokens, top_k] i32, allocated here).
  void forward(ops::Backend& be, const Tensor& x, const Tensor& q_resid, const ops::BatchMeta& batch, LayerKv& kv,
               Tensor& selected) const;
};

// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2). The cache holds the
// normalised latent c and the roped shared key r per token.
// With DeepSeek sparse attention each query attends to the positions its layer's indexer
// selects, or (GLM-5's "shared" layers: reuse_selection) to those the previous indexer
// layer of the step selected.
struct Mla {
  int64_t n_heads = 0, d_nope = 0, d_rope = 0, d_v = 0, d_latent = 0;
  ops::Weight q;          // no q_lora: [n_heads * (d_nope + d_rope), d_model]
  ops::Weight q_a;        // [q_lora_rank, d_model]
  Tensor q_a_norm;        // [q_lora_rank]
  ops::Weight q_b;        // [n_heads * (d_nope + d_rope), q_lora_rank]
  ops::Weight kv_a;       // [d_latent + d_rope, d_model]
  Tensor kv_a_norm;       // [d_latent]
  ops::Weight kv_b;       // [n_heads * (d_nope + d_v), d_latent]
  ops::Weight o;          // [d_model, n_heads * d_v]
  float norm_eps = 1e-6f;
  ops::RopeTable rope;    // interleaved, over d_rope
  float scale = 1.0f;
  std::optional<DsaIndexer> indexer;  // DSA: this layer's indexer
  bool reuse_selection = false;       // DSA without an indexer here: the previous one's

  bool sparse() const { return indexer.has_value() || reuse_selection; }
  // `selection`: the step's latest DSA selection, written by a layer with an indexer and
  // read by one that reuses it (undefined before the first).
  void forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
               Tensor& out, Tensor& selection) const;
};

// Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention whose state is per sequence
// (head counts are this tensor-parallel rank's: nk / tp key heads, nv / tp value heads)
// (LayerKv::conv_state / recurrent_state), ops::GatedDeltaNetArgs for the computation.
// grouped: Qwen3-Next's fused in_proj_qkvz / in_proj_ba (per key head groups); else
// Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
struct GatedDeltaNet {
  int64_t n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0, conv_kernel = 0;
  bool grouped = false;
  ops::Weight qkv;        // grouped [nk (2 dk + 2 r dv), d_model]; else [2 nk dk + nv dv, d_model]
  std::vector<ops::Weight> qkv_parts;  // not grouped, tensor-parallel: this rank's q, k, v rows (qkv undefined)
  ops::Weight z;          // [nv dv, d_model] (not grouped)
  ops::Weight b;          // grouped [2 nv, d_model] (b and a); else [nv, d_model]
  ops::Weight a;          // [nv, d_model] (not grouped)
  Tensor conv_weight;     // [2 nk dk + nv dv, conv_kernel]
  Tensor a_log, dt_bias;  // [nv]
  Tensor norm;            // [dv]: the gated RMSNorm's weight
  float norm_eps = 1e-6f;
  ops::Weight o;          // out_proj [d_model, nv dv]

  int64_t conv_channels() const { return 2 * n_k_heads * d_k + n_v_heads * d_v; }
  void forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
               Tensor& out) const;
};

// Routed experts plus optional shared experts (added unweighted).
struct Moe {
  ops::Weight router;        // [n_experts, d_model] (+ bias)
  Tensor correction_bias;    // [n_experts] or undefined
  ops::MoeExperts experts;
  ops::RouterParams routing;
  ops::GluParams glu;
  std::optional<Mlp> shared;
  ops::Weight shared_gate;   // [1, d_model]: the shared expert's output times sigmoid(x . w) (Qwen), or undefined

  void forward(ops::Backend& be, const Tensor& x, Tensor& out) const;
};

struct DecoderLayer {
  Tensor input_norm;      // [d_model]
  Tensor post_attn_norm;  // [d_model]
  std::variant<Attention, Mla, GatedDeltaNet> attn;
  std::variant<Mlp, Moe> ffn;
};

// A multi-token prediction (MTP) layer (DeepSeek-V3, GLM-4.5 and later: the checkpoint's
// model.layers.N for N = num_hidden_layers; vLLM's deepseek_mtp computes it): at position
// t, from the model's final (normed) hidden state h_t and the next token x_{t+1},
//   u = eh_proj([enorm(embed(x_{t+1})) | hnorm(h_t)])   (DeepSeek-style: the embedding zero at position 0)
//   o = block(u)   (a decoder layer with its own KV cache: the residual stream's output)
//   logits = head(head_norm(o))   predicting x_{t+2}.
// Chained drafts feed o back as h and the drafted token as x (CausalLM::mtp_forward).
struct MtpLayer {
  Tensor enorm, hnorm;  // [d_model]
  ops::Weight eh_proj;  // [d_model, 2 d_model] (whole on every tensor-parallel rank)
  DecoderLayer block;
  Tensor head_norm;     // shared_head.norm [d_model]
  Tensor embed;         // the layer's own embedding rows, or undefined: the model's
  ops::Weight head;     // shared_head.head, or undefined: the model's lm_head
  // DeepSeek-V3 / GLM (vLLM's deepseek_mtp): no token embedding at position 0; Qwen3-Next
  // (qwen3_next_mtp) keeps it.
  bool zero_embedding_at_0 = true;
};

// A decoder-only causal LM: embed -> layers (pre-norm residual) -> norm -> lm_head.
//
// Parallel (docs/ARCHITECTURE.md "Many GPUs"): a tensor-parallel rank holds a slice of
// every layer (heads, MLP and expert columns or whole experts, a vocabulary part); each
// block's output is a partial sum the `tp` group all-reduces, and the logits parts are
// all-gathered. A pipeline stage holds layers [first_layer, first_layer + layers.size()):
// a stage after the first receives the hidden state from `prev_stage`, a stage before
// the last sends it to `next_stage` (ranks of the `pp` communicator).
struct CausalLM {
  int64_t vocab_size = 0, d_model = 0;
  float norm_eps = 1e-6f;
  Tensor embed;            // [vocab_part rows from vocab_begin, d_model] (first stage; last when tied)
  std::vector<DecoderLayer> layers;
  Tensor final_norm;       // [d_model] (last stage)
  ops::Weight lm_head;     // [vocab rows from vocab_begin, d_model] (last stage; may share embed's memory)
  int64_t vocab_begin = 0, vocab_part = 0;  // this rank's vocabulary rows; every rank's part size
  int64_t first_layer = 0;
  bool first_stage = true, last_stage = true;
  comm::Communicator* tp = nullptr;  // null: one tensor-parallel rank
  comm::Communicator* pp = nullptr;  // null: one stage
  int prev_stage = -1, next_stage = -1;
  std::optional<MtpLayer> mtp;  // loaded for --speculative-method mtp (model::Shard::mtp)
  // A tensor-parallel step of at least this many rows (0: none) runs as two micro-batches
  // of half its rows each, their layers interleaved so that each one's sums
  // (Communicator::start_all_reduce) move while the other computes: where sums are slow
  // (no peer access), a prompt chunk's sums hide behind work instead of adding to it, for
  // a second read of the weights. Layers with collectives of their own inside (a full-width
  // QK-norm), recurrent state or sparse attention keep the step whole, as does a step the
  // backend may record (Backend::may_record). The same on every rank of the group
  // (runtime::ModelRunner sets it).
  int64_t micro_batch_rows = 0;
  // Whether every layer can run as micro-batches (micro_batch_rows).
  bool splits_into_micro_batches() const;

  // One per layer, then the MTP layer's when there is one (its cache is the last entry).
  std::vector<KvLayout> kv_layouts() const;

  // Runs one step over the flattened batch (batch.token_ids) through
  // Backend::run_step and returns the logits [batch.logit_rows.size(), vocab]
  // (activation dtype) of the requested rows, valid until the next step; a stage
  // before the last returns an undefined tensor, and a tensor-parallel rank other than
  // the group's first the gathered vocabulary parts (only the first assembles the logits).
  // `hidden`, when defined ([>= n_tokens, d_model], memory that outlives the step),
  // receives the final normed hidden state of every row of the batch (what the MTP layer
  // reads).
  Tensor forward(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv,
                 const Tensor& hidden = {}) const;

  // The MTP layer over `batch`: row r is position batch.positions[r] with next token
  // batch.token_ids[r] (or token_ids[r]: ids this backend computed, ops::ArgmaxArgs) and
  // previous hidden state h.index0(batch.input_rows[r]) (h: [*, d_model]). Returns the
  // logits of batch.logit_rows, as forward does, and writes the layer's output o at those
  // rows into `out_hidden` [>= logit rows, d_model] (row i for logit row i: what a chained
  // pass reads as its hidden state). kv: the model's caches (the MTP layer's is the last).
  Tensor mtp_forward(ops::Backend& be, const ops::BatchMeta& batch, const Tensor& h, std::vector<LayerKv>& kv,
                     const Tensor& out_hidden, const Tensor& token_ids = {}) const;

 private:
  Tensor step_ops(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv, const Tensor& hidden) const;
  // One pre-norm decoder layer. `first`: `residual` holds the layer's input, normed is
  // computed here; otherwise `normed` already holds the input norm of residual (the
  // previous layer's end). Then attention and ffn; with `next_norm`, the ffn's output is
  // added into `residual` and normed = next_norm(residual) (the next layer's input norm,
  // or the final norm); without, block_out holds the ffn's output (summed over ranks).
  void layer_step(ops::Backend& be, const DecoderLayer& l, const ops::BatchMeta& batch, LayerKv& kv, Tensor& residual,
                  Tensor& normed, Tensor& block_out, bool first, Tensor& dsa_selection,
                  const Tensor* next_norm) const;
  void reduce(ops::Backend& be, Tensor& partial) const;
  // Layer l's attention block (whichever kind) of x into out (a partial sum under TP).
  void attend(ops::Backend& be, const DecoderLayer& l, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
              Tensor& out, Tensor& dsa_selection) const;
  // The layers over two micro-batches of `batch` (rows [0, cut) and [cut, n)): as
  // step_ops' loop, from the embedding in `residual` to the last layer's end.
  void micro_batch_layers(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv, Tensor& residual,
                          Tensor& normed, Tensor& block_out) const;
  // The sum of a block's partial output over the tensor-parallel ranks, its residual add
  // and the norm that follows: one fused call where the communicator takes it
  // (Communicator::all_reduce_add_rms_norm), else reduce and the backend's rms_norm.
  void reduce_add_norm(ops::Backend& be, Tensor& partial, Tensor& residual, const Tensor& weight, Tensor& out) const;
  Tensor logits(ops::Backend& be, const Tensor& picked, const ops::Weight& head) const;
};

}  // namespace kiln::model
