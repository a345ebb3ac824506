// A fresh directory under /tmp for a test, removed with everything in it at scope exit.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "core/check.h"

namespace kiln::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "kiln_test") {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    KILN_CHECK(::mkdtemp(tmpl.data()) != nullptr) << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kiln::testing
