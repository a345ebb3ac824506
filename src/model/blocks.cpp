#include "model/blocks.h"

namespace kiln::model {
namespace {

Tensor act(ops::Backend& be, Shape s) { return be.alloc(be.activation_dtype(), s); }

Tensor linear(ops::Backend& be, const Tensor& x, const ops::Weight& w) {
  Tensor y = act(be, {x.dim(0), w.n_out()});
  be.linear({.x = x, .w = &w, .out = y});
  return y;
}

// dst [rows, n] = src[:, begin : begin + n]
Tensor columns(ops::Backend& be, const Tensor& src, int64_t begin, int64_t n) {
  Tensor dst = act(be, {src.dim(0), n});
  be.slice_columns({.src = src, .col_begin = begin, .dst = dst});
  return dst;
}

}  // namespace

void Mlp::forward(ops::Backend& be, const Tensor& x, Tensor& out) const {
  Tensor g = act(be, {x.dim(0), gate.n_out()});
  Tensor u = act(be, {x.dim(0), up.n_out()});
  be.linears({.x = x, .w = {&gate, &up}, .out = {g, u}});
  be.glu({.gate = g, .up = u, .out = g, .params = {}});
  be.linear({.x = g, .w = &down, .out = out});
}

void FullWidthNorm::apply(ops::Backend& be, Tensor& x, float eps, comm::Communicator* tp) const {
  const int64_t n_tokens = x.dim(0), width = x.dim(1), full = weight.numel();
  KILN_CHECK_EQ(width * int64_t(sources.size()), full) << "full-width QK-norm: parts vs weight";
  if (sources.size() == 1) {
    be.rms_norm({.x = x, .weight = weight, .out = x, .eps = eps});
    return;
  }
  KILN_CHECK(tp != nullptr) << "full-width QK-norm split over ranks needs the tensor-parallel group";
  Tensor parts = act(be, {int64_t(tp->size()), n_tokens, width});
  tp->all_gather(x, parts);
  Tensor row = act(be, {n_tokens, full});
  for (size_t j = 0; j < sources.size(); ++j) {
    be.slice_columns({.src = parts.index0(sources[j]), .dst = row, .dst_col_begin = int64_t(j) * width,
                      .n_cols = width});
  }
  be.rms_norm({.x = row, .weight = weight, .out = row, .eps = eps});
  be.slice_columns({.src = row, .col_begin = col_begin, .dst = x, .n_cols = width});
}

void Attention::forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch,
                        LayerKv& kv, Tensor& out, comm::Communicator* tp) const {
  const int64_t n_tokens = x.dim(0);
  Tensor qt = act(be, {n_tokens, q.n_out()});
  Tensor kt = act(be, {n_tokens, k.n_out()});
  Tensor vt = act(be, {n_tokens, v.n_out()});
  be.linears({.x = x, .w = {&q, &k, &v}, .out = {qt, kt, vt}});
  Tensor gate;
  if (output_gate) {  // per head [query | gate]
    const Tensor rows = qt.reshape({n_tokens * n_heads, 2 * d_head});
    gate = columns(be, rows, d_head, d_head).reshape({n_tokens, n_heads * d_head});
    qt = columns(be, rows, 0, d_head).reshape({n_tokens, n_heads * d_head});
  }
  if (q_norm_full) q_norm_full->apply(be, qt, norm_eps, tp);
  if (k_norm_full) k_norm_full->apply(be, kt, norm_eps, tp);
  Tensor q3 = qt.reshape({n_tokens, n_heads, d_head});
  Tensor k3 = kt.reshape({n_tokens, n_kv_heads, d_head});
  const ops::KvStoreArgs store{.k = k3, .v = vt.reshape({n_tokens, n_kv_heads, d_head}), .k_cache = kv.k,
                               .v_cache = kv.v, .k_scale = kv.k_scale, .v_scale = kv.v_scale, .batch = &batch};
  be.qk_norm_rope({.q = q3, .k = k3, .q_norm = q_norm, .k_norm = k_norm, .eps = norm_eps, .batch = &batch,
                   .table = &rope, .store = &store});
  Tensor attn = act(be, {n_tokens, n_heads, d_head});
  be.attention({.q = q3, .k_cache = kv.k, .v_cache = kv.v, .k_scale = kv.k_scale, .v_scale = kv.v_scale,
                .out = attn, .sinks = sinks, .batch = &batch, .scale = scale, .sliding_window = sliding_window});
  const Tensor flat = attn.reshape({n_tokens, n_heads * d_head});
  if (output_gate) be.sigmoid_mul({.x = flat, .gate = gate, .out = flat});
  be.linear({.x = flat, .w = &o, .out = out});
}

void GatedDeltaNet::forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
                            Tensor& out) const {
  const int64_t n_tokens = x.dim(0);
  Tensor qkv_t = act(be, {n_tokens, conv_channels() + (grouped ? n_v_heads * d_v : 0)});
  Tensor b_t = act(be, {n_tokens, b.n_out()});
  Tensor z_t, a_t;
  if (!qkv_parts.empty()) {  // a tensor-parallel rank's q, k, v rows, side by side
    Tensor parts[3];
    for (size_t i = 0; i < 3; ++i) parts[i] = act(be, {n_tokens, qkv_parts[i].n_out()});
    be.linears({.x = x, .w = {&qkv_parts[0], &qkv_parts[1], &qkv_parts[2]}, .out = {parts[0], parts[1], parts[2]}});
    int64_t at = 0;
    for (const Tensor& part : parts) {
      be.slice_columns({.src = part, .dst = qkv_t, .dst_col_begin = at, .n_cols = part.dim(1)});
      at += part.dim(1);
    }
  }
  if (grouped) {
    be.linears({.x = x, .w = {&qkv, &b}, .out = {qkv_t, b_t}});
  } else if (!qkv_parts.empty()) {
    z_t = act(be, {n_tokens, z.n_out()});
    a_t = act(be, {n_tokens, a.n_out()});
    be.linears({.x = x, .w = {&z, &b, &a}, .out = {z_t, b_t, a_t}});
  } else {
    z_t = act(be, {n_tokens, z.n_out()});
    a_t = act(be, {n_tokens, a.n_out()});
    be.linears({.x = x, .w = {&qkv, &z, &b}, .out = {qkv_t, z_t, b_t}});
    be.linear({.x = x, .w = &a, .out = a_t});
  }
  Tensor core = act(be, {n_tokens, n_v_heads * d_v});
  be.gated_delta_net({.qkv = qkv_t, .z = z_t, .b = b_t, .a = a_t, .grouped = grouped, .conv_weight = conv_weight,
                      .a_log = a_log, .dt_bias = dt_bias, .norm_weight = norm, .norm_eps = norm_eps,
                      .conv_state = kv.conv_state, .recurrent_state = kv.recurrent_state, .out = core,
                      .batch = &batch, .n_k_heads = n_k_heads, .n_v_heads = n_v_heads, .d_k = d_k, .d_v = d_v});
  be.linear({.x = core, .w = &o, .out = out});
}

void DsaIndexer::forward(ops::Backend& be, const Tensor& x, const Tensor& q_resid, const ops::BatchMeta& batch,
                         LayerKv& kv, Tensor& selected) const {
  const int64_t n_tokens = x.dim(0);
  Tensor q3 = linear(be, q_resid, wq_b).reshape({n_tokens, n_heads, d_index});
  be.rope({.x = q3, .batch = &batch, .table = &rope});
  Tensor k = act(be, {n_tokens, wk.n_out()});
  Tensor w = act(be, {n_tokens, weights_proj.n_out()});
  be.linears({.x = x, .w = {&wk, &weights_proj}, .out = {k, w}});
  be.layer_norm({.x = k, .weight = k_norm, .bias = k_norm_bias, .out = k, .eps = 1e-6f});
  be.rope({.x = k.reshape({n_tokens, 1, d_index}), .batch = &batch, .table = &rope});
  be.dsa_index_store({.k = k, .index_cache = kv.index_k, .index_scale = kv.index_k_scale, .batch = &batch});
  selected = be.alloc(DType::kI32, {n_tokens, top_k});
  be.dsa_select({.q = q3, .weights = w, .index_cache = kv.index_k, .index_scale = kv.index_k_scale,
                 .selected = selected, .batch = &batch, .scale = scale, .weight_scale = weight_scale});
}

void Mla::forward(ops::Backend& be, const Tensor& x, const ops::BatchMeta& batch, LayerKv& kv,
                  Tensor& out, Tensor& selection) const {
  const int64_t n_tokens = x.dim(0);
  const int64_t d_qk = d_nope + d_rope;
  // The two products of x in one call: the query's (or its low-rank first half's) and the
  // compressed KV's.
  const ops::Weight& q_first = q_a.defined() ? q_a : q;
  Tensor q_full = act(be, {n_tokens, q_first.n_out()});
  Tensor kva = act(be, {n_tokens, kv_a.n_out()});
  be.linears({.x = x, .w = {&q_first, &kv_a}, .out = {q_full, kva}});
  if (q_a.defined()) {
    be.rms_norm({.x = q_full, .weight = q_a_norm, .out = q_full, .eps = norm_eps});
    if (indexer) indexer->forward(be, x, q_full, batch, kv, selection);  // reads q_resid = q_full here
    q_full = linear(be, q_full, q_b);
  }
  KILN_CHECK(!sparse() || selection.defined()) << "Mla: a DSA layer without a selection (no indexer before it)";
  // Queries, split per head into the position-free and the rotary part.
  Tensor q_heads = q_full.reshape({n_tokens * n_heads, d_qk});
  Tensor q_nope = columns(be, q_heads, 0, d_nope);
  Tensor q_rope = columns(be, q_heads, d_nope, d_rope);
  be.rope({.x = q_rope.reshape({n_tokens, n_heads, d_rope}), .batch = &batch,
           .table = &rope});
  // The compressed KV: latent (normalised) and one shared rotary key per token.
  Tensor latent = columns(be, kva, 0, d_latent);
  Tensor k_rope = columns(be, kva, d_latent, d_rope);
  be.rms_norm({.x = latent, .weight = kv_a_norm, .out = latent, .eps = norm_eps});
  be.rope({.x = k_rope.reshape({n_tokens, 1, d_rope}), .batch = &batch,
           .table = &rope});
  be.mla_store({.kv_latent = latent, .k_rope = k_rope, .latent_cache = kv.latent,
                .latent_scale = kv.latent_scale, .batch = &batch});
  Tensor attn = act(be, {n_tokens, n_heads, d_v});
  be.mla_attention({.q_nope = q_nope.reshape({n_tokens, n_heads, d_nope}),
                    .q_rope = q_rope.reshape({n_tokens, n_heads, d_rope}),
                    .latent_cache = kv.latent, .latent_scale = kv.latent_scale, .kv_b = &kv_b, .out = attn,
                    .batch = &batch, .scale = scale, .selected = sparse() ? selection : Tensor{}});
  be.linear({.x = attn.reshape({n_tokens, n_heads * d_v}), .w = &o, .out = out});
}

void Moe::forward(ops::Backend& be, const Tensor& x, Tensor& out) const {
  be.moe({.x = x, .router = &router, .correction_bias = correction_bias, .experts = &experts,
          .routing = routing, .glu = glu, .out = out});
  if (shared) {
    Tensor s = act(be, out.shape);
    shared->forward(be, x, s);
    if (shared_gate.defined()) be.sigmoid_mul({.x = s, .gate = linear(be, x, shared_gate), .out = s});
    be.add({.a = out, .b = s, .out = out});
  }
}

namespace {

KvLayout kv_layout(const DecoderLayer& l) {
  KvLayout kl;
  if (const auto* a = std::get_if<Attention>(&l.attn)) {
    kl.n_kv_heads = a->n_kv_heads;
    kl.d_head = a->d_head;
  } else if (const auto* g = std::get_if<GatedDeltaNet>(&l.attn)) {
    kl.recurrent = true;
    kl.conv_channels = g->conv_channels();
    kl.conv_kernel = g->conv_kernel;
    kl.state_heads = g->n_v_heads;
    kl.state_d_k = g->d_k;
    kl.state_d_v = g->d_v;
  } else {
    const Mla& m = std::get<Mla>(l.attn);
    kl.mla = true;
    kl.d_latent_rope = m.d_latent + m.d_rope;
    kl.d_index = m.indexer ? m.indexer->d_index : 0;
  }
  return kl;
}

}  // namespace

std::vector<KvLayout> CausalLM::kv_layouts() const {
  std::vector<KvLayout> out;
  for (const DecoderLayer& l : layers) out.push_back(kv_layout(l));
  if (mtp) out.push_back(kv_layout(mtp->block));
  return out;
}

Tensor CausalLM::forward(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv,
                         const Tensor& hidden) const {
  KILN_CHECK_EQ(int64_t(batch.token_ids.size()), int64_t(batch.n_tokens())) << "forward: token_ids vs positions";
  KILN_CHECK_EQ(kv.size(), layers.size() + (mtp ? 1 : 0));
  KILN_CHECK(!hidden.defined() || (hidden.dim(0) >= batch.n_tokens() && hidden.dim(1) == d_model))
      << "forward: hidden rows " << hidden.shape << " for " << batch.n_tokens() << " tokens";
  return be.run_step(batch, uint64_t(reinterpret_cast<uintptr_t>(this)), [&] { return step_ops(be, batch, kv, hidden); });
}

void CausalLM::reduce(ops::Backend& be, Tensor& partial) const {
  if (tp == nullptr) return;
  tp->all_reduce(partial);
  be.after_collective(partial);
}

void CausalLM::reduce_add_norm(ops::Backend& be, Tensor& partial, Tensor& residual, const Tensor& weight,
                               Tensor& out) const {
  if (tp != nullptr && tp->all_reduce_add_rms_norm(partial, residual, weight, out, norm_eps)) return;
  reduce(be, partial);
  be.rms_norm({.x = partial, .weight = weight, .residual = residual, .out = out, .eps = norm_eps});
}

void CausalLM::attend(ops::Backend& be, const DecoderLayer& l, const Tensor& x, const ops::BatchMeta& batch,
                      LayerKv& kv, Tensor& out, Tensor& dsa_selection) const {
  if (const auto* a = std::get_if<Attention>(&l.attn)) {
    a->forward(be, x, batch, kv, out, tp);
  } else if (const auto* m = std::get_if<Mla>(&l.attn)) {
    m->forward(be, x, batch, kv, out, dsa_selection);
  } else {
    std::get<GatedDeltaNet>(l.attn).forward(be, x, batch, kv, out);
  }
}

void CausalLM::layer_step(ops::Backend& be, const DecoderLayer& l, const ops::BatchMeta& batch, LayerKv& kv,
                          Tensor& residual, Tensor& normed, Tensor& block_out, bool first, Tensor& dsa_selection,
                          const Tensor* next_norm) const {
  if (first) be.rms_norm({.x = residual, .weight = l.input_norm, .out = normed, .eps = norm_eps});
  attend(be, l, normed, batch, kv, block_out, dsa_selection);
  reduce_add_norm(be, block_out, residual, l.post_attn_norm, normed);
  std::visit([&](const auto& f) { f.forward(be, normed, block_out); }, l.ffn);
  if (next_norm != nullptr) reduce_add_norm(be, block_out, residual, *next_norm, normed);
  else reduce(be, block_out);
}

bool CausalLM::splits_into_micro_batches() const {
  for (const DecoderLayer& l : layers) {
    if (const auto* a = std::get_if<Attention>(&l.attn)) {
      if (a->q_norm_full || a->k_norm_full) return false;  // gathers over the group inside
    } else if (const auto* m = std::get_if<Mla>(&l.attn)) {
      if (m->sparse()) return false;  // one selection a step
    } else {
      return false;  // recurrent state a sequence
    }
  }
  return true;
}

// Two micro-batches, a and b, each with its rows of the residual stream. Per layer:
// attention a, its sum started; attention b, its sum started; a's sum finished into its
// norm, ffn a, its sum started; the same for b; and the next layer starts by finishing
// a's. So each sum runs while the other micro-batch computes, and each micro-batch's
// ops keep the order of step_ops' loop (a's keys of a layer are stored before b's rows,
// a later chunk of the same sequence, attend to them).
void CausalLM::micro_batch_layers(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv,
                                  Tensor& residual, Tensor& normed, Tensor& block_out) const {
  const int32_t n = batch.n_tokens(), cut = n / 2;
  const auto [first, second] = ops::split_rows(batch, cut);
  be.add_step_batch(first);
  be.add_step_batch(second);
  struct Part {
    const ops::BatchMeta* batch;
    Tensor residual, normed, out;
    int ticket = -1;  // its unfinished sum
  };
  Part parts[2] = {{&first, residual.slice0(0, cut), normed.slice0(0, cut), block_out.slice0(0, cut)},
                   {&second, residual.slice0(cut, n), normed.slice0(cut, n), block_out.slice0(cut, n)}};
  const auto finish = [&](Part& p) {
    tp->finish_all_reduce(p.ticket);
    p.ticket = -1;
    be.after_collective(p.out);
  };
  // p's sum finished, added into its residual and normed by `weight` (the next block's norm).
  const auto finish_norm = [&](Part& p, const Tensor& weight) {
    finish(p);
    be.rms_norm({.x = p.out, .weight = weight, .residual = p.residual, .out = p.normed, .eps = norm_eps});
  };
  be.rms_norm({.x = residual, .weight = layers[0].input_norm, .out = normed, .eps = norm_eps});
  Tensor no_selection;  // (no sparse attention here)
  for (size_t i = 0; i < layers.size(); ++i) {
    const DecoderLayer& l = layers[i];
    for (Part& p : parts) {
      if (i > 0) finish_norm(p, l.input_norm);
      attend(be, l, p.normed, *p.batch, kv[i], p.out, no_selection);
      p.ticket = tp->start_all_reduce(p.out);
    }
    for (Part& p : parts) {
      finish_norm(p, l.post_attn_norm);
      std::visit([&](const auto& f) { f.forward(be, p.normed, p.out); }, l.ffn);
      p.ticket = tp->start_all_reduce(p.out);
    }
  }
  // The last layer's end: the final norm, or (a stage that hands on) the sums alone.
  for (Part& p : parts) {
    if (last_stage) finish_norm(p, final_norm);
    else finish(p);
  }
  be.end_step_batches();  // `first` and `second` end here
}

Tensor CausalLM::step_ops(ops::Backend& be, const ops::BatchMeta& batch, std::vector<LayerKv>& kv,
                          const Tensor& hidden) const {
  const int64_t n_tokens = batch.n_tokens();
  Tensor residual = act(be, {n_tokens, d_model});
  if (first_stage) {
    be.embedding({.table = embed, .out = residual, .from_batch = ops::BatchIds::kTokens, .batch = &batch,
                  .id_begin = vocab_begin, .vocab_size = vocab_size});
    reduce(be, residual);
  } else {
    pp->recv(residual, prev_stage);
  }

  // Pre-norm residual stream: the norm op adds the previous block's output into
  // `residual` and normalises it in one call.
  Tensor normed = act(be, {n_tokens, d_model});
  Tensor block_out = act(be, {n_tokens, d_model});
  Tensor dsa_selection;  // the latest DeepSeek sparse attention selection of this step
  // (A batch with recurrent state rows, MTP inputs or device token ids stays whole too:
  // another stage's layers may be recurrent.)
  const bool plain_batch = batch.state_slots.empty() && batch.state_snapshots.empty() && batch.input_rows.empty() &&
                           batch.device_token_rows.empty();
  if (tp != nullptr && micro_batch_rows > 0 && n_tokens >= std::max<int64_t>(2, micro_batch_rows) &&
      !layers.empty() && plain_batch && !be.may_record(batch) && splits_into_micro_batches()) {
    micro_batch_layers(be, batch, kv, residual, normed, block_out);
  } else {
    // Each layer ends in the next one's input norm (the last: the final norm; a stage
    // that hands on: none, its last ffn output added below).
    for (size_t i = 0; i < layers.size(); ++i) {
      const Tensor* next_norm = i + 1 < layers.size() ? &layers[i + 1].input_norm : last_stage ? &final_norm : nullptr;
      layer_step(be, layers[i], batch, kv[i], residual, normed, block_out, i == 0, dsa_selection, next_norm);
    }
  }
  if (!last_stage) {  // hand the residual stream on
    if (!layers.empty()) be.add({.a = residual, .b = block_out, .out = residual});
    pp->send(residual, next_stage);
    return Tensor{};
  }
  if (layers.empty()) be.rms_norm({.x = residual, .weight = final_norm, .out = normed, .eps = norm_eps});
  if (hidden.defined()) be.slice_columns({.src = normed, .dst = hidden.slice0(0, n_tokens)});

  // Gather the requested rows, then project them to the vocabulary.
  const int64_t n_rows = int64_t(batch.logit_rows.size());
  Tensor picked = act(be, {n_rows, d_model});
  be.embedding({.table = normed, .out = picked, .from_batch = ops::BatchIds::kLogitRows, .batch = &batch});
  return logits(be, picked, lm_head);
}

Tensor CausalLM::mtp_forward(ops::Backend& be, const ops::BatchMeta& batch, const Tensor& h, std::vector<LayerKv>& kv,
                             const Tensor& out_hidden, const Tensor& token_ids) const {
  KILN_CHECK(mtp.has_value() && last_stage) << "mtp_forward: the model has no MTP layer here";
  const int64_t n_tokens = batch.n_tokens(), n_rows = int64_t(batch.logit_rows.size());
  KILN_CHECK_EQ(int64_t(batch.input_rows.size()), n_tokens) << "mtp_forward: input rows";
  KILN_CHECK(!token_ids.defined() || token_ids.dim(0) == n_tokens) << "mtp_forward: token ids " << token_ids.shape;
  KILN_CHECK_EQ(kv.size(), layers.size() + 1);
  KILN_CHECK(out_hidden.dim(0) >= n_rows && out_hidden.dim(1) == d_model) << "mtp_forward: out_hidden " << out_hidden.shape;
  KILN_CHECK(h.data != out_hidden.data) << "mtp_forward: reading and writing one hidden buffer";
  const MtpLayer& m = *mtp;
  // Everything per step comes from the batch (its input rows gathered in the step) or from
  // token_ids, a fixed buffer: without a row at position 0 (whose embedding is zeroed) a
  // GPU backend may record the pass and replay it like a decode step.
  bool identity = true, zero_rows = false;
  for (int64_t r = 0; r < n_tokens; ++r) {
    identity = identity && batch.input_rows[size_t(r)] == r;
    zero_rows = zero_rows || (m.zero_embedding_at_0 && batch.positions[size_t(r)] == 0);
  }
  const auto body = [&] {
    Tensor e = act(be, {n_tokens, d_model});
    const Tensor& table = m.embed.defined() ? m.embed : embed;
    if (token_ids.defined()) {
      be.embedding({.table = table, .ids = token_ids, .out = e, .id_begin = vocab_begin, .vocab_size = vocab_size});
    } else {
      be.embedding({.table = table, .out = e, .from_batch = ops::BatchIds::kTokens, .batch = &batch,
                    .id_begin = vocab_begin, .vocab_size = vocab_size});
    }
    reduce(be, e);
    for (int64_t r = 0; r < n_tokens && m.zero_embedding_at_0; ++r)  // as vLLM's deepseek_mtp: none at position 0
      if (batch.positions[size_t(r)] == 0) be.fill_random({.out = e.slice0(r, r + 1), .mean = 0.0f, .stddev = 0.0f});
    Tensor hidden = h.slice0(0, n_tokens);
    if (!identity) {
      hidden = act(be, {n_tokens, d_model});
      be.embedding({.table = h, .out = hidden, .from_batch = ops::BatchIds::kInputRows, .batch = &batch});
    }
    Tensor hn = act(be, {n_tokens, d_model});
    be.rms_norm({.x = hidden, .weight = m.hnorm, .out = hn, .eps = norm_eps});
    Tensor both = act(be, {n_tokens, 2 * d_model});
    be.rms_norm({.x = e, .weight = m.enorm, .out = e, .eps = norm_eps});
    be.slice_columns({.src = e, .dst = both, .n_cols = d_model});
    be.slice_columns({.src = hn, .dst = both, .dst_col_begin = d_model, .n_cols = d_model});
    Tensor residual = linear(be, both, m.eh_proj);
    Tensor normed = act(be, {n_tokens, d_model});
    Tensor block_out = act(be, {n_tokens, d_model});
    Tensor dsa_selection;
    layer_step(be, m.block, batch, kv.back(), residual, normed, block_out, true, dsa_selection, nullptr);
    be.add({.a = residual, .b = block_out, .out = residual});  // o
    const Tensor o = out_hidden.slice0(0, n_rows);
    be.embedding({.table = residual, .out = o, .from_batch = ops::BatchIds::kLogitRows, .batch = &batch});
    Tensor picked = act(be, {n_rows, d_model});
    be.rms_norm({.x = o, .weight = m.head_norm, .out = picked, .eps = norm_eps});
    return logits(be, picked, m.head.defined() ? m.head : lm_head);
  };
  if (!zero_rows) {
    // One recording per (layer, input buffer, output buffer, token source, gather): a
    // replay reads and writes the addresses it was recorded with.
    uint64_t key = uint64_t(reinterpret_cast<uintptr_t>(&m)) ^ (uint64_t(reinterpret_cast<uintptr_t>(h.data)) << 1) ^
                   (uint64_t(reinterpret_cast<uintptr_t>(out_hidden.data)) << 2) ^ (identity ? 0 : 0x9e3779b97f4a7c15ull);
    if (token_ids.defined()) key ^= uint64_t(reinterpret_cast<uintptr_t>(token_ids.data)) << 3;
    return be.run_step(batch, key, body);
  }
  be.begin_step(batch);  // eager: the zeroing depends on positions
  return body();
}

Tensor CausalLM::logits(ops::Backend& be, const Tensor& picked, const ops::Weight& head) const {
  const int64_t n_rows = picked.dim(0);
  if (tp == nullptr) return linear(be, picked, head);
  // Vocab-parallel: every rank projects its part (padded to vocab_part columns), the
  // parts are gathered, and their columns laid side by side.
  Tensor part = act(be, {n_rows, vocab_part});
  const int64_t rows_here = head.n_out();
  Tensor mine = rows_here == vocab_part ? part : act(be, {n_rows, rows_here});
  be.linear({.x = picked, .w = &head, .out = mine});
  if (rows_here != vocab_part) be.slice_columns({.src = mine, .dst = part, .n_cols = rows_here});
  Tensor parts = act(be, {int64_t(tp->size()), n_rows, vocab_part});
  tp->all_gather(part, parts);
  if (tp->rank() != 0) return parts;  // only the group's first rank hands logits on (ModelRunner)
  Tensor out = act(be, {n_rows, vocab_size});
  for (int r = 0; r < tp->size(); ++r) {
    const int64_t begin = vocab_part * r, n = std::min(vocab_part, vocab_size - begin);
    if (n <= 0) break;
    be.slice_columns({.src = parts.index0(r), .dst = out, .dst_col_begin = begin, .n_cols = n});
  }
  return out;
}

}  // namespace kiln::model
