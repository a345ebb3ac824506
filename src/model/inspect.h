// A summary of a bound model: per module group, the storage formats, parameter
// counts and bytes, as `kiln inspect` prints them.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/blocks.h"

namespace kiln::model {

struct GroupSummary {
  std::string group;                   // "attention", "routed experts", "lm_head", ...
  std::map<std::string, int64_t> formats;  // format ("bf16", "nvfp4", ...) -> number of tensors (biases not counted)
  int64_t params = 0;                  // logical elements (a packed 4-bit weight counts n_out * n_in)
  int64_t bytes = 0;                   // as stored
};

std::vector<GroupSummary> summarize(const CausalLM& lm);

// Calls on_weight / on_tensor for every weight matrix and every other tensor of the
// model (norms, embedding, sinks, biases are part of their weight), with its group.
void visit_weights(const CausalLM& lm,
                   const std::function<void(const std::string& group, const ops::Weight&)>& on_weight,
                   const std::function<void(const std::string& group, const Tensor&)>& on_tensor);

// Which kernels serve each weight group of each layer on `be` (Backend::weight_path):
// one record per run of consecutive layers with the same group, format and path.
struct PathRecord {
  std::string layers;  // "0-35", "3", or "" (embedding, lm_head)
  std::string group;   // "attention", "routed experts", ...
  std::string format;  // "bf16", "mxfp4", ...
  std::string path;
};
std::vector<PathRecord> path_records(const CausalLM& lm, const ops::Backend& be);

// The first weight `be` cannot compute with, as an error naming its group and format.
Status check_backend_support(const CausalLM& lm, const ops::Backend& be);

}  // namespace kiln::model
