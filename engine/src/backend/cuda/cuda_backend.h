// Factories of the GPU backends. MakeCudaBackend (library traind_cuda, built with nvcc) runs the
// kernels on a CUDA device; MakeSimtBackend (library traind_simt) runs the same kernel source on
// the CPU through the simt emulator, on host memory, for tests.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct CudaBackendOptions {
  // fp32 GEMMs on TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation). Default off.
  bool allow_tf32 = false;
};

// The backend on CUDA device `device`. FAILED_PRECONDITION "no CUDA device ..." (with the runtime's
// reason) when there is no driver or no such device; UNAVAILABLE when cuBLASLt cannot start.
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                 const CudaBackendOptions& options = {});

// Makes CUDA device `device` current: the one check behind MakeCudaBackend and QueryDevice.
// FAILED_PRECONDITION "no CUDA device (<reason>); run with --device cpu ..." without a driver or a
// device; INVALID_ARGUMENT when `device` is out of range. (traind_cuda only.)
Status SelectCudaDevice(int device);

// The CUDA kernels under the simt emulator (host memory; GEMMs by the CPU backend with
// `cpu_threads` threads, 0 = all cores).
Result<std::unique_ptr<Backend>> MakeSimtBackend(int cpu_threads = 0);

}  // namespace traind::engine
