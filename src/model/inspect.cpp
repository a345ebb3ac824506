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
  void mlp(const std::string& group, const Mlp& m) {
    weight(group, m.gate);
    weight(group, m.up);
    weight(group, m.down);
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

std::vector<GroupSummary> summarize(const CausalLM& lm) {
  Summarizer s;
  s.tensor("embedding", lm.embed);
  for (const DecoderLayer& l : lm.layers) {
    s.tensor("norms", l.input_norm);
    s.tensor("norms", l.post_attn_norm);
    if (const auto* a = std::get_if<Attention>(&l.attn)) {
      for (const ops::Weight* w : {&a->q, &a->k, &a->v, &a->o}) s.weight("attention", *w);
      s.tensor("norms", a->q_norm);
      s.tensor("norms", a->k_norm);
      s.tensor("attention", a->sinks);
    } else {
      const Mla& m = std::get<Mla>(l.attn);
      for (const ops::Weight* w : {&m.q, &m.q_a, &m.q_b, &m.kv_a, &m.kv_b, &m.o}) s.weight("attention (MLA)", *w);
      s.tensor("norms", m.q_a_norm);
      s.tensor("norms", m.kv_a_norm);
    }
    if (const auto* m = std::get_if<Mlp>(&l.ffn)) {
      s.mlp("dense MLP", *m);
    } else {
      const Moe& moe = std::get<Moe>(l.ffn);
      s.weight("router", moe.router);
      s.tensor("router", moe.correction_bias);
      for (const auto* list : {&moe.experts.gate_up, &moe.experts.gate, &moe.experts.up, &moe.experts.down})
        for (const ops::Weight& w : *list) s.weight("routed experts", w);
      if (moe.shared) s.mlp("shared experts", *moe.shared);
    }
  }
  s.tensor("norms", lm.final_norm);
  if (lm.lm_head.data.data == lm.embed.data) {
    // tied: shares the embedding's memory
  } else {
    s.weight("lm_head", lm.lm_head);
  }
  return s.take();
}

}  // namespace kiln::model
