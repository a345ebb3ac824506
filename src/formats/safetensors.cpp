#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_bounded.h"

namespace kiln::formats {
namespace {

namespace fs = std::filesystem;
// ordered_json keeps the header's key order, so tensors() is in file order.
using Json = nlohmann::ordered_json;

// The Rust library refuses headers above 100 MB (MAX_HEADER_SIZE); so do we, so that a
// garbage length never makes us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F64", DType::kF64},      {"F32", DType::kF32},        {"F16", DType::kF16},
    {"BF16", DType::kBF16},    {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2},
    {"F8_E8M0", DType::kE8M0}, {"I64", DType::kI64},        {"I32", DType::kI32},
    {"I16", DType::kI16},      {"I8", DType::kI8},          {"U8", DType::kU8},
    {"BOOL", DType::kBool},
};

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string errno_text() { return std::strerror(errno); }

// Parsed but not yet validated against the file size.
struct RawEntry {
  TensorInfo info;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};

// Parses one header entry; `where` is "<path>: tensor 'name'".
Status parse_entry(const std::string& where, const Json& v, RawEntry& out) {
  if (!v.is_object()) return corrupt(where + ": entry is " + v.type_name() + ", not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) return corrupt(where + ": entry missing \"" + key + "\"");

  const Json& dtype = v.at("dtype");
  if (!dtype.is_string())
    return corrupt(where + ": \"dtype\" is " + dtype.type_name() + ", not a string");
  const std::string dtype_str = dtype.get<std::string>();
  Result<DType> dt = dtype_from_safetensors(dtype_str);
  if (!dt.ok()) return dt.status().with_context(where);
  out.info.dtype = *dt;

  const Json& shape = v.at("shape");
  if (!shape.is_array())
    return corrupt(where + ": \"shape\" is " + shape.type_name() + ", not an array");
  if (shape.size() > size_t(kMaxRank))
    return unsupported(where + ": rank " + std::to_string(shape.size()) +
                       " exceeds kiln's max rank " + std::to_string(kMaxRank));
  // numel and bytes in u64 with overflow checks: a hostile shape must not wrap around
  // into a size that happens to match data_offsets.
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const Json& d = shape[i];
    if (d.is_number_integer() && !d.is_number_unsigned())
      return corrupt(where + ": negative dim " + d.dump() + " at index " + std::to_string(i) +
                     " of shape " + shape.dump());
    if (!d.is_number_unsigned())
      return corrupt(where + ": non-integer dim " + d.dump() + " at index " + std::to_string(i) +
                     " of shape " + shape.dump());
    const uint64_t x = d.get<uint64_t>();
    if (x > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
    overflow |= __builtin_mul_overflow(numel, x, &numel);
    out.info.shape.push_back(int64_t(x));
  }
  const uint64_t bits = uint64_t(dtype_bits(out.info.dtype));
  uint64_t nbits = 0;
  overflow |= __builtin_mul_overflow(numel, bits, &nbits);
  if (overflow || numel > uint64_t(std::numeric_limits<int64_t>::max()))
    return corrupt(where + ": shape " + shape.dump() + " is too large (element count overflows)");
  out.info.nbytes = (nbits + 7) / 8;

  const Json& offs = v.at("data_offsets");
  if (!offs.is_array() || offs.size() != 2)
    return corrupt(where + ": \"data_offsets\" is " + offs.dump() + ", not [begin, end]");
  for (const Json& o : offs)
    if (!o.is_number_unsigned())
      return corrupt(where + ": \"data_offsets\" " + offs.dump() +
                     " are not non-negative integers");
  out.begin = offs[0].get<uint64_t>();
  out.end = offs[1].get<uint64_t>();
  if (out.begin > out.end)
    return corrupt(where + ": data_offsets begin " + std::to_string(out.begin) + " > end " +
                   std::to_string(out.end));
  // Sub-byte types would round up; every dtype we read is whole bytes, so demand equality.
  if (bits >= 8 && out.end - out.begin != out.info.nbytes)
    return corrupt(where + ": size mismatch: data_offsets [" + std::to_string(out.begin) + ", " +
                   std::to_string(out.end) + ") hold " + std::to_string(out.end - out.begin) +
                   " bytes but shape " + out.info.shape.to_string() + " " + dtype_str + " needs " +
                   std::to_string(out.info.nbytes));
  return Status::Ok();
}

Status parse_metadata(const std::string& path, const Json& v,
                      std::map<std::string, std::string>& out) {
  if (!v.is_object())
    return corrupt(path + ": \"__metadata__\" is " + v.type_name() + ", not an object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      return corrupt(path + ": \"__metadata__\" value of " + in_quotes(key) + " is " +
                     value.type_name() + ", not a string");
    out[key] = value.get<std::string>();
  }
  return Status::Ok();
}

// Reads a whole small text file (the index JSON).
Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open: " + errno_text());
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) return internal_error(path + ": read failed: " + errno_text());
  return os.str();
}

Status write_all(const std::string& path, const std::string& head,
                 const std::vector<const Tensor*>& data) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return invalid_argument(path + ": cannot create: " + errno_text());
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  for (const Tensor* t : data) {
    if (!ok) break;
    const size_t n = t->nbytes();
    if (n) ok = std::fwrite(t->data, 1, n, f) == n;
  }
  const int saved_errno = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    errno = saved_errno;
    return internal_error(path + ": write failed: " + errno_text());
  }
  return Status::Ok();
}

}  // namespace

Result<DType> dtype_from_safetensors(std::string_view s) {
  for (const DTypeName& d : kDTypeNames)
    if (d.name == s) return d.dtype;
  return unsupported("unsupported safetensors dtype \"" + std::string(s) + "\"");
}

std::string_view dtype_to_safetensors(DType t) {
  for (const DTypeName& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  return {};
}

// ---------------------------------------------------------------------------------------
// SafetensorsFile

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = internal_error(path + ": fstat failed: " + errno_text());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    return corrupt(path + ": file is " + std::to_string(size) +
                   " bytes, shorter than the 8-byte header length");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (p == MAP_FAILED) {
    errno = mmap_errno;
    return internal_error(path + ": mmap of " + std::to_string(size) +
                          " bytes failed: " + errno_text());
  }

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->file_size_ = size;
  file->mapping_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  const auto* bytes = static_cast<const uint8_t*>(p);

  uint64_t header_len = 0;  // little-endian on disk, whatever the host
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes)
    return corrupt(path + ": header length " + std::to_string(header_len) +
                   " is absurdly large (limit " + std::to_string(kMaxHeaderBytes) + ")");
  if (header_len > size - 8)
    return corrupt(path + ": header length " + std::to_string(header_len) +
                   " runs past the end of the file (" + std::to_string(size) +
                   " bytes, so at most " + std::to_string(size - 8) + ")");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = size - data_start;

  std::string why;
  const Json header = parse_json_explained<Json>(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_len), &why);
  if (!why.empty()) return corrupt(path + ": header (" + std::to_string(header_len) + " bytes): " + why);
  if (!header.is_object())
    return corrupt(path + ": header is a JSON " + header.type_name() + ", not an object");

  std::vector<RawEntry> raw;
  raw.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      KILN_RETURN_IF_ERROR(parse_metadata(path, value, file->metadata_));
      continue;
    }
    RawEntry e;
    e.info.name = name;
    e.info.file = path;
    KILN_RETURN_IF_ERROR(parse_entry(path + ": tensor " + in_quotes(name), value, e));
    if (e.end > data_bytes)
      return corrupt(path + ": tensor " + in_quotes(name) + ": truncated: data_offsets end " +
                     std::to_string(e.end) + " is past the data section (8 + " +
                     std::to_string(header_len) + " + " + std::to_string(e.end) + " = " +
                     std::to_string(data_start + e.end) + " > file size " + std::to_string(size) +
                     ")");
    e.info.offset = data_start + e.begin;
    raw.push_back(std::move(e));
  }

  // Overlap: sort by begin and compare with the furthest end seen so far. Zero-size
  // tensors occupy no bytes and cannot overlap anything.
  std::vector<size_t> order(raw.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return raw[a].begin < raw[b].begin; });
  const RawEntry* furthest = nullptr;
  for (size_t i : order) {
    const RawEntry& e = raw[i];
    if (e.begin == e.end) continue;
    if (furthest && e.begin < furthest->end)
      return corrupt(path + ": tensors " + in_quotes(furthest->info.name) + " [" +
                     std::to_string(furthest->begin) + ", " + std::to_string(furthest->end) +
                     ") and " + in_quotes(e.info.name) + " [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + ") overlap");
    if (!furthest || e.end > furthest->end) furthest = &e;
  }

  file->tensors_.reserve(raw.size());
  for (RawEntry& e : raw) {
    file->by_name_[e.info.name] = file->tensors_.size();
    file->tensors_.push_back(std::move(e.info));
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::get(const TensorInfo& info) const {
  // open() validated every entry, so a violation here is a caller passing a foreign info.
  KILN_CHECK(info.file == path_) << "tensor " << info.name << " is from " << info.file << ", not "
                                 << path_;
  KILN_CHECK(info.offset <= file_size_ && info.nbytes <= file_size_ - info.offset)
      << info.name << " [" << info.offset << ", +" << info.nbytes << ") in " << file_size_
      << " bytes";
  Tensor t;
  // The mapping is read-only; Tensor::data is non-const because owned tensors are writable.
  t.data = static_cast<char*>(mapping_.get()) + info.offset;
  t.dtype = info.dtype;
  t.shape = info.shape;
  t.device = Device::kHost;
  t.owner = mapping_;
  return t;
}

// ---------------------------------------------------------------------------------------
// Checkpoint

Status Checkpoint::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (const TensorInfo& info : file->tensors()) {
    auto [it, inserted] = entries_.emplace(info.name, Entry{file.get(), &info});
    if (!inserted)
      return corrupt(dir_ + ": tensor " + in_quotes(info.name) +
                     " is in two files: " + it->second.info->file + " and " + info.file);
    total_bytes_ += info.nbytes;
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (fs::exists(dir, ec)) return invalid_argument(dir + ": not a directory");
    return not_found(dir + ": checkpoint directory does not exist");
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const fs::path root(dir);

  if (fs::is_regular_file(root / kSingleName, ec)) {
    KILN_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open((root / kSingleName).string()));
    KILN_RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
    return ckpt;
  }

  const fs::path index_path = root / kIndexName;
  if (fs::exists(index_path, ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text, read_text(index_path.string()));
    std::string why;
    const Json index = parse_json_explained<Json>(text, &why);
    if (!why.empty()) return corrupt(index_path.string() + ": " + why);
    if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
      return corrupt(index_path.string() + ": no \"weight_map\" object");
    const Json& weight_map = index.at("weight_map");

    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;  // shard file name -> file
    for (const auto& [name, shard] : weight_map.items()) {
      if (!shard.is_string())
        return corrupt(index_path.string() + ": weight_map entry of tensor " + in_quotes(name) +
                       " is " + shard.type_name() + ", not a file name");
      const std::string shard_name = shard.get<std::string>();
      if (shards.count(shard_name)) continue;
      // Shards live beside the index; a path that leaves the directory is not a shard.
      const fs::path rel(shard_name);
      if (shard_name.empty() || rel.is_absolute() ||
          std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; }))
        return corrupt(index_path.string() + ": shard name " + in_quotes(shard_name) +
                       " of tensor " + in_quotes(name) +
                       " is not a file in the checkpoint directory");
      const fs::path shard_path = root / rel;
      if (!fs::exists(shard_path, ec))
        return not_found(dir + ": missing shard " + shard_name + " (needed for tensor " +
                         in_quotes(name) + ")");
      KILN_ASSIGN_OR_RETURN(shards[shard_name], SafetensorsFile::open(shard_path.string()));
    }
    for (const auto& [name, shard] : weight_map.items()) {
      const auto& file = shards.at(shard.get<std::string>());
      if (!file->find(name))
        return corrupt(file->path() + ": tensor " + in_quotes(name) + " is listed in " +
                       kIndexName + " but absent from the shard");
    }
    for (auto& [shard_name, file] : shards) KILN_RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
    return ckpt;
  }

  std::vector<std::string> paths;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
      paths.push_back(it->path().string());
  if (ec) return internal_error(dir + ": cannot list directory: " + ec.message());
  if (paths.empty())
    return not_found(dir + ": no .safetensors files (and no " + std::string(kIndexName) + ")");
  std::sort(paths.begin(), paths.end());  // deterministic, whatever the directory order
  for (const std::string& p : paths) {
    KILN_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(p));
    KILN_RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
  }
  return ckpt;
}

Result<Tensor> Checkpoint::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    return not_found("tensor " + in_quotes(name) + " not found in checkpoint " + dir_);
  return it->second.file->get(*it->second.info);
}

Result<Tensor> Checkpoint::get(const std::string& name, const Shape& expected_shape) const {
  KILN_ASSIGN_OR_RETURN(Tensor t, get(name));
  if (!(t.shape == expected_shape))
    return corrupt("tensor " + in_quotes(name) + " in " + dir_ + ": shape mismatch: expected " +
                   expected_shape.to_string() + ", got " + t.shape.to_string());
  return t;
}

const TensorInfo* Checkpoint::info(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.info;
}

void Checkpoint::rename_prefix(const std::string& from, const std::string& to) {
  std::map<std::string, Entry> renamed;
  for (auto& [name, entry] : entries_)
    renamed.emplace(name.starts_with(from) ? to + name.substr(from.size()) : name, entry);
  entries_ = std::move(renamed);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------
// Writers

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<const Tensor*> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string where = path + ": tensor " + in_quotes(name);
    if (name.empty() || name == "__metadata__")
      return invalid_argument(where + ": reserved or empty name");
    if (header.contains(name)) return invalid_argument(where + ": duplicate name");
    if (t.device != Device::kHost) return invalid_argument(where + ": not a host tensor");
    const std::string_view dtype = dtype_to_safetensors(t.dtype);
    if (dtype.empty())
      return unsupported(where + ": dtype " + std::string(dtype_name(t.dtype)) +
                         " has no safetensors name");
    const uint64_t n = t.nbytes();
    if (n && !t.data)
      return invalid_argument(where + ": no data for " + std::to_string(n) + " bytes");
    Json shape = Json::array();
    for (int i = 0; i < t.rank(); ++i) shape.push_back(t.shape.dims[i]);
    header[name] = Json{{"dtype", std::string(dtype)},
                        {"shape", std::move(shape)},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
    data.push_back(&t);
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const Json::exception& e) {  // names or metadata that are not UTF-8
    return invalid_argument(path + ": header cannot be written as JSON: " + e.what());
  }
  // Pad with spaces so the data section starts 8-byte aligned (the Rust writer does this).
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = char((uint64_t(json.size()) >> (8 * i)) & 0xff);
  head += json;
  return write_all(path, head, data);
}

Status write_safetensors_index(const std::string& dir,
                               const std::map<std::string, std::string>& weight_map) {
  Json index = {{"metadata", Json::object()}, {"weight_map", Json::object()}};
  for (const auto& [name, shard] : weight_map) index["weight_map"][name] = shard;
  const std::string path = (fs::path(dir) / kIndexName).string();
  std::ofstream out(path, std::ios::binary);
  if (!out) return invalid_argument(path + ": cannot create: " + errno_text());
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return internal_error(path + ": write failed: " + errno_text());
  return Status::Ok();
}

}  // namespace kiln::formats
