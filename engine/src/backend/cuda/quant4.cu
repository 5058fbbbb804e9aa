// Backend::Dequantize4bit on CUDA and simt: one thread per output element of a row range of a
// 4-bit weight (bitsandbytes' layout and bits, backend/quant4.h), written in the compute type.
#include <string>
#include <type_traits>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ void Store(void* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

// Element (r, c) of rows [r0, r0 + rows): flat index r * cols + c of q; its code is the high
// nibble of byte i / 2 when i is even; value = code value * the block's absmax, one fp32 product
// as bitsandbytes' kernel.
template <typename T>
__global__ void dequantize4bit_kernel(Quant4View q, int64_t cols, int64_t r0, int64_t rows,
                                      void* out, int64_t ld) {
  const int64_t total = rows * cols;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = k / cols, c = k % cols;
    const int64_t i = (r0 + r) * cols + c;
    const uint8_t byte = q.codes[i / 2];
    const uint8_t code = (i % 2 == 0) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 15);
    const float v = Dequantize4(q.type, code) * q.BlockAbsmax(i / kQuant4Block);
    Store<T>(out, r * ld + c, v);
  }
}

}  // namespace

Status Dequantize4bitRows(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                          int64_t ld, DType out_type, cudaStream_t stream) {
  if (cols <= 0 || r0 < 0 || r1 < r0 || ld < cols || r1 * cols > q.n) {
    return Status::InvalidArgument("Dequantize4bit: rows [" + std::to_string(r0) + ", " +
                                   std::to_string(r1) + ") of " + std::to_string(cols) +
                                   " columns (ld " + std::to_string(ld) + ") outside a tensor of " +
                                   std::to_string(q.n) + " elements");
  }
  if (r1 == r0) return Status::Ok();
  const int64_t total = (r1 - r0) * cols;
  const unsigned grid = GridFor(total, kThreads);
  switch (out_type) {
    case DType::kF32:
      return GPU_LAUNCH((dequantize4bit_kernel<float>), grid, kThreads, 0, stream, q, cols, r0, r1 - r0,
                        out, ld);
    case DType::kBF16:
      return GPU_LAUNCH((dequantize4bit_kernel<__nv_bfloat16>), grid, kThreads, 0, stream, q, cols, r0,
                        r1 - r0, out, ld);
    case DType::kF16:
      return GPU_LAUNCH((dequantize4bit_kernel<__half>), grid, kThreads, 0, stream, q, cols, r0, r1 - r0,
                        out, ld);
  }
  return Status::InvalidArgument("Dequantize4bit: unknown output dtype");
}

TRAIND_GPU_END
