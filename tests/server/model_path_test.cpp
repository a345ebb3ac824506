// `kiln serve MODEL`: a checkpoint directory, or an org/name id found in the local Hugging
// Face cache (refs/main -> snapshots/<commit>), with an error that lists where it looked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/model_path.h"

namespace kiln::cli {
namespace {
namespace fs = std::filesystem;

class ModelPath : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln_model_path_" + std::to_string(::getpid()));
    fs::create_directories(root_);
    ::setenv("HF_HUB_CACHE", (root_ / "hub").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("HF_HUB_CACHE");
    fs::remove_all(root_);
  }
  fs::path snapshot(const std::string& repo, const std::string& commit) {
    const fs::path p = root_ / "hub" / repo / "snapshots" / commit;
    fs::create_directories(p);
    std::ofstream(p / "config.json") << "{}";
    return p;
  }
  fs::path root_;
};

TEST_F(ModelPath, ADirectoryIsTakenAsIs) {
  const fs::path d = snapshot("models--x--y", "abc");
  auto r = resolve_model_dir(d.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, d.string());
  fs::create_directories(root_ / "empty");
  EXPECT_EQ(resolve_model_dir((root_ / "empty").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(ModelPath, AHubIdFollowsRefsMain) {
  snapshot("models--Qwen--Qwen3-30B-A3B", "old");
  const fs::path want = snapshot("models--Qwen--Qwen3-30B-A3B", "0123abcd");
  fs::create_directories(root_ / "hub/models--Qwen--Qwen3-30B-A3B/refs");
  std::ofstream(root_ / "hub/models--Qwen--Qwen3-30B-A3B/refs/main") << "0123abcd\n";
  auto r = resolve_model_dir("Qwen/Qwen3-30B-A3B");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, want.string());
}

TEST_F(ModelPath, ASingleSnapshotNeedsNoRef) {
  const fs::path want = snapshot("models--openai--gpt-oss-20b", "feed");
  auto r = resolve_model_dir("openai/gpt-oss-20b");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, want.string());
  ::unsetenv("HF_HUB_CACHE");
  ::setenv("HF_HOME", root_.c_str(), 1);  // HF_HOME/hub when HF_HUB_CACHE is unset
  EXPECT_TRUE(resolve_model_dir("openai/gpt-oss-20b").ok());
  ::unsetenv("HF_HOME");
}

TEST_F(ModelPath, AMissingModelSaysWhereKilnLooked) {
  auto r = resolve_model_dir("nobody/nothing");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find((root_ / "hub/models--nobody--nothing/refs/main").string()), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("does not download"), std::string::npos);
  EXPECT_FALSE(resolve_model_dir("not-a-dir-or-id").ok());
}

}  // namespace
}  // namespace kiln::cli
