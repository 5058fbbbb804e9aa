// The NCCL communicator's 16-bit <-> fp32 kernels (nccl_cast.h). Element-wise, grid-stride:
// n reads of 2 bytes and n writes of 4 bytes (widen), the reverse (narrow).
#include "nccl_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace traind::comm {
namespace {

__global__ void WidenKernel(const uint16_t* in, float* out, int64_t n, bool bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned short h = in[i];
    out[i] = bf16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
  }
}

__global__ void NarrowKernel(const float* in, uint16_t* out, int64_t n, bool bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float f = in[i];
    out[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f))
                  : __half_as_ushort(__float2half_rn(f));
  }
}

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? b : 4096);
}

}  // namespace

cudaError_t WidenToF32(const void* in, float* out, int64_t n, bool bf16, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const uint16_t*>(in), out, n, bf16);
  return cudaGetLastError();
}

cudaError_t NarrowFromF32(const float* in, void* out, int64_t n, bool bf16, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  NarrowKernel<<<Blocks(n), kThreads, 0, stream>>>(in, static_cast<uint16_t*>(out), n, bf16);
  return cudaGetLastError();
}

}  // namespace traind::comm
