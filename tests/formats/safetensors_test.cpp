#include "formats/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>

#include <gtest/gtest.h>

#include "temp_dir.h"

namespace kiln::formats {
namespace {


using testing::TempDir;

// Host tensor with a byte pattern that differs per tensor (seed) and per byte, never
// all zero. BOOL gets 0/1 bytes since other values are not valid bools.
Tensor pattern_tensor(DType dtype, Shape shape, int seed) {
  Tensor t = host_tensor(dtype, shape);
  auto* p = t.as<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) {
    const uint8_t b = uint8_t(i * 131 + size_t(seed) * 29 + 7);
    p[i] = dtype == DType::kBool ? uint8_t((i + size_t(seed)) % 3 != 0) : b;
  }
  return t;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

uint64_t header_len_of(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  return n;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

// Corrupts a valid file in place: replaces the first `from` in its JSON header by `to`,
// rewrites the header length to match and keeps the data section byte for byte.
void edit_header(const std::string& path, const std::string& from, const std::string& to) {
  const std::string bytes = read_bytes(path);
  const uint64_t n = header_len_of(bytes);
  std::string header = bytes.substr(8, n);
  const size_t at = header.find(from);
  ASSERT_NE(at, std::string::npos) << "'" << from << "' not in header " << header;
  header.replace(at, from.size(), to);
  write_bytes(path, le64(header.size()) + header + bytes.substr(8 + n));
}

// alpha: [2, 3] f32 at data [0, 24); beta: [4] bf16 at data [24, 32).
void write_two(const std::string& path) {
  ASSERT_TRUE(write_safetensors(path, {{"alpha", pattern_tensor(DType::kF32, {2, 3}, 1)},
                                       {"beta", pattern_tensor(DType::kBF16, {4}, 2)}})
                  .ok());
}

void expect_error(const Status& s, StatusCode code, std::initializer_list<std::string> words) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& w : words)
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s.message();
}

Status open_status(const std::string& path) { return SafetensorsFile::open(path).status(); }

TEST(Safetensors, RoundTripKeepsDtypesShapesAndBytes) {
  TempDir dir("kiln_safetensors");
  // Odd-sized u8 and bool tensors first so later tensors start unaligned, as in real files.
  std::vector<std::pair<std::string, Tensor>> in = {
      {"u8.odd", pattern_tensor(DType::kU8, {3}, 1)},
      {"bool", pattern_tensor(DType::kBool, {5}, 2)},
      {"f32", pattern_tensor(DType::kF32, {2, 3}, 3)},
      {"f64", pattern_tensor(DType::kF64, {3}, 4)},
      {"f16", pattern_tensor(DType::kF16, {2, 2, 2}, 5)},
      {"bf16", pattern_tensor(DType::kBF16, {7, 1}, 6)},
      {"f8_e4m3", pattern_tensor(DType::kF8E4M3, {4, 4}, 7)},
      {"f8_e5m2", pattern_tensor(DType::kF8E5M2, {9}, 8)},
      {"e8m0", pattern_tensor(DType::kE8M0, {2, 5}, 9)},
      {"i64.scalar", pattern_tensor(DType::kI64, {}, 10)},
      {"i32", pattern_tensor(DType::kI32, {1, 2, 3, 1, 2, 1}, 11)},
      {"i16", pattern_tensor(DType::kI16, {6}, 12)},
      {"i8", pattern_tensor(DType::kI8, {11}, 13)},
      {"empty", pattern_tensor(DType::kF32, {0, 4}, 14)},
  };
  const std::string path = dir.file("model.safetensors");
  ASSERT_TRUE(write_safetensors(path, in).ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const auto& infos = (*file)->tensors();
  ASSERT_EQ(infos.size(), in.size());
  uint64_t data_start = 8 + header_len_of(read_bytes(path));
  uint64_t expected_offset = data_start;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& [name, t] = in[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(infos[i].name, name);  // header order is write order
    EXPECT_EQ(infos[i].dtype, t.dtype);
    EXPECT_EQ(infos[i].shape, t.shape);
    EXPECT_EQ(infos[i].file, path);
    EXPECT_EQ(infos[i].offset, expected_offset);
    EXPECT_EQ(infos[i].nbytes, t.nbytes());
    expected_offset += t.nbytes();
    ASSERT_EQ((*file)->find(name), &infos[i]);
    Tensor v = (*file)->get(infos[i]);
    EXPECT_EQ(v.device, Device::kHost);
    EXPECT_EQ(v.dtype, t.dtype);
    EXPECT_EQ(v.shape, t.shape);
    EXPECT_NE(v.owner, nullptr);
    EXPECT_EQ(std::memcmp(v.data, t.data, t.nbytes()), 0);
  }
  EXPECT_EQ((*file)->find("absent"), nullptr);
  EXPECT_EQ((*file)->file_size(), expected_offset);
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(Safetensors, ViewsOutliveTheFileObject) {
  TempDir dir("kiln_safetensors");
  Tensor src = pattern_tensor(DType::kBF16, {16, 8}, 3);
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), {{"w", src}}).ok());
  Tensor view;
  {
    auto file = SafetensorsFile::open(dir.file("a.safetensors"));
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    view = (*file)->get((*file)->tensors().at(0));
  }
  EXPECT_EQ(std::memcmp(view.data, src.data, src.nbytes()), 0);
}

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir("kiln_safetensors");
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"note", "caf\xc3\xa9 \"quoted\""}};
  ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"),
                                {{"x", pattern_tensor(DType::kI32, {3}, 5)}}, meta)
                  .ok());
  auto file = SafetensorsFile::open(dir.file("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata(), meta);
  ASSERT_EQ((*file)->tensors().size(), 1u);
  EXPECT_EQ((*file)->tensors()[0].name, "x");
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToAMultipleOf8) {
  TempDir dir("kiln_safetensors");
  for (int len = 1; len <= 8; ++len) {  // name lengths covering every residue mod 8
    const std::string path = dir.file("p" + std::to_string(len) + ".safetensors");
    ASSERT_TRUE(write_safetensors(
                    path, {{std::string(size_t(len), 'n'), pattern_tensor(DType::kU8, {1}, len)}})
                    .ok());
    const std::string bytes = read_bytes(path);
    const uint64_t n = header_len_of(bytes);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 1);
    const std::string header = bytes.substr(8, n);
    const size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos)
        << "padding is not spaces: " << header;
  }
}

TEST(Safetensors, DtypeStringsMapBothWays) {
  const std::pair<const char*, DType> table[] = {
      {"F64", DType::kF64},      {"F32", DType::kF32},        {"F16", DType::kF16},
      {"BF16", DType::kBF16},    {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2},
      {"F8_E8M0", DType::kE8M0}, {"I64", DType::kI64},        {"I32", DType::kI32},
      {"I16", DType::kI16},      {"I8", DType::kI8},          {"U8", DType::kU8},
      {"BOOL", DType::kBool},
  };
  for (const auto& [s, t] : table) {
    auto r = dtype_from_safetensors(s);
    ASSERT_TRUE(r.ok()) << s;
    EXPECT_EQ(*r, t) << s;
    EXPECT_EQ(dtype_to_safetensors(t), s);
  }
  for (const char* s : {"U16", "U32", "U64", "F4", "f32", ""}) {
    auto r = dtype_from_safetensors(s);
    EXPECT_FALSE(r.ok()) << s;
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << s;
  }
  EXPECT_EQ(dtype_to_safetensors(DType::kE2M1), "");
}

TEST(Safetensors, ShardedCheckpointWithIndexLoadsBothShards) {
  TempDir dir("kiln_safetensors");
  Tensor a = pattern_tensor(DType::kBF16, {4, 8}, 1);
  Tensor b = pattern_tensor(DType::kF32, {8}, 2);
  Tensor c = pattern_tensor(DType::kI64, {2}, 3);
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(write_safetensors(dir.file(s1), {{"layers.0.w", a}, {"embed", b}}).ok());
  ASSERT_TRUE(write_safetensors(dir.file(s2), {{"layers.1.w", c}}).ok());
  ASSERT_TRUE(
      write_safetensors_index(dir.path(), {{"layers.0.w", s1}, {"embed", s1}, {"layers.1.w", s2}})
          .ok());

  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"embed", "layers.0.w", "layers.1.w"}));
  EXPECT_EQ(ckpt->total_bytes(), a.nbytes() + b.nbytes() + c.nbytes());
  EXPECT_EQ(ckpt->dir(), dir.path());
  EXPECT_TRUE(ckpt->has("embed"));
  EXPECT_FALSE(ckpt->has("lm_head"));
  ASSERT_NE(ckpt->info("layers.1.w"), nullptr);
  EXPECT_EQ(ckpt->info("layers.1.w")->file, dir.file(s2));
  EXPECT_EQ(ckpt->info("lm_head"), nullptr);
  const std::vector<std::pair<std::string, Tensor>> expected = {
      {"layers.0.w", a}, {"embed", b}, {"layers.1.w", c}};
  for (const auto& [name, src] : expected) {
    auto t = ckpt->get(name, src.shape);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->dtype, src.dtype) << name;
    EXPECT_EQ(std::memcmp(t->data, src.data, src.nbytes()), 0) << name;
  }
}

TEST(Safetensors, CheckpointWithoutIndexUsesEverySafetensorsFile) {
  TempDir dir("kiln_safetensors");
  Tensor a = pattern_tensor(DType::kF16, {3, 3}, 4);
  Tensor b = pattern_tensor(DType::kU8, {5}, 5);
  ASSERT_TRUE(write_safetensors(dir.file("part-a.safetensors"), {{"a", a}}).ok());
  ASSERT_TRUE(write_safetensors(dir.file("part-b.safetensors"), {{"b", b}}).ok());
  write_bytes(dir.file("README.md"), "not a checkpoint");
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b"}));
  auto t = ckpt->get("b");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(std::memcmp(t->data, b.data, b.nbytes()), 0);
  EXPECT_EQ(ckpt->total_bytes(), a.nbytes() + b.nbytes());
}

TEST(Safetensors, CheckpointPrefersModelSafetensorsOverOtherFiles) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(
      write_safetensors(dir.file("model.safetensors"), {{"w", pattern_tensor(DType::kF32, {2}, 1)}})
          .ok());
  // Mistral-style repos ship a second, differently named copy beside it.
  ASSERT_TRUE(write_safetensors(dir.file("consolidated.safetensors"),
                                {{"w", pattern_tensor(DType::kF32, {2}, 2)}})
                  .ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->info("w")->file, dir.file("model.safetensors"));
}

// --- corrupt files: every case is a Status naming the file or tensor and the problem ---

TEST(Safetensors, FileShorterThan8BytesIsCorrupt) {
  TempDir dir("kiln_safetensors");
  write_bytes(dir.file("short.safetensors"), "\x05\x01\x02");
  expect_error(open_status(dir.file("short.safetensors")), StatusCode::kCorrupt,
               {"short.safetensors", "shorter", "3"});
}

TEST(Safetensors, MissingFileIsNotFound) {
  TempDir dir("kiln_safetensors");
  expect_error(open_status(dir.file("nope.safetensors")), StatusCode::kNotFound,
               {"nope.safetensors"});
}

TEST(Safetensors, TruncatedDataIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("t.safetensors");
  write_two(path);
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 5));  // cuts into beta
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"t.safetensors", "'beta'", "truncated", "32"});
}

TEST(Safetensors, HeaderLengthPastEndOfFileIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("h.safetensors");
  write_two(path);
  std::string bytes = read_bytes(path);
  bytes.replace(0, 8, le64(bytes.size()));  // one header longer than everything after byte 8
  write_bytes(path, bytes);
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"h.safetensors", "header length", "past the end", std::to_string(bytes.size())});
}

TEST(Safetensors, AbsurdHeaderLengthIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("h.safetensors");
  write_two(path);
  std::string bytes = read_bytes(path);
  bytes.replace(0, 8, le64(0xffffffffffffull));
  write_bytes(path, bytes);
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"h.safetensors", "absurdly large", "281474976710655"});
}

TEST(Safetensors, InvalidJsonHeaderIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("j.safetensors");
  write_two(path);
  edit_header(path, "\"beta\":{", "\"beta\":{{");
  expect_error(open_status(path), StatusCode::kCorrupt, {"j.safetensors", "not valid JSON"});
}

TEST(Safetensors, HeaderThatIsNotAnObjectIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("j.safetensors");
  write_bytes(path, le64(8) + "[1, 2]  ");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"j.safetensors", "array", "not an object"});
}

TEST(Safetensors, EntryMissingDataOffsetsIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("e.safetensors");
  write_two(path);
  edit_header(path, ",\"data_offsets\":[24,32]", "");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"e.safetensors", "'beta'", "missing", "data_offsets"});
}

TEST(Safetensors, EntryWithWrongJsonTypesIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("e.safetensors");
  write_two(path);
  edit_header(path, "\"shape\":[4]", "\"shape\":\"4\"");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"e.safetensors", "'beta'", "shape", "not an array"});
  write_two(path);
  edit_header(path, "\"dtype\":\"F32\"", "\"dtype\":32");
  expect_error(open_status(path), StatusCode::kCorrupt, {"'alpha'", "dtype", "not a string"});
  write_two(path);
  edit_header(path, "[24,32]", "[24,\"32\"]");
  expect_error(open_status(path), StatusCode::kCorrupt, {"'beta'", "data_offsets", "integers"});
}

TEST(Safetensors, NegativeDimIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("d.safetensors");
  write_two(path);
  edit_header(path, "\"shape\":[2,3]", "\"shape\":[-2,-3]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"d.safetensors", "'alpha'", "negative dim", "-2"});
}

TEST(Safetensors, NonIntegerDimIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("d.safetensors");
  write_two(path);
  edit_header(path, "\"shape\":[2,3]", "\"shape\":[2,3.5]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"d.safetensors", "'alpha'", "non-integer dim", "3.5"});
}

TEST(Safetensors, UnknownDtypeIsUnsupported) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("q.safetensors");
  write_two(path);
  edit_header(path, "\"BF16\"", "\"Q7\"");
  expect_error(open_status(path), StatusCode::kUnsupported,
               {"q.safetensors", "'beta'", "dtype", "Q7"});
  write_two(path);
  edit_header(path, "\"BF16\"", "\"U16\"");
  expect_error(open_status(path), StatusCode::kUnsupported, {"'beta'", "U16"});
}

TEST(Safetensors, OverlappingOffsetsAreCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("o.safetensors");
  write_two(path);
  edit_header(path, "[24,32]", "[20,28]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"o.safetensors", "'alpha'", "'beta'", "overlap", "20"});
}

TEST(Safetensors, OffsetsPastTheDataSectionAreCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("r.safetensors");
  write_two(path);
  edit_header(path, "\"shape\":[4],\"data_offsets\":[24,32]",
              "\"shape\":[40],\"data_offsets\":[24,104]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"r.safetensors", "'beta'", "past the data section", "104"});
}

TEST(Safetensors, OffsetsWithBeginAfterEndAreCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("r.safetensors");
  write_two(path);
  edit_header(path, "[24,32]", "[32,24]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"r.safetensors", "'beta'", "begin 32 > end 24"});
}

TEST(Safetensors, ByteSizeNotMatchingShapeIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("s.safetensors");
  write_two(path);
  edit_header(path, "\"shape\":[2,3]", "\"shape\":[2,4]");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"s.safetensors", "'alpha'", "size mismatch", "24", "32"});
}

TEST(Safetensors, ShapeWhoseElementCountOverflowsIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("s.safetensors");
  write_two(path);
  // 2^32 * 2^32 wraps to 0 in u64; it must not pass as a zero-size tensor.
  edit_header(path, "\"shape\":[4],\"data_offsets\":[24,32]",
              "\"shape\":[4294967296,4294967296],\"data_offsets\":[32,32]");
  expect_error(open_status(path), StatusCode::kCorrupt, {"'beta'", "too large"});
}

TEST(Safetensors, NonStringMetadataIsCorrupt) {
  TempDir dir("kiln_safetensors");
  const std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(
      write_safetensors(path, {{"x", pattern_tensor(DType::kU8, {2}, 1)}}, {{"format", "pt"}})
          .ok());
  edit_header(path, "\"pt\"", "7");
  expect_error(open_status(path), StatusCode::kCorrupt,
               {"m.safetensors", "__metadata__", "format", "not a string"});
}

// --- checkpoint directories ---

TEST(Safetensors, MissingDirectoryIsNotFound) {
  TempDir dir("kiln_safetensors");
  expect_error(Checkpoint::open(dir.file("absent")).status(), StatusCode::kNotFound,
               {"absent", "does not exist"});
}

TEST(Safetensors, DirectoryWithoutSafetensorsIsNotFound) {
  TempDir dir("kiln_safetensors");
  write_bytes(dir.file("config.json"), "{}");
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kNotFound,
               {dir.path(), "no .safetensors"});
}

TEST(Safetensors, IndexWithoutWeightMapIsCorrupt) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(
      write_safetensors(dir.file("s1.safetensors"), {{"a", pattern_tensor(DType::kF32, {2}, 1)}})
          .ok());
  write_bytes(dir.file("model.safetensors.index.json"), "{\"metadata\": {}}");
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt,
               {"index.json", "weight_map"});
  write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": {\"a\": ");
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt,
               {"index.json", "not valid JSON"});
}

TEST(Safetensors, MissingShardIsNotFound) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(
      write_safetensors(dir.file("s1.safetensors"), {{"a", pattern_tensor(DType::kF32, {2}, 1)}})
          .ok());
  ASSERT_TRUE(
      write_safetensors_index(dir.path(), {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}).ok());
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kNotFound,
               {"missing shard s2.safetensors", "tensor 'b'"});
}

TEST(Safetensors, TensorInIndexButNotInShardIsCorrupt) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(
      write_safetensors(dir.file("s1.safetensors"), {{"a", pattern_tensor(DType::kF32, {2}, 1)}})
          .ok());
  ASSERT_TRUE(
      write_safetensors_index(dir.path(), {{"a", "s1.safetensors"}, {"ghost", "s1.safetensors"}})
          .ok());
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt,
               {"s1.safetensors", "'ghost'", "absent"});
}

TEST(Safetensors, SameTensorInTwoFilesIsCorrupt) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(
      write_safetensors(dir.file("s1.safetensors"), {{"a", pattern_tensor(DType::kF32, {2}, 1)}})
          .ok());
  ASSERT_TRUE(
      write_safetensors(dir.file("s2.safetensors"), {{"a", pattern_tensor(DType::kF32, {2}, 2)},
                                                     {"b", pattern_tensor(DType::kF32, {2}, 3)}})
          .ok());
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt,
               {"'a'", "two files", "s1.safetensors", "s2.safetensors"});
  // With an index too: b's shard also holds a, which the index puts in s1.
  ASSERT_TRUE(
      write_safetensors_index(dir.path(), {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}).ok());
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt, {"'a'", "two files"});
}

TEST(Safetensors, ShardNameLeavingTheDirectoryIsCorrupt) {
  TempDir dir("kiln_safetensors");
  ASSERT_TRUE(write_safetensors_index(dir.path(), {{"a", "../elsewhere.safetensors"}}).ok());
  expect_error(Checkpoint::open(dir.path()).status(), StatusCode::kCorrupt,
               {"elsewhere.safetensors", "'a'"});
}

TEST(Safetensors, MissingTensorIsNotFoundNamingTensorAndDirectory) {
  TempDir dir("kiln_safetensors");
  write_two(dir.file("model.safetensors"));
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  expect_error(ckpt->get("lm_head.weight").status(), StatusCode::kNotFound,
               {"'lm_head.weight'", "not found", dir.path()});
}

TEST(Safetensors, ShapeMismatchNamesTensorAndBothShapes) {
  TempDir dir("kiln_safetensors");
  write_two(dir.file("model.safetensors"));
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_TRUE(ckpt->get("alpha", {2, 3}).ok());
  expect_error(ckpt->get("alpha", {3, 2}).status(), StatusCode::kCorrupt,
               {"'alpha'", "shape mismatch", "expected [3, 2]", "got [2, 3]"});
}

TEST(Safetensors, WriterRejectsDuplicateNamesAndDeviceTensors) {
  TempDir dir("kiln_safetensors");
  Tensor a = pattern_tensor(DType::kF32, {2}, 1);
  expect_error(write_safetensors(dir.file("w.safetensors"), {{"a", a}, {"a", a}}),
               StatusCode::kInvalidArgument, {"'a'", "duplicate"});
  Tensor dev = a;
  dev.device = Device::kCuda;
  expect_error(write_safetensors(dir.file("w.safetensors"), {{"d", dev}}),
               StatusCode::kInvalidArgument, {"'d'", "host"});
  expect_error(
      write_safetensors(dir.file("w.safetensors"), {{"q", host_tensor(DType::kE2M1, {4})}}),
      StatusCode::kUnsupported, {"'q'", "e2m1"});
}

}  // namespace
}  // namespace kiln::formats
