// Helpers shared by the optimizers' SaveState/LoadState: the versioned {"format", "step"} metadata
// and a checked lookup of one named state tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "traind/engine/status.h"

namespace traind::engine::state_io {

void SetHeader(SafetensorsFile* file, const std::string& format, int64_t step);
// The step of a state file written with `format`. DATA_LOSS when the format differs, the step is
// missing, not a number or negative.
Result<int64_t> ReadStep(const SafetensorsFile& file, const std::string& format);
Result<int64_t> ReadStep(const std::map<std::string, std::string>& metadata,
                         const std::string& format);
// The tensor `name`, checked to have `dtype` ("F32", "U8") and `shape`. DATA_LOSS naming it when
// it is missing or differs.
Result<const HostTensor*> Find(const SafetensorsFile& file, const std::string& name,
                               const std::string& dtype, const std::vector<int64_t>& shape);
// The same check against a streamed file's header (nothing read): the entry of `name`.
Result<const SafetensorsReader::Entry*> Find(const SafetensorsReader& file, const std::string& name,
                                             const std::string& dtype,
                                             const std::vector<int64_t>& shape);

// One state tensor as it lies in device memory: `bytes` at `device` are its raw little-endian data.
struct DeviceTensor {
  std::string name;
  std::string dtype;  // "F32", "U8"
  std::vector<int64_t> shape;
  const void* device = nullptr;
  size_t bytes = 0;
};

// The bytes of one piece that WriteDeviceTensors copies device -> host at a time.
inline constexpr size_t kStatePieceBytes = size_t{4} << 20;

// The same file as WriteSafetensors of {metadata, those tensors copied to the host}, written with
// WriteSafetensorsStreamed: each tensor copied device -> host in pieces of at most `piece_bytes`
// through one reused host buffer, so the host memory it takes is the buffer's, not the state's
// (an in-memory optimizer's WriteState).
Status WriteDeviceTensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                          const std::vector<DeviceTensor>& tensors, Backend* backend,
                          size_t piece_bytes = kStatePieceBytes);

// The same tensors copied to the host whole, with `metadata` (an in-memory optimizer's
// SaveState): the file WriteDeviceTensors writes, as a SafetensorsFile.
SafetensorsFile CopyDeviceTensors(const std::map<std::string, std::string>& metadata,
                                  const std::vector<DeviceTensor>& tensors, Backend* backend);

}  // namespace traind::engine::state_io
