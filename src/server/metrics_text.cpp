#include "server/metrics_text.h"

#include <sstream>
#include <vector>

#include "core/check.h"

namespace kiln::server {
namespace {

class Writer {
 public:
  explicit Writer(std::string model) : labels_("model_name=\"" + escape(model) + "\"") {}

  void metric(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void value(const char* name, double v, const std::string& extra = {}) {
    out_ << name << "{" << labels_ << (extra.empty() ? "" : "," + extra) << "} " << v << "\n";
  }
  void gauge(const char* name, const char* help, double v) {
    metric(name, "gauge", help);
    value(name, v);
  }
  void counter(const char* name, const char* help, double v) {
    metric(name, "counter", help);
    value(name, v);
  }
  void histogram(const char* name, const char* help, const runtime::Histogram::Snapshot& h) {
    metric(name, "histogram", help);
    const std::string base = name;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      std::ostringstream le;
      le << "le=\"" << h.bounds[i] << "\"";
      value((base + "_bucket").c_str(), double(h.cumulative[i]), le.str());
    }
    value((base + "_bucket").c_str(), double(h.count), "le=\"+Inf\"");
    value((base + "_sum").c_str(), h.sum);
    value((base + "_count").c_str(), double(h.count));
  }
  std::string str() const { return out_.str(); }
  static std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '\\' || c == '"') o += '\\';
      if (c == '\n') {
        o += "\\n";
        continue;
      }
      o += c;
    }
    return o;
  }

 private:
  std::string labels_;
  std::ostringstream out_;
};

// The replicas' histograms as one (the same bounds: ServingMetrics').
runtime::Histogram::Snapshot merged(std::span<const EngineNumbers> engines,
                                    const runtime::Histogram runtime::ServingMetrics::*which) {
  runtime::Histogram::Snapshot out = (engines[0].metrics->*which).snapshot();
  for (size_t i = 1; i < engines.size(); ++i) {
    const runtime::Histogram::Snapshot h = (engines[i].metrics->*which).snapshot();
    for (size_t b = 0; b < out.cumulative.size() && b < h.cumulative.size(); ++b) out.cumulative[b] += h.cumulative[b];
    out.count += h.count;
    out.sum += h.sum;
  }
  return out;
}

}  // namespace

std::string metrics_text(const std::string& model_name, std::span<const EngineNumbers> engines,
                         const StatusCounts& statuses) {
  KILN_CHECK(!engines.empty()) << "metrics_text: no engine";
  std::vector<runtime::AsyncEngineStats> each;
  for (const EngineNumbers& e : engines) each.push_back(e.stats);
  const runtime::AsyncEngineStats s = runtime::combined_stats(each);
  Writer w(model_name);
  w.metric("kiln_http_requests_total", "counter", "HTTP responses sent, by status code.");
  for (const auto& [code, n] : statuses) w.value("kiln_http_requests_total", double(n), "status=\"" + std::to_string(code) + "\"");
  w.metric("kiln_request_success_total", "counter", "Generated sequences that ended, by finish reason.");
  for (int r = 1; r < runtime::kFinishReasons; ++r)
    w.value("kiln_request_success_total", double(s.finished_by_reason[r]),
            std::string("finished_reason=\"") + runtime::finish_reason_name(runtime::FinishReason(r)) + "\"");
  w.counter("kiln_prompt_tokens_total", "Prompt tokens of admitted requests.", double(s.engine.prompt_tokens));
  w.counter("kiln_generation_tokens_total", "Tokens generated.", double(s.engine.generated_tokens));
  w.counter("kiln_computed_tokens_total", "Tokens run through the model (prefill, decode, recompute).",
            double(s.engine.computed_tokens));
  w.counter("kiln_engine_steps_total", "Engine steps run.", double(s.engine.steps));
  w.counter("kiln_engine_one_time_steps_total",
            "Engine steps that ran a batch shape for the first time or recorded it (a CUDA graph).",
            double(s.engine.one_time_steps));
  // By kind: decode steps (every sequence one token), verify steps (every sequence decodes,
  // some verify drafts) and mixed ones (prefill chunks in them).
  const std::pair<const char*, const runtime::EngineStats::StepKind*> kinds[] = {
      {"decode", &s.engine.decode_steps}, {"verify", &s.engine.verify_steps}, {"mixed", &s.engine.mixed_steps}};
  const auto by_kind = [&](const char* name, const char* type, const char* help, auto value) {
    w.metric(name, type, help);
    for (const auto& [kind, k] : kinds) w.value(name, value(*k), std::string("kind=\"") + kind + "\"");
  };
  by_kind("kiln_engine_step_kind_total", "counter",
          "Engine steps by kind: decode (one token per sequence), verify (drafts verified) or mixed (prefill).",
          [](const runtime::EngineStats::StepKind& k) { return double(k.steps); });
  by_kind("kiln_engine_step_tokens_total", "counter", "Tokens computed in engine steps, by kind.",
          [](const runtime::EngineStats::StepKind& k) { return double(k.tokens); });
  by_kind("kiln_engine_step_seconds_total", "counter",
          "Wall time of engine steps (scheduling, forward pass, sampling), by kind.",
          [](const runtime::EngineStats::StepKind& k) { return k.seconds; });
  w.metric("kiln_engine_step_phase_seconds_total", "counter",
           "Wall time of engine steps by kind and phase: plan (scheduling, the batch built), launch (the forward "
           "pass queued), sample (sampling and verification, waiting for the device), finish (tokens emitted, "
           "MTP passes queued).");
  for (const auto& [kind, k] : kinds)
    for (int i = 0; i < runtime::EngineStats::kPhases; ++i)
      w.value("kiln_engine_step_phase_seconds_total", k->phase_seconds[i],
              std::string("kind=\"") + kind + "\",phase=\"" + runtime::EngineStats::kPhaseNames[i] + "\"");
  w.counter("kiln_spec_decode_num_draft_tokens_total", "Speculative draft tokens verified.",
            double(s.engine.spec_draft_tokens));
  w.counter("kiln_spec_decode_num_accepted_tokens_total", "Speculative draft tokens the target model accepted.",
            double(s.engine.spec_accepted_tokens));
  w.counter("kiln_spec_decode_num_drafts_total", "Sequence-steps that verified speculative drafts.",
            double(s.engine.spec_verified_seqs));
  // The draft depth chosen each step (runtime/adaptive_depth.h): rate(depth) / rate(steps)
  // is the mean over any window; the gauge is the mean of the recent steps.
  w.counter("kiln_spec_decode_depth_steps_total",
            "Steps in which some decoding sequence had a speculative draft, or the policy planned none.",
            double(s.engine.spec_depth_steps));
  w.counter("kiln_spec_decode_depth_total", "Sum of the draft depths chosen in those steps.",
            double(s.engine.spec_depth_total));
  w.gauge("kiln_spec_decode_mean_depth", "Mean draft depth chosen over the recent steps with drafts (EMA of ~32).",
          s.engine.spec_depth_recent);
  // MTP drafts (runtime/mtp_drafts.cpp): rows whose MTP pass waited for a later one.
  w.counter("kiln_spec_decode_mtp_deferred_rows_total", "Hidden rows kept for a later MTP pass while no drafts were planned.",
            double(s.engine.mtp_deferred_rows));
  w.counter("kiln_spec_decode_mtp_deferred_passes_total", "MTP passes over such kept rows.",
            double(s.engine.mtp_flushes));
  w.counter("kiln_num_preemptions_total", "Sequences preempted for KV blocks (recomputed later).",
            double(s.engine.preemptions));
  w.gauge("kiln_num_requests_running", "Sequences in the running batch.", s.engine.running);
  w.gauge("kiln_num_requests_waiting", "Requests waiting to start (in the inbox or not yet scheduled).", s.queued);
  w.gauge("kiln_num_requests_in_flight", "Requests admitted and not yet finished.", s.in_flight);
  w.gauge("kiln_kv_cache_blocks_total", "KV cache blocks.", s.engine.kv_blocks_total);
  w.gauge("kiln_kv_cache_blocks_used", "KV cache blocks held by sequences.", s.engine.kv_blocks_used);
  w.gauge("kiln_kv_cache_usage_perc", "Fraction of KV cache blocks held by sequences.",
          s.engine.kv_blocks_total > 0 ? double(s.engine.kv_blocks_used) / s.engine.kv_blocks_total : 0.0);
  w.counter("kiln_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            double(s.engine.prefix_queried_tokens));
  w.counter("kiln_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            double(s.engine.prefix_hit_tokens));
  w.histogram("kiln_time_to_first_token_seconds", "From arrival to the first generated token.",
              merged(engines, &runtime::ServingMetrics::time_to_first_token));
  w.histogram("kiln_inter_token_latency_seconds", "Between consecutive tokens of a sequence.",
              merged(engines, &runtime::ServingMetrics::inter_token_latency));
  w.histogram("kiln_e2e_request_latency_seconds", "From arrival to the last token.",
              merged(engines, &runtime::ServingMetrics::e2e_latency));
  if (engines.size() > 1) {  // data-parallel replicas: how the load is shared
    const auto per_engine = [&](const char* name, const char* type, const char* help, auto value) {
      w.metric(name, type, help);
      for (size_t i = 0; i < engines.size(); ++i)
        w.value(name, value(engines[i].stats), "engine=\"" + std::to_string(i) + "\"");
    };
    using Stats = runtime::AsyncEngineStats;
    per_engine("kiln_engine_requests_in_flight", "gauge", "Requests admitted and not yet finished, by replica.",
               [](const Stats& e) { return double(e.in_flight); });
    per_engine("kiln_engine_requests_running", "gauge", "Sequences in the running batch, by replica.",
               [](const Stats& e) { return double(e.engine.running); });
    per_engine("kiln_engine_generation_tokens_total", "counter", "Tokens generated, by replica.",
               [](const Stats& e) { return double(e.engine.generated_tokens); });
    per_engine("kiln_engine_kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks held by sequences, by replica.",
               [](const Stats& e) {
                 return e.engine.kv_blocks_total > 0 ? double(e.engine.kv_blocks_used) / e.engine.kv_blocks_total : 0.0;
               });
  }
  return w.str();
}

}  // namespace kiln::server
