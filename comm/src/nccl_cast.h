// 16-bit <-> fp32 on the device for the NCCL communicator's fp32 accumulation: widen bf16/f16 to
// fp32, round fp32 back to nearest even (NaN stays NaN). Launched on the given stream; return the
// launch error. Private to comm/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace traind::comm {

// out[0..n) = in[0..n) as fp32; `in` holds bf16 (bf16 = true) or f16 bits.
cudaError_t WidenToF32(const void* in, float* out, int64_t n, bool bf16, cudaStream_t stream);
// out[0..n) = in[0..n) rounded to bf16 / f16, nearest even.
cudaError_t NarrowFromF32(const float* in, void* out, int64_t n, bool bf16, cudaStream_t stream);

}  // namespace traind::comm
