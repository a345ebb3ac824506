#include "cli/demo.h"

#include <cstdlib>
#include <filesystem>

namespace kiln::cli {
namespace fs = std::filesystem;
namespace {

// The checkpoint as transformers saved it (scripts/demo/train_demo.py); golden.* beside
// them are the family test's, not the model's.
constexpr const char* kFiles[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                  "tokenizer_config.json"};

}  // namespace

std::string demo_model_dir() {
  if (const char* v = std::getenv("KILN_DEMO_MODEL"); v && *v) return v;
  return KILN_DEMO_MODEL_DIR;
}

Result<std::string> ensure_demo_model() {
  const std::string dir = demo_model_dir();
  std::error_code ec;
  for (const char* f : kFiles) {
    if (!fs::exists(fs::path(dir) / f, ec)) {
      return not_found("the built-in demo model is not complete at " + dir + " (missing " + f +
                       "): it ships in kiln's source tree as models/kiln-demo; set KILN_DEMO_MODEL to where it is, "
                       "or give a model directory");
    }
  }
  return dir;
}

Status copy_demo_model(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(const std::string from, ensure_demo_model());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return internal_error("cannot create " + dir + ": " + ec.message());
  for (const char* f : kFiles) {
    fs::copy_file(fs::path(from) / f, fs::path(dir) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return internal_error(std::string("cannot copy ") + f + " into " + dir + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace kiln::cli
