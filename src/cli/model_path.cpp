#include "cli/model_path.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace kiln::cli {
namespace fs = std::filesystem;

std::string hf_hub_cache_dir() {
  if (const char* v = std::getenv("HF_HUB_CACHE"); v && *v) return v;
  if (const char* v = std::getenv("HUGGINGFACE_HUB_CACHE"); v && *v) return v;
  if (const char* v = std::getenv("HF_HOME"); v && *v) return std::string(v) + "/hub";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/huggingface/hub";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/huggingface/hub";
  return ".cache/huggingface/hub";
}

Result<std::string> resolve_model_dir(const std::string& model) {
  std::error_code ec;
  if (fs::is_directory(model, ec)) {
    if (!fs::exists(fs::path(model) / "config.json", ec)) return not_found(model + " has no config.json");
    return model;
  }
  // "org/name": exactly one slash, not a path.
  const size_t slash = model.find('/');
  const bool hub_id = slash != std::string::npos && slash > 0 && slash + 1 < model.size() &&
                      model.find('/', slash + 1) == std::string::npos && model[0] != '.' && model[0] != '~';
  if (!hub_id) return not_found("no model directory " + model + " (give a checkpoint directory or an org/name id)");

  const std::string cache = hf_hub_cache_dir();
  const fs::path repo = fs::path(cache) / ("models--" + model.substr(0, slash) + "--" + model.substr(slash + 1));
  std::vector<std::string> looked = {(repo / "refs/main").string()};
  std::string commit;
  if (std::ifstream ref(repo / "refs/main"); ref && std::getline(ref, commit) && !commit.empty()) {
    const fs::path snap = repo / "snapshots" / commit;
    if (fs::exists(snap / "config.json", ec)) return snap.string();
    looked.push_back((snap / "config.json").string());
  }
  // No usable ref: a single snapshot is unambiguous.
  std::vector<fs::path> snaps;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
    if (e.is_directory() && fs::exists(e.path() / "config.json", ec)) snaps.push_back(e.path());
  looked.push_back((repo / "snapshots").string());
  if (snaps.size() == 1) return snaps.front().string();
  std::string where;
  for (const std::string& l : looked) where += "\n  " + l;
  if (snaps.size() > 1) {
    return not_found("model " + model + " has " + std::to_string(snaps.size()) +
                     " snapshots in the Hugging Face cache and no refs/main to choose one; give the snapshot "
                     "directory instead. Looked at:" + where);
  }
  return not_found("model " + model + " is not a directory and not in the Hugging Face cache (kiln does not "
                   "download; fetch it with `huggingface-cli download " + model + "` or give its directory). "
                   "Looked at:" + where);
}

}  // namespace kiln::cli
