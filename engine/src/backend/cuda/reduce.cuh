// Warp and block reductions shared by the kernels (device code; included by .cu files only).
// Every thread of the block must call the block reductions (they contain __syncthreads).
#pragma once

#include "backend/cuda/gpu_compat.h"

TRAIND_GPU_BEGIN

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a 1-D block whose size is a multiple of 32 (<= 1024); every thread gets the result.
// `scratch` is shared memory of 32 T; it may be reused after the call.
template <typename T>
__device__ T BlockSum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : T(0);
  return WarpSum(v);
}
__device__ inline float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

TRAIND_GPU_END
