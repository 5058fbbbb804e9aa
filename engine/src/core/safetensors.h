// safetensors read/write (https://huggingface.co/docs/safetensors): 8 bytes little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
// "__metadata__": {str: str}}, then the raw little-endian data. Parsed defensively: every offset,
// size, dtype and shape is checked against the file; a lying header is DATA_LOSS naming the file
// and the tensor, never a crash. Format notes: docs/checkpoint-format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/half.h"  // F32ToBF16 ... for the float dtypes
#include "traind/engine/status.h"

namespace traind::engine {

struct HostTensor {
  std::string dtype = "F32";  // safetensors dtype name: F32, BF16, F16, I32, I64, U8, ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // raw little-endian bytes, size = numel * dtype size

  int64_t numel() const;
  // The data as fp32 (converting BF16/F16); INVALID_ARGUMENT for non-float dtypes.
  Result<std::vector<float>> ToF32() const;
  static HostTensor FromF32(const float* data, std::vector<int64_t> shape);
};

struct SafetensorsFile {
  std::map<std::string, HostTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The bytes of one element of a safetensors dtype ("F32" -> 4), or 0 for an unknown name.
size_t SafetensorsDTypeSize(const std::string& dtype);
// `t` converted to the float dtype "F32", "BF16" or "F16" (from any of those); INVALID_ARGUMENT
// for other dtypes.
Result<HostTensor> CastTensor(const HostTensor& t, const std::string& dtype);

// NOT_FOUND if missing; DATA_LOSS for truncated files, bad JSON, offsets out of range or
// overlapping, dtype/shape/size disagreement.
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

// The same file without reading its tensors: Open parses and checks the header (the same checks
// and errors as ReadSafetensors), keeps the file open, and ReadRange reads any byte range of one
// tensor with pread, so a caller can stream a file larger than the memory it may use (an
// offloaded optimizer's state on resume). ReadSafetensors is Open + ReadTensor of each.
class SafetensorsReader {
 public:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // offsets in the data section
    uint64_t bytes() const { return end - begin; }
  };
  static Result<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const Entry* Find(const std::string& name) const;  // nullptr when absent
  // Bytes [offset, offset + bytes) of tensor `name`'s data into dst. NOT_FOUND for an unknown
  // name, INVALID_ARGUMENT for a range outside it, DATA_LOSS for a short read.
  Status ReadRange(const std::string& name, uint64_t offset, void* dst, size_t bytes) const;
  Result<HostTensor> ReadTensor(const std::string& name) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> tensors_;
};

// Writes deterministically (tensors in name order, stable JSON, aligned header), to `path.tmp`
// then fsync + rename, so a crash never leaves a half-written file under `path`.
// RESOURCE_EXHAUSTED when the disk is full (the old file, if any, is kept).
Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

// The same file written without holding the tensors: the header from `tensors` (names, dtypes,
// shapes; written in name order like WriteSafetensors), then `data(i, sink)` is called once per
// tensor in that order and must put exactly the tensor's bytes into `sink` (false: the write
// failed; stop). A data error or a wrong byte count removes the partial file (path is untouched).
using SafetensorsSink = std::function<bool(const void* data, size_t bytes)>;
using SafetensorsProducer = std::function<Status(const SafetensorsSink& sink)>;
struct StreamedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};
using StreamedTensorData = std::function<Status(size_t index, const SafetensorsSink& sink)>;
Status WriteSafetensorsStreamed(const std::string& path,
                                const std::map<std::string, std::string>& metadata,
                                std::vector<StreamedTensor> tensors, const StreamedTensorData& data);

// A file's tensors as a stream: the header's names, dtypes and shapes up front and each tensor's
// bytes produced on demand (data(i, sink), called in name order by the writer), so a producer
// can read a tensor in pieces through a bounded buffer (a model's export: Model::StreamHf).
struct SafetensorsStream {
  std::map<std::string, std::string> metadata;
  std::vector<StreamedTensor> tensors;
  StreamedTensorData data;
};
// The same bytes as WriteSafetensors of the collected file, written with WriteSafetensorsStreamed
// (path.tmp, fsync, rename; on any error path is untouched and path.tmp removed).
Status WriteSafetensorsStream(const std::string& path, const SafetensorsStream& stream);
// The whole file in memory (tests, small files): every tensor's bytes collected. INTERNAL when a
// producer puts a wrong byte count; a producer's own error as it is.
Result<SafetensorsFile> CollectSafetensorsStream(const SafetensorsStream& stream);

// `stream` with its F32 tensors written as `dtype` ("BF16" or "F16", rounded to nearest even) as
// the bytes pass through (no copy of a tensor is held); other tensors as they are.
SafetensorsStream CastSafetensorsStream(SafetensorsStream stream, const std::string& dtype);

// An HF model folder's weights, opened but not read: model.safetensors, or the shards listed in
// model.safetensors.index.json ("weight_map"), each header parsed and checked (the errors of
// ReadHfWeights) and the files kept open, so a loader reads one tensor (or a range of one) at a
// time with pread and holds no more than that.
class HfWeightsReader {
 public:
  static Result<HfWeightsReader> Open(const std::string& folder);
  const std::string& folder() const { return folder_; }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  // The tensor's header entry (dtype, shape, bytes); nullptr when no shard holds it.
  const SafetensorsReader::Entry* Find(const std::string& name) const;
  // The file that holds it (for messages); empty when absent.
  std::string PathOf(const std::string& name) const;
  Result<HostTensor> ReadTensor(const std::string& name) const;
  Status ReadRange(const std::string& name, uint64_t offset, void* dst, size_t bytes) const;
  // The shards' __metadata__, merged.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string folder_;
  std::vector<SafetensorsReader> shards_;
  std::map<std::string, size_t> where_;  // tensor -> shard
  std::map<std::string, std::string> metadata_;
};

// Reads an HF model folder's weights: model.safetensors, or the shards listed in
// model.safetensors.index.json ("weight_map"). NOT_FOUND when neither exists.
Result<SafetensorsFile> ReadHfWeights(const std::string& folder);

// Writes `content` to `path` atomically (tmp + fsync + rename). For JSON files beside checkpoints.
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace traind::engine
