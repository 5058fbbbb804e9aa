// RegisterGpuBackends (traind/engine/devices.h), library traind_gpu_backends: installs whichever
// GPU backends this build has (TRAIND_HAVE_CUDA_BACKEND: traind_cuda, TRAIND_HAVE_SIMT_BACKEND:
// traind_simt) into the engine. A no-op in a build with neither.
#include <mutex>

#include "traind/engine/devices.h"

namespace traind::engine {

#if defined(TRAIND_HAVE_CUDA_BACKEND)
void RegisterCudaBackend();  // cuda/cuda_register.cc
#endif
#if defined(TRAIND_HAVE_SIMT_BACKEND)
void RegisterSimtBackend();  // simt/simt_register.cc
#endif

void RegisterGpuBackends() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(TRAIND_HAVE_CUDA_BACKEND)
    RegisterCudaBackend();
#endif
#if defined(TRAIND_HAVE_SIMT_BACKEND)
    RegisterSimtBackend();
#endif
  });
}

}  // namespace traind::engine
