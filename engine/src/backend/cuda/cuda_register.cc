// Registers the CUDA backend (library traind_cuda) with the engine's device registry: device
// count, MakeCudaBackend, and QueryDevice's answer for "cuda:N" (no backend is created for that).
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/device_registry.h"

namespace traind::engine {
namespace {

// Dense bf16 tensor-core peak from the product sheets; 0 = unknown.
double PeakBf16Flops(const std::string& name) {
  if (name.find("H100 PCIe") != std::string::npos) return 756e12;
  const bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (hopper) return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0.0;
}

Result<DeviceInfo> QueryCuda(int device) {
  TRAIND_RETURN_IF_ERROR(SelectCudaDevice(device));
  DeviceInfo info;
  info.device = "cuda:" + std::to_string(device);
  size_t total = 0, free_bytes = 0;
  TRAIND_RETURN_IF_ERROR(gpu::dev::DeviceInfo(&info.name, &total));
  TRAIND_RETURN_IF_ERROR(gpu::dev::MemGetInfo(&free_bytes, &total));
  info.total_bytes = static_cast<int64_t>(total);
  info.free_bytes = static_cast<int64_t>(free_bytes);
  info.peak_flops = PeakBf16Flops(info.name);
  return info;
}

}  // namespace

// Called by RegisterGpuBackends (gpu_register.cc).
void RegisterCudaBackend() {
  CudaFactories f;
  f.device_count = [](std::string* why) { return gpu::dev::DeviceCount(why); };
  f.make = [](int device, bool allow_tf32) {
    CudaBackendOptions o;
    o.allow_tf32 = allow_tf32;
    return MakeCudaBackend(device, o);
  };
  f.query = &QueryCuda;
  InstallCudaFactories(f);
}

}  // namespace traind::engine
