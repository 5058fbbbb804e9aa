// Fuzz target: the safetensors reader (ReadSafetensors, which takes a path: the bytes go to a
// scratch file), then what callers do with the tensors it returns: numel, ToF32 and CastTensor.
// Every tensor it returns must hold exactly numel * dtype size bytes (the reader's promise).
#include <cstdint>
#include <string>

#include "core/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace traind;
  using namespace traind::engine;
  const std::string path = traind::fuzz::WriteScratch("model.safetensors", data, size);
  Result<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return 0;
  for (const auto& [name, t] : file->tensors) {
    const size_t esize = SafetensorsDTypeSize(t.dtype);
    FUZZ_CHECK(esize > 0, "tensor '" + name + "' has unknown dtype " + t.dtype);
    FUZZ_CHECK(t.numel() >= 0 && t.data.size() == static_cast<uint64_t>(t.numel()) * esize,
               "tensor '" + name + "' holds a byte count that disagrees with its shape");
    if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") {
      FUZZ_CHECK(t.ToF32().ok(), "ToF32 of float tensor '" + name + "' failed");
      for (const char* to : {"F32", "BF16", "F16"}) {
        Result<HostTensor> c = CastTensor(t, to);
        FUZZ_CHECK(c.ok() && c->shape == t.shape, "CastTensor of '" + name + "' failed");
      }
    } else {
      FUZZ_CHECK(!t.ToF32().ok(), "ToF32 accepted non-float dtype " + t.dtype);
    }
  }
  return 0;
}
