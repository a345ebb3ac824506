#include "model/inspect.h"

#include <functional>

namespace kiln::model {
namespace {

class Summarizer {
 public:
  // count_format: false for biases, which ride along with their weight.
  void tensor(const std::string& group, const Tensor& t, bool count_format = true) {
    if (!t.defined()) return;
    GroupSummary& g = get(group);
    if (count_format) g.formats[std::string(dtype_name(t.dtype))]++;
    g.params += t.numel();
    g.bytes += int64_t(t.nbytes());
  }
  void weight(const std::string& group, const ops::Weight& w) {
    if (!w.defined()) return;
    GroupSummary& g = get(group);
    g.formats[w.quantized() ? std::string(formats::quant_kind_name(w.quant.kind))
                            : std::string(dtype_name(w.data.dtype))]++;
    g.params += w.n_out() * w.n_in();
    g.bytes += int64_t(w.quantized() ? w.quant.nbytes() : w.data.nbytes());
    tensor(group, w.bias, /*count_format=*/false);
  }
  std::vector<GroupSummary> take() { return std::move(groups_); }

 private:
  GroupSummary& get(const std::string& name) {
    for (GroupSummary& g : groups_)
      if (g.group == name) return g;
    groups_.push_back({.group = name});
    return groups_.back();
  }
  std::vector<GroupSummary> groups_;  // in first-seen order
};

}  // namespace

void visit_weights(const CausalLM& lm,
                   const std::function<void(const std::string& group, const ops::Weight&)>& on_weight,
                   const std::function<void(const std::string& group, const Tensor&)>& on_tensor) {
  auto mlp = [&](const std::string& group, const Mlp& m) {
    for (const ops::Weight* w : {&m.gate, &m.up, &m.down}) on_weight(group, *w);
  };
  on_tensor("embedding", lm.embed);
  for (const DecoderLayer& l : lm.layers) {
    on_tensor("norms", l.input_norm);
    on_tensor("norms", l.post_attn_norm);
    if (const auto* a = std::get_if<Attention>(&l.attn)) {
      for (const ops::Weight* w : {&a->q, &a->k, &a->v, &a->o}) on_weight("attention", *w);
      on_tensor("norms", a->q_norm);
      on_tensor("norms", a->k_norm);
      for (const auto* n : {&a->q_norm_full, &a->k_norm_full})
        if (*n) on_tensor("norms", (*n)->weight);
      on_tensor("attention", a->sinks);
    } else if (const auto* g = std::get_if<GatedDeltaNet>(&l.attn)) {
      for (const ops::Weight* w : {&g->qkv, &g->z, &g->b, &g->a, &g->o}) on_weight("linear attention", *w);
      for (const ops::Weight& w : g->qkv_parts) on_weight("linear attention", w);
      for (const Tensor* t : {&g->conv_weight, &g->a_log, &g->dt_bias}) on_tensor("linear attention", *t);
      on_tensor("norms", g->norm);
    } else {
      const Mla& m = std::get<Mla>(l.attn);
      for (const ops::Weight* w : {&m.q, &m.q_a, &m.q_b, &m.kv_a, &m.kv_b, &m.o}) on_weight("attention (MLA)", *w);
      on_tensor("norms", m.q_a_norm);
      on_tensor("norms", m.kv_a_norm);
      if (m.indexer) {
        const DsaIndexer& ix = *m.indexer;
        for (const ops::Weight* w : {&ix.wq_b, &ix.wk, &ix.weights_proj}) on_weight("DSA indexer", *w);
        on_tensor("norms", ix.k_norm);
        on_tensor("norms", ix.k_norm_bias);
      }
    }
    if (const auto* m = std::get_if<Mlp>(&l.ffn)) {
      mlp("dense MLP", *m);
    } else {
      const Moe& moe = std::get<Moe>(l.ffn);
      on_weight("router", moe.router);
      on_tensor("router", moe.correction_bias);
      for (const auto* list : {&moe.experts.gate_up, &moe.experts.gate, &moe.experts.up, &moe.experts.down})
        for (const ops::Weight& w : *list) on_weight("routed experts", w);
      if (moe.shared) mlp("shared experts", *moe.shared);
      on_weight("router", moe.shared_gate);
    }
  }
  on_tensor("norms", lm.final_norm);
  // A tied lm_head shares the embedding's memory: not visited twice.
  if (lm.lm_head.quantized() || lm.lm_head.data.data != lm.embed.data) on_weight("lm_head", lm.lm_head);
}

std::vector<GroupSummary> summarize(const CausalLM& lm) {
  Summarizer s;
  visit_weights(
      lm, [&](const std::string& g, const ops::Weight& w) { s.weight(g, w); },
      [&](const std::string& g, const Tensor& t) { s.tensor(g, t); });
  return s.take();
}

std::vector<PathRecord> path_records(const CausalLM& lm, const ops::Backend& be) {
  struct Entry {
    int64_t first, last;
    PathRecord r;
  };
  std::vector<Entry> runs;
  const auto add = [&](int64_t layer, const std::string& group, const ops::Weight& w, bool expert) {
    if (!w.defined()) return;
    PathRecord r{.group = group,
                 .format = w.quantized() ? std::string(formats::quant_kind_name(w.quant.kind))
                                         : std::string(dtype_name(w.data.dtype)),
                 .path = be.weight_path(w, expert)};
    for (auto it = runs.rbegin(); it != runs.rend(); ++it) {  // extend this group's run
      if (it->r.group != group || it->r.format != r.format || it->r.path != r.path) continue;
      if (it->last == layer || it->last + 1 == layer) {
        it->last = layer;
        return;
      }
      break;
    }
    runs.push_back({layer, layer, std::move(r)});
  };
  const auto mlp = [&](int64_t i, const std::string& group, const Mlp& m) {
    for (const ops::Weight* w : {&m.gate, &m.up, &m.down}) add(i, group, *w, false);
  };
  for (size_t l = 0; l < lm.layers.size(); ++l) {
    const int64_t i = lm.first_layer + int64_t(l);
    const DecoderLayer& layer = lm.layers[l];
    if (const auto* a = std::get_if<Attention>(&layer.attn)) {
      for (const ops::Weight* w : {&a->q, &a->k, &a->v, &a->o}) add(i, "attention", *w, false);
    } else if (const auto* g = std::get_if<GatedDeltaNet>(&layer.attn)) {
      for (const ops::Weight* w : {&g->qkv, &g->z, &g->b, &g->a, &g->o}) add(i, "linear attention", *w, false);
      for (const ops::Weight& w : g->qkv_parts) add(i, "linear attention", w, false);
    } else {
      const Mla& m = std::get<Mla>(layer.attn);
      for (const ops::Weight* w : {&m.q, &m.q_a, &m.q_b, &m.kv_a, &m.kv_b, &m.o}) add(i, "attention (MLA)", *w, false);
      if (m.indexer) {
        for (const ops::Weight* w : {&m.indexer->wq_b, &m.indexer->wk, &m.indexer->weights_proj})
          add(i, "DSA indexer", *w, false);
      }
    }
    if (const auto* m = std::get_if<Mlp>(&layer.ffn)) {
      mlp(i, "dense MLP", *m);
    } else {
      const Moe& moe = std::get<Moe>(layer.ffn);
      add(i, "router", moe.router, false);
      for (const auto* list : {&moe.experts.gate_up, &moe.experts.gate, &moe.experts.up, &moe.experts.down})
        for (const ops::Weight& w : *list) add(i, "routed experts", w, true);
      if (moe.shared) mlp(i, "shared experts", *moe.shared);
    }
  }
  std::vector<PathRecord> out;
  for (Entry& e : runs) {
    e.r.layers = e.first == e.last ? std::to_string(e.first) : std::to_string(e.first) + "-" + std::to_string(e.last);
    out.push_back(std::move(e.r));
  }
  if (lm.lm_head.defined()) out.push_back({.group = "lm_head", .format = std::string(dtype_name(lm.lm_head.data.dtype)),
                                           .path = be.weight_path(lm.lm_head, false)});
  return out;
}

Status check_backend_support(const CausalLM& lm, const ops::Backend& be) {
  for (size_t i = 0; i < lm.layers.size(); ++i) {
    const auto* m = std::get_if<Mla>(&lm.layers[i].attn);
    if (m == nullptr || !m->sparse()) continue;
    Status s = be.supports_op(ops::OptionalOp::kDsa);
    if (!s.ok()) {
      return s.with_context("layer " + std::to_string(lm.first_layer + int64_t(i)) +
                            " uses DeepSeek sparse attention (DeepSeek-V3.2 / GLM-5), which the CPU and CUDA "
                            "backends implement");
    }
  }
  for (size_t i = 0; i < lm.layers.size(); ++i) {
    if (!std::holds_alternative<GatedDeltaNet>(lm.layers[i].attn)) continue;
    Status s = be.supports_op(ops::OptionalOp::kGatedDeltaNet);
    if (!s.ok()) {
      return s.with_context("layer " + std::to_string(lm.first_layer + int64_t(i)) +
                            " is a Gated DeltaNet (linear attention) layer (Qwen3-Next / Qwen3.5), which the CPU and "
                            "CUDA backends implement");
    }
  }
  Status first;
  visit_weights(
      lm,
      [&](const std::string& group, const ops::Weight& w) {
        if (!first.ok() || !w.defined()) return;
        Status s = be.supports(w);
        if (!s.ok()) first = s.with_context(group + " on the " + be.name() + " backend");
      },
      [](const std::string&, const Tensor&) {});
  return first;
}

}  // namespace kiln::model
