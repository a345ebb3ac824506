// The "did you mean" of a mistyped flag or command (cli/parse_errors.h).
#include "cli/parse_errors.h"

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(edit_distance("port", "port"), 0u);
  EXPECT_EQ(edit_distance("prot", "port"), 1u);  // one swap of neighbours
  EXPECT_EQ(edit_distance("pot", "port"), 1u);
  EXPECT_EQ(edit_distance("portt", "port"), 1u);
  EXPECT_EQ(edit_distance("pert", "port"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);  // optimal string alignment: no edit of a swapped pair
}

TEST(NearestName, SuggestsANearMissOnly) {
  const std::vector<std::string> serve = {"help", "model", "port", "host", "max-num-seqs", "max-model-len", "tp", "pp"};
  EXPECT_EQ(nearest_name("prot", serve), "port");
  EXPECT_EQ(nearest_name("hots", serve), "host");
  EXPECT_EQ(nearest_name("modle", serve), "model");
  EXPECT_EQ(nearest_name("max-num-seq", serve), "max-num-seqs");
  EXPECT_EQ(nearest_name("max-modl-len", serve), "max-model-len");
  EXPECT_EQ(nearest_name("frobnicate", serve), "");
  EXPECT_EQ(nearest_name("pork", serve), "port");
  EXPECT_EQ(nearest_name("park", serve), "");  // two edits from port: too far for a short name
  EXPECT_EQ(nearest_name("tq", serve), "tp");
  EXPECT_EQ(nearest_name("xp", serve), "tp");  // a tie (tp, pp at one edit) goes to the first
  EXPECT_EQ(nearest_name("anything", {}), "");
}

}  // namespace
}  // namespace kiln::cli
