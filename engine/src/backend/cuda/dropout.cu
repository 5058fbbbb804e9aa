// Inverted dropout (backend.h's Dropout) of the GPU backend: a grid-stride loop, each thread
// hashing its element indices with the counter-based mask of dropout_rng.h (the key read from
// device memory, so a replayed graph sees the key of its micro-batch). Memory-bound:
//   (in bytes + 4, + 4 more when accumulating) * n  -> 4M bf16 -> f32: ~10 us.
#include <string>
#include <type_traits>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"
#include "backend/dropout_rng.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float DropoutLoad(const void* p, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  } else {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
}

template <typename T>
__global__ void dropout_kernel(float* out, const void* inp, int64_t n, float p,
                               const uint64_t* key, uint64_t stream, bool accumulate) {
  const uint64_t base = DropoutBase(*key, stream);
  const float scale = 1.0f / (1.0f - p);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // x * (kept ? scale : 0), as torch (a dropped inf or NaN gives NaN), as the CPU kernel.
    const float v = DropoutLoad<T>(inp, i) * (DropoutKeep(base, static_cast<uint64_t>(i), p) ? scale : 0.0f);
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

Status Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
               const uint64_t* key, uint64_t stream, bool accumulate, cudaStream_t s) {
  if (n < 0) return Status::InvalidArgument("Dropout: negative size " + std::to_string(n));
  if (!(p >= 0.0f && p < 1.0f)) {
    return Status::InvalidArgument("Dropout: p must be in [0, 1), got " + std::to_string(p));
  }
  if (n == 0) return Status::Ok();
  const unsigned grid = GridFor(n, kThreads);
  switch (inp_type) {
    case DType::kF32:
      return GPU_LAUNCH((dropout_kernel<float>), grid, kThreads, 0, s, out, inp, n, p, key, stream,
                        accumulate);
    case DType::kBF16:
      return GPU_LAUNCH((dropout_kernel<__nv_bfloat16>), grid, kThreads, 0, s, out, inp, n, p, key,
                        stream, accumulate);
    case DType::kF16:
      return GPU_LAUNCH((dropout_kernel<__half>), grid, kThreads, 0, s, out, inp, n, p, key,
                        stream, accumulate);
  }
  return Status::InvalidArgument("Dropout: unknown input dtype");
}

TRAIND_GPU_END
