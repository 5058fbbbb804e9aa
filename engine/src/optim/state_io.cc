// Optimizer state metadata and checked tensor lookup (state_io.h).
#include "optim/state_io.h"

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

}  // namespace traind::engine::state_io
