// Optimizer state metadata and checked tensor lookup (state_io.h).
#include "optim/state_io.h"

#include <algorithm>
#include <memory>

namespace traind::engine::state_io {

void SetHeader(SafetensorsFile* file, const std::string& format, int64_t step) {
  file->metadata["format"] = format;
  file->metadata["step"] = std::to_string(step);
}

Result<int64_t> ReadStep(const SafetensorsFile& file, const std::string& format) {
  return ReadStep(file.metadata, format);
}

Result<int64_t> ReadStep(const std::map<std::string, std::string>& metadata,
                         const std::string& format) {
  auto fmt = metadata.find("format");
  auto st = metadata.find("step");
  if (fmt == metadata.end() || fmt->second != format || st == metadata.end()) {
    return Status::DataLoss("optimizer state: metadata lacks format " + format + " and step" +
                            (fmt == metadata.end() ? "" : " (format is " + fmt->second + ")"));
  }
  int64_t step = 0;
  size_t used = 0;
  try {
    step = std::stoll(st->second, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != st->second.size() || step < 0) {
    return Status::DataLoss("optimizer state: bad step '" + st->second + "'");
  }
  return step;
}

Result<const HostTensor*> Find(const SafetensorsFile& file, const std::string& name,
                               const std::string& dtype, const std::vector<int64_t>& shape) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) return Status::DataLoss("optimizer state: missing tensor " + name);
  const HostTensor& t = it->second;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (t.dtype != dtype || t.shape != shape ||
      static_cast<int64_t>(t.data.size()) !=
          numel * static_cast<int64_t>(SafetensorsDTypeSize(dtype))) {
    return Status::DataLoss("optimizer state: tensor " + name + " has dtype " + t.dtype +
                            " and a shape other than this model's (expected " + dtype + ")");
  }
  return &t;
}

Result<const SafetensorsReader::Entry*> Find(const SafetensorsReader& file, const std::string& name,
                                             const std::string& dtype,
                                             const std::vector<int64_t>& shape) {
  const SafetensorsReader::Entry* t = file.Find(name);
  if (t == nullptr) return Status::DataLoss("optimizer state: missing tensor " + name);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (t->dtype != dtype || t->shape != shape ||
      static_cast<int64_t>(t->bytes()) != numel * static_cast<int64_t>(SafetensorsDTypeSize(dtype))) {
    return Status::DataLoss("optimizer state: tensor " + name + " has dtype " + t->dtype +
                            " and a shape other than this model's (expected " + dtype + ")");
  }
  return t;
}

Status WriteDeviceTensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                          const std::vector<DeviceTensor>& tensors, Backend* backend,
                          size_t piece_bytes) {
  // A name given twice keeps its last tensor, as assigning into SafetensorsFile::tensors does.
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < tensors.size(); ++i) last[tensors[i].name] = i;
  std::vector<StreamedTensor> specs;
  std::vector<const DeviceTensor*> kept;
  size_t largest = 0;
  for (const auto& [name, i] : last) {
    const DeviceTensor& t = tensors[i];
    kept.push_back(&t);
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (numel * SafetensorsDTypeSize(t.dtype) != t.bytes) {
      return Status::Internal(path + ": optimizer state tensor '" + t.name + "': " +
                              std::to_string(t.bytes) + " device bytes for its shape and dtype " +
                              t.dtype);
    }
    specs.push_back({t.name, t.dtype, t.shape});
    largest = std::max(largest, t.bytes);
  }
  piece_bytes = std::max<size_t>(piece_bytes, 1);
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[std::max<size_t>(std::min(piece_bytes, largest), 1)]);
  return WriteSafetensorsStreamed(
      path, metadata, std::move(specs), [&](size_t i, const SafetensorsSink& sink) -> Status {
        const DeviceTensor& t = *kept[i];
        const auto* src = static_cast<const uint8_t*>(t.device);
        for (size_t at = 0; at < t.bytes;) {
          const size_t n = std::min(piece_bytes, t.bytes - at);
          backend->CopyDeviceToHost(buffer.get(), src + at, n);
          // A failed write: the writer's own error (errno) is what WriteSafetensorsStreamed returns.
          if (!sink(buffer.get(), n)) {
            return Status::Internal(path + ": writing optimizer state tensor '" + t.name + "' failed");
          }
          at += n;
        }
        return Status::Ok();
      });
}

SafetensorsFile CopyDeviceTensors(const std::map<std::string, std::string>& metadata,
                                  const std::vector<DeviceTensor>& tensors, Backend* backend) {
  SafetensorsFile file;
  file.metadata = metadata;
  for (const DeviceTensor& t : tensors) {
    HostTensor h;
    h.dtype = t.dtype;
    h.shape = t.shape;
    h.data.resize(t.bytes);
    if (t.bytes > 0) backend->CopyDeviceToHost(h.data.data(), t.device, t.bytes);
    file.tensors[t.name] = std::move(h);  // a name given twice keeps its last tensor
  }
  return file;
}

}  // namespace traind::engine::state_io
