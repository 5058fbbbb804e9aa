// safetensors read/write, HF sharded weight folders, and fp32 <-> bf16/f16 conversion.
// The reader trusts nothing in the header: every check below turns a lying file into DATA_LOSS.
// Format and rules: docs/checkpoint-format.md.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace traind::engine {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // HF's own limit is 100 MB as well

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string ErrnoText(int err) { return std::strerror(err); }

// Reads exactly n bytes at offset; false on a short read or error.
bool PreadAll(int fd, void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

Status WriteErrorStatus(const std::string& path, int err) {
  std::string m = path + ": " + ErrnoText(err);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return Status::ResourceExhausted(m + " (the disk is full; the previous file, if any, was kept: "
                                         "free space and retry)");
  }
  if (err == EACCES || err == EPERM || err == EROFS) return Status::PermissionDenied(m);
  if (err == ENOENT || err == ENOTDIR) return Status::NotFound(m);
  return Status::FailedPrecondition(m);
}

Status FsyncDirOf(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0) return WriteErrorStatus(dir.string(), errno);
  if (::fsync(d.fd) != 0 && errno != EINVAL) return WriteErrorStatus(dir.string(), errno);
  return Status::Ok();
}

// Writes what `produce` puts into its sink to path.tmp, fsyncs, renames over path, fsyncs the
// directory. A failed write or a producer error removes path.tmp and leaves path as it was.
Status WriteStreamAtomic(const std::string& path, const SafetensorsProducer& produce) {
  const std::string tmp = path + ".tmp";
  int err = 0;
  Status produced;
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) return WriteErrorStatus(tmp, errno);
    const SafetensorsSink sink = [&](const void* p, size_t size) {
      const auto* data = static_cast<const uint8_t*>(p);
      size_t done = 0;
      while (done < size && err == 0) {
        ssize_t w = ::write(f.fd, data + done, size - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) err = errno;
        else done += static_cast<size_t>(w);
      }
      return err == 0;
    };
    produced = produce(sink);
    if (err == 0 && produced.ok() && ::fsync(f.fd) != 0) err = errno;
    if (::close(f.fd) != 0 && err == 0) err = errno;
    f.fd = -1;
  }
  if (err == 0 && produced.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0 || !produced.ok()) {
    ::unlink(tmp.c_str());
    return err != 0 ? WriteErrorStatus(path, err) : produced;
  }
  return FsyncDirOf(path);
}

Status WritePiecesAtomic(const std::string& path,
                         const std::vector<std::pair<const uint8_t*, size_t>>& pieces) {
  return WriteStreamAtomic(path, [&](const SafetensorsSink& sink) {
    for (const auto& [data, size] : pieces) {
      if (!sink(data, size)) break;  // the error is reported by WriteStreamAtomic
    }
    return Status::Ok();
  });
}

// Parses one tensor entry of the header; `data_bytes` is the size of the data section.
Status ParseEntry(const std::string& file, const std::string& name, const json& e,
                  uint64_t data_bytes, HostTensor* t, uint64_t* begin, uint64_t* end) {
  auto bad = [&](const std::string& why) {
    return Status::DataLoss(file + ": tensor '" + name + "': " + why);
  };
  if (!e.is_object()) return bad("header entry is not an object");
  for (const auto& [k, v] : e.items()) {
    if (k != "dtype" && k != "shape" && k != "data_offsets") return bad("unknown key '" + k + "'");
  }
  if (!e.contains("dtype") || !e["dtype"].is_string()) return bad("missing or non-string dtype");
  if (!e.contains("shape") || !e["shape"].is_array()) return bad("missing or non-array shape");
  if (!e.contains("data_offsets") || !e["data_offsets"].is_array() ||
      e["data_offsets"].size() != 2) {
    return bad("missing data_offsets (expected [begin, end])");
  }
  t->dtype = e["dtype"].get<std::string>();
  const size_t esize = SafetensorsDTypeSize(t->dtype);
  if (esize == 0) return bad("unknown dtype '" + t->dtype + "'");
  uint64_t numel = 1;
  // The product of the non-zero dimensions must fit int64 too, even when a 0 makes the count 0:
  // HostTensor::numel() multiplies in int64 (fuzz/: [3, 2^62, 0] overflowed it).
  uint64_t nonzero = 1;
  constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  t->shape.clear();
  for (const auto& d : e["shape"]) {
    if (!d.is_number_integer()) return bad("shape has a non-integer dimension");
    if (d.is_number_unsigned() ? false : d.get<int64_t>() < 0) {
      return bad("shape has a negative dimension " + d.dump());
    }
    const uint64_t dim = d.get<uint64_t>();
    if (dim > kMaxCount || (dim != 0 && nonzero > kMaxCount / dim)) {
      return bad("shape " + e["shape"].dump() + " overflows the element count");
    }
    numel *= dim;
    if (dim != 0) nonzero *= dim;
    t->shape.push_back(static_cast<int64_t>(dim));
  }
  if (numel > std::numeric_limits<uint64_t>::max() / esize) {
    return bad("shape " + e["shape"].dump() + " overflows the byte count");
  }
  const auto& off = e["data_offsets"];
  for (const auto& o : off) {
    if (!o.is_number_integer() || (!o.is_number_unsigned() && o.get<int64_t>() < 0)) {
      return bad("data_offsets " + off.dump() + " are not non-negative integers");
    }
  }
  *begin = off[0].get<uint64_t>();
  *end = off[1].get<uint64_t>();
  if (*begin > *end || *end > data_bytes) {
    return bad("data_offsets " + off.dump() + " are not within the data section of " +
               std::to_string(data_bytes) + " bytes");
  }
  if (*end - *begin != numel * esize) {
    return bad("data_offsets " + off.dump() + " span " + std::to_string(*end - *begin) +
               " bytes but shape " + e["shape"].dump() + " of " + t->dtype + " needs " +
               std::to_string(numel * esize));
  }
  return Status::Ok();
}

std::string ShapeJson(const std::vector<int64_t>& shape) { return json(shape).dump(); }

}  // namespace

size_t SafetensorsDTypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<float>> HostTensor::ToF32() const {
  const size_t n = static_cast<size_t>(numel());
  const size_t esize = SafetensorsDTypeSize(dtype);
  if (esize == 0 || data.size() != n * esize) {
    return Status::InvalidArgument("tensor of dtype " + dtype + " and shape " + ShapeJson(shape) +
                                   " holds " + std::to_string(data.size()) + " bytes");
  }
  std::vector<float> out(n);
  if (dtype == "F32") {
    if (n > 0) std::memcpy(out.data(), data.data(), n * 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    const bool bf = dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8));
      out[i] = bf ? BF16ToF32(h) : F16ToF32(h);
    }
  } else {
    return Status::InvalidArgument("tensor dtype " + dtype +
                                   " is not a float type (F32, BF16, F16 convert to fp32)");
  }
  return out;
}

HostTensor HostTensor::FromF32(const float* data, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = "F32";
  t.shape = std::move(shape);
  const size_t n = static_cast<size_t>(t.numel());
  t.data.resize(n * 4);
  if (n > 0) std::memcpy(t.data.data(), data, n * 4);
  return t;
}

Result<HostTensor> CastTensor(const HostTensor& t, const std::string& dtype) {
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16") {
    return Status::InvalidArgument("cannot cast to dtype " + dtype + " (F32, BF16, F16)");
  }
  TRAIND_ASSIGN_OR_RETURN(std::vector<float> f, t.ToF32());
  if (dtype == "F32") return HostTensor::FromF32(f.data(), t.shape);
  HostTensor out;
  out.dtype = dtype;
  out.shape = t.shape;
  out.data.resize(f.size() * 2);
  const bool bf = dtype == "BF16";
  for (size_t i = 0; i < f.size(); ++i) {
    const uint16_t h = bf ? F32ToBF16(f[i]) : F32ToF16(f[i]);
    out.data[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out.data[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return out;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), data_start_(o.data_start_),
      metadata_(std::move(o.metadata_)), tensors_(std::move(o.tensors_)) {
  o.fd_ = -1;
}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    data_start_ = o.data_start_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    o.fd_ = -1;
  }
  return *this;
}

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader out;
  out.path_ = path;
  out.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (out.fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::FailedPrecondition(path + ": cannot open: " + ErrnoText(err));
  }
  const int fd = out.fd_;
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FailedPrecondition(path + ": " + ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition(path + ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  uint8_t len_bytes[8];
  if (file_size < 8 || !PreadAll(fd, len_bytes, 8, 0)) {
    return Status::DataLoss(path + ": truncated: " + std::to_string(file_size) +
                            " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return Status::DataLoss(path + ": header length " + std::to_string(header_len) +
                            " exceeds the 100 MB limit (not a safetensors file?)");
  }
  if (header_len > file_size - 8) {
    return Status::DataLoss(path + ": header length " + std::to_string(header_len) +
                            " is larger than the rest of the file (" +
                            std::to_string(file_size - 8) + " bytes): truncated");
  }
  std::string header(header_len, '\0');
  if (header_len > 0 && !PreadAll(fd, header.data(), header_len, 8)) {
    return Status::DataLoss(path + ": cannot read the header: " + ErrnoText(errno));
  }
  json h = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) return Status::DataLoss(path + ": the header is not valid JSON");
  if (!h.is_object()) return Status::DataLoss(path + ": the header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = file_size - data_start;
  out.data_start_ = data_start;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) return Status::DataLoss(path + ": __metadata__ is not an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) {
          return Status::DataLoss(path + ": __metadata__['" + k + "'] is not a string");
        }
        out.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    HostTensor t;
    uint64_t b = 0, en = 0;
    TRAIND_RETURN_IF_ERROR(ParseEntry(path, name, e, data_bytes, &t, &b, &en));
    ranges.push_back({b, en, name});
    out.tensors_.emplace(name, Entry{std::move(t.dtype), std::move(t.shape), b, en});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& p = ranges[i - 1];
    const Range& c = ranges[i];
    if (c.begin < p.end && c.begin != c.end && p.begin != p.end) {
      return Status::DataLoss(path + ": tensor '" + c.name + "' overlaps tensor '" + p.name +
                              "' in the data section");
    }
  }
  return out;
}

const SafetensorsReader::Entry* SafetensorsReader::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsReader::ReadRange(const std::string& name, uint64_t offset, void* dst,
                                    size_t bytes) const {
  const Entry* e = Find(name);
  if (e == nullptr) return Status::NotFound(path_ + ": no tensor '" + name + "'");
  if (offset > e->bytes() || bytes > e->bytes() - offset) {
    return Status::InvalidArgument(path_ + ": tensor '" + name + "': bytes [" +
                                   std::to_string(offset) + ", +" + std::to_string(bytes) +
                                   ") are outside its " + std::to_string(e->bytes()) + " bytes");
  }
  if (bytes > 0 && !PreadAll(fd_, dst, bytes, data_start_ + e->begin + offset)) {
    return Status::DataLoss(path_ + ": tensor '" + name + "': short read (file changed?)");
  }
  return Status::Ok();
}

Result<HostTensor> SafetensorsReader::ReadTensor(const std::string& name) const {
  const Entry* e = Find(name);
  if (e == nullptr) return Status::NotFound(path_ + ": no tensor '" + name + "'");
  HostTensor t;
  t.dtype = e->dtype;
  t.shape = e->shape;
  t.data.resize(e->bytes());
  TRAIND_RETURN_IF_ERROR(ReadRange(name, 0, t.data.data(), t.data.size()));
  return t;
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  SafetensorsFile out;
  out.metadata = reader.metadata();
  // In file order (one forward pass over the data section).
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, e] : reader.tensors()) order.push_back({e.begin, &name});
  std::sort(order.begin(), order.end());
  for (const auto& [begin, name] : order) {
    TRAIND_ASSIGN_OR_RETURN(HostTensor t, reader.ReadTensor(*name));
    out.tensors.emplace(*name, std::move(t));
  }
  return out;
}

Status WriteSafetensorsStreamed(const std::string& path,
                                const std::map<std::string, std::string>& metadata,
                                std::vector<StreamedTensor> tensors, const StreamedTensorData& data) {
  // Header built by hand so the key order is fixed: __metadata__, then tensors by name, each
  // {"dtype","shape","data_offsets"} as the HF writer orders them.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":" + json(metadata).dump();
    first = false;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> bytes(tensors.size());
  for (size_t i : order) {
    const StreamedTensor& t = tensors[i];
    const size_t esize = SafetensorsDTypeSize(t.dtype);
    if (esize == 0) return Status::InvalidArgument(path + ": tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return Status::InvalidArgument(path + ": tensor '" + t.name + "': negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (t.name == "__metadata__") {
      return Status::InvalidArgument(path + ": '__metadata__' is reserved, not a tensor name");
    }
    bytes[i] = numel * esize;
    if (!first) header += ",";
    first = false;
    const uint64_t end = offset + bytes[i];
    header += json(t.name).dump() + ":{\"dtype\":" + json(t.dtype).dump() +
              ",\"shape\":" + ShapeJson(t.shape) + ",\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as HF pads
  uint8_t len_bytes[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>((n >> (8 * i)) & 0xFF);
  return WriteStreamAtomic(path, [&](const SafetensorsSink& sink) -> Status {
    if (!sink(len_bytes, 8) || !sink(header.data(), header.size())) return Status::Ok();
    for (size_t i : order) {
      uint64_t put = 0;
      const SafetensorsSink counted = [&](const void* p, size_t size) {
        put += size;
        return put <= bytes[i] && sink(p, size);
      };
      TRAIND_RETURN_IF_ERROR(data(i, counted));
      if (put != bytes[i]) {
        return Status::Internal(path + ": tensor '" + tensors[i].name + "': " + std::to_string(put) +
                                " bytes written for " + std::to_string(bytes[i]));
      }
    }
    return Status::Ok();
  });
}

Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  std::vector<StreamedTensor> specs;
  std::vector<const HostTensor*> tensors;
  for (const auto& [name, t] : file.tensors) {
    if (SafetensorsDTypeSize(t.dtype) != 0 && t.data.size() != static_cast<uint64_t>(t.numel()) * SafetensorsDTypeSize(t.dtype)) {
      return Status::InvalidArgument(path + ": tensor '" + name + "': " +
                                     std::to_string(t.data.size()) + " bytes for shape " +
                                     ShapeJson(t.shape) + " of " + t.dtype);
    }
    specs.push_back({name, t.dtype, t.shape});
    tensors.push_back(&t);
  }
  return WriteSafetensorsStreamed(path, file.metadata, std::move(specs),
                                  [&](size_t i, const SafetensorsSink& sink) {
                                    sink(tensors[i]->data.data(), tensors[i]->data.size());
                                    return Status::Ok();
                                  });
}

Status WriteSafetensorsStream(const std::string& path, const SafetensorsStream& stream) {
  return WriteSafetensorsStreamed(path, stream.metadata, stream.tensors, stream.data);
}

Result<SafetensorsFile> CollectSafetensorsStream(const SafetensorsStream& stream) {
  SafetensorsFile out;
  out.metadata = stream.metadata;
  for (size_t i = 0; i < stream.tensors.size(); ++i) {
    const StreamedTensor& spec = stream.tensors[i];
    HostTensor t;
    t.dtype = spec.dtype;
    t.shape = spec.shape;
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * SafetensorsDTypeSize(spec.dtype);
    t.data.reserve(bytes);
    TRAIND_RETURN_IF_ERROR(stream.data(i, [&](const void* p, size_t size) {
      const auto* b = static_cast<const uint8_t*>(p);
      t.data.insert(t.data.end(), b, b + size);
      return t.data.size() <= bytes;
    }));
    if (t.data.size() != bytes) {
      return Status::Internal("tensor '" + spec.name + "': " + std::to_string(t.data.size()) +
                              " bytes produced for " + std::to_string(bytes));
    }
    out.tensors[spec.name] = std::move(t);
  }
  return out;
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  return WritePiecesAtomic(path,
                           {{reinterpret_cast<const uint8_t*>(content.data()), content.size()}});
}

Result<HfWeightsReader> HfWeightsReader::Open(const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path dir(folder);
  HfWeightsReader out;
  out.folder_ = folder;
  std::error_code ec;
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(single, ec)) {
    TRAIND_ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(single.string()));
    for (const auto& [name, e] : r.tensors()) out.where_.emplace(name, 0);
    out.metadata_ = r.metadata();
    out.shards_.push_back(std::move(r));
    return out;
  }
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index, ec)) {
    return Status::NotFound(folder + ": neither model.safetensors nor "
                            "model.safetensors.index.json exists");
  }
  std::string text;
  {
    Fd f;
    f.fd = ::open(index.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) return Status::FailedPrecondition(index.string() + ": " + ErrnoText(errno));
    char buf[65536];
    for (;;) {
      ssize_t r = ::read(f.fd, buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::FailedPrecondition(index.string() + ": " + ErrnoText(errno));
      if (r == 0) break;
      text.append(buf, static_cast<size_t>(r));
      if (text.size() > kMaxHeaderBytes) {
        return Status::DataLoss(index.string() + ": larger than 100 MB");
      }
    }
  }
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return Status::DataLoss(index.string() + ": not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensor names
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) {
      return Status::DataLoss(index.string() + ": weight_map['" + name + "'] is not a string");
    }
    const std::string s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
      return Status::DataLoss(index.string() + ": weight_map['" + name + "'] = '" + s +
                              "' is not a file name in the folder");
    }
    by_shard[s].push_back(name);
  }
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = (dir / shard).string();
    TRAIND_ASSIGN_OR_RETURN(SafetensorsReader part, SafetensorsReader::Open(shard_path));
    for (const std::string& name : names) {
      if (part.Find(name) == nullptr) {
        return Status::DataLoss(index.string() + ": tensor '" + name + "' is listed in " + shard +
                                " but " + shard_path + " does not hold it");
      }
    }
    for (const auto& [name, e] : part.tensors()) {
      if (!out.where_.emplace(name, out.shards_.size()).second) {
        return Status::DataLoss(shard_path + ": tensor '" + name + "' also appears in another shard");
      }
    }
    for (const auto& [k, v] : part.metadata()) out.metadata_.emplace(k, v);
    out.shards_.push_back(std::move(part));
  }
  return out;
}

std::vector<std::string> HfWeightsReader::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, shard] : where_) out.push_back(name);
  return out;
}

const SafetensorsReader::Entry* HfWeightsReader::Find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : shards_[it->second].Find(name);
}

std::string HfWeightsReader::PathOf(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : shards_[it->second].path();
}

Result<HostTensor> HfWeightsReader::ReadTensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return Status::NotFound(folder_ + ": no tensor '" + name + "'");
  return shards_[it->second].ReadTensor(name);
}

Status HfWeightsReader::ReadRange(const std::string& name, uint64_t offset, void* dst,
                                  size_t bytes) const {
  auto it = where_.find(name);
  if (it == where_.end()) return Status::NotFound(folder_ + ": no tensor '" + name + "'");
  return shards_[it->second].ReadRange(name, offset, dst, bytes);
}

Result<SafetensorsFile> ReadHfWeights(const std::string& folder) {
  TRAIND_ASSIGN_OR_RETURN(HfWeightsReader reader, HfWeightsReader::Open(folder));
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (const std::string& name : reader.names()) {
    TRAIND_ASSIGN_OR_RETURN(HostTensor t, reader.ReadTensor(name));
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

SafetensorsStream CastSafetensorsStream(SafetensorsStream stream, const std::string& dtype) {
  const bool bf16 = dtype == "BF16";
  std::vector<bool> cast(stream.tensors.size(), false);
  for (size_t i = 0; i < stream.tensors.size(); ++i) {
    if (stream.tensors[i].dtype != "F32") continue;
    stream.tensors[i].dtype = dtype;
    cast[i] = true;
  }
  StreamedTensorData inner = std::move(stream.data);
  stream.data = [inner, cast, bf16](size_t i, const SafetensorsSink& sink) -> Status {
    if (!cast[i]) return inner(i, sink);
    // Pieces may split a float: up to 3 bytes wait in `carry` for the next piece.
    uint8_t carry[4];
    size_t held = 0;
    std::vector<uint16_t> half;
    const SafetensorsSink narrowed = [&](const void* p, size_t bytes) {
      const auto* b = static_cast<const uint8_t*>(p);
      half.clear();
      while (bytes > 0 && held > 0 && held < 4) {
        carry[held++] = *b++;
        --bytes;
      }
      auto put = [&](const uint8_t* f) {
        float v;
        std::memcpy(&v, f, 4);
        half.push_back(bf16 ? F32ToBF16(v) : F32ToF16(v));
      };
      if (held == 4) {
        put(carry);
        held = 0;
      }
      for (; bytes >= 4; b += 4, bytes -= 4) put(b);
      for (; bytes > 0; --bytes) carry[held++] = *b++;
      return half.empty() || sink(half.data(), half.size() * sizeof(uint16_t));
    };
    return inner(i, narrowed);
  };
  return stream;
}

}  // namespace traind::engine
