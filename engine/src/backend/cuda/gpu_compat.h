// What every kernel file (.cu) includes: the CUDA runtime under nvcc, the simt emulator under a
// host compiler (TRAIND_SIMT); GPU_LAUNCH, the one launch helper that replaces <<<>>>; the
// dynamic shared memory macro; and the conversion of a launch error to a Status.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

#if defined(TRAIND_SIMT)
#include "backend/simt/simt.h"
// T* name = the block's dynamic shared memory (the launch's `shmem` bytes).
#define GPU_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::simt::detail::DynamicShared())
// Full unrolling of a loop over a register array (nvcc; g++ unrolls or not, the result is the same).
#define GPU_UNROLL
#else
#if !defined(__CUDACC__)
#error "kernel sources compile with nvcc, or with a host compiler and TRAIND_SIMT defined"
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define GPU_DYNAMIC_SHARED(T, name)                           \
  extern __shared__ __align__(16) unsigned char name##_raw[]; \
  T* name = reinterpret_cast<T*>(name##_raw)
#define GPU_UNROLL _Pragma("unroll")
#endif

TRAIND_GPU_BEGIN

#if defined(TRAIND_SIMT)
template <typename... P, typename... A>
cudaError_t LaunchKernel(const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                         size_t shmem, cudaStream_t stream, A&&... args) {
  return ::simt::Launch(name, kernel, grid, block, shmem, stream, std::forward<A>(args)...);
}
inline const char* GpuErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    default:
      return "simt error";
  }
}
#else
template <typename... P, typename... A>
cudaError_t LaunchKernel(const char* /*name*/, void (*kernel)(P...), dim3 grid, dim3 block,
                         size_t shmem, cudaStream_t stream, A&&... args) {
  // clang-format off
  kernel<<<grid, block, shmem, stream>>>(std::forward<A>(args)...);
  // clang-format on
  return cudaGetLastError();
}
inline const char* GpuErrorString(cudaError_t e) { return cudaGetErrorString(e); }
#endif

// OK, or INTERNAL naming the kernel and the CUDA error.
inline Status LaunchStatus(const char* kernel, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("launch of ") + kernel + " failed: " + GpuErrorString(e));
}

// Blocks for a grid-stride loop over n elements: enough to fill the device, capped.
inline unsigned GridFor(int64_t n, int threads, int64_t cap = 4096) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

TRAIND_GPU_END

// Launch `kernel` (a __global__ function, or a template instance in parentheses) over grid x block
// with `shmem` dynamic shared bytes on `stream`; yields a traind::Status.
#define GPU_LAUNCH(kernel, grid, block, shmem, stream, ...)                                     \
  ::traind::engine::gpu::LaunchStatus(                                                          \
      #kernel, ::traind::engine::gpu::LaunchKernel(#kernel, kernel, grid, block, shmem, stream, \
                                                   __VA_ARGS__))
