// Registers the simt device (library traind_simt) with the engine's device registry: device
// "simt" runs the CUDA backend's kernels on the CPU under the emulator (development and tests).
#include "backend/cuda/cuda_backend.h"
#include "backend/device_registry.h"

namespace traind::engine {

// Called by RegisterGpuBackends (gpu_register.cc).
void RegisterSimtBackend() {
  InstallSimtFactory([](int cpu_threads) { return MakeSimtBackend(cpu_threads); });
}

}  // namespace traind::engine
