// safetensors: the checkpoint format of every model kiln loads.
//
// File layout: [u64 LE N][N bytes UTF-8 JSON header][data section]. The header maps
// tensor name -> {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} with
// offsets relative to the data section (byte 8 + N), plus an optional
// "__metadata__": {string: string}. Reference: github.com/huggingface/safetensors.
//
// Reading is zero-copy: the whole file is mmapped read-only and get() returns views
// into the mapping. Everything a file can get wrong is a Status (kCorrupt, or
// kUnsupported for a valid dtype kiln cannot hold); nothing is read out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln::formats {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::string file;     // path of the .safetensors file holding it
  uint64_t offset = 0;  // byte offset of the data from the start of the file
  uint64_t nbytes = 0;
};

// One mmapped .safetensors file. Tensors returned by get() are views into the
// mapping (Tensor::owner keeps the mapping alive, so they outlive the object).
// The mapping is PROT_READ: writing through a view faults.
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const TensorInfo* find(const std::string& name) const;
  // Zero-copy host view; `info` must come from this file's tensors(). The data
  // may be unaligned (offsets in real files are not padded): read with memcpy.
  Tensor get(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }  // "__metadata__"
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<void> mapping_;  // munmaps in its deleter
  uint64_t file_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;  // name -> index in tensors_
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory, resolved as transformers does: model.safetensors if present;
// else the shards named by model.safetensors.index.json ("weight_map": tensor -> shard
// file); else every *.safetensors file in the directory. A tensor may live in one file
// only. Copies share the mapped files.
class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& dir);

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // kNotFound naming the tensor and the directory if missing.
  Result<Tensor> get(const std::string& name) const;
  // Like get(), but also checks the shape: kCorrupt naming the tensor, the expected
  // and the actual shape.
  Result<Tensor> get(const std::string& name, const Shape& expected_shape) const;
  const TensorInfo* info(const std::string& name) const;  // null if missing
  std::vector<std::string> names() const;                 // sorted
  uint64_t total_bytes() const { return total_bytes_; }   // sum of tensor data bytes
  const std::string& dir() const { return dir_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  // Serves the tensors named from + X as to + X (a vision-language checkpoint's language
  // model, "model.language_model.X", as "model.X"); the other names stay.
  void rename_prefix(const std::string& from, const std::string& to);

 private:
  struct Entry {
    const SafetensorsFile* file;  // owned by files_
    const TensorInfo* info;       // points into file->tensors()
  };
  Status add_file(std::shared_ptr<SafetensorsFile> file);

  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;
  uint64_t total_bytes_ = 0;
};

// Writes a .safetensors file: header 8-byte LE length + JSON + data, data offsets
// in the given order with no gaps, header padded with spaces to a multiple of 8 as
// the Rust library does. Tensors must be host tensors of a dtype safetensors names
// (not the packed 4-bit types); names must be unique. Used for demo models and tests.
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Writes <dir>/model.safetensors.index.json for a sharded checkpoint (tests).
Status write_safetensors_index(const std::string& dir,
                               const std::map<std::string, std::string>& weight_map);

// "BF16" -> DType::kBF16. kUnsupported for strings kiln cannot hold (U16, F4, ...).
Result<DType> dtype_from_safetensors(std::string_view s);
// DType::kBF16 -> "BF16"; "" for the packed 4-bit types, which have no safetensors name
// kiln writes.
std::string_view dtype_to_safetensors(DType t);

}  // namespace kiln::formats
