// Rotary position embedding (HF rotate-half) of the GPU backend, in place, forward and inverse.
// One thread per (row, head, i < HS/2) pair; inv_freq and the angle are formed in fp32 as HF does
// (inv_freq = 1 / theta^(2i/HS), angle = float(t) * inv_freq). Memory-bound:
//   x (B*T, row_stride) with n_heads*HS rotated floats per row: 8*B*T*n_heads*HS bytes,
// positions (device int32 per row, packed rows) replaces pos_offset + r % T when not null.
//   ~6 FLOPs + sincos per pair -> B*T = 16K rows, 32 heads of 128: 64M floats = 512 MB: 170 us.
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"
#include "backend/rope_freq.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(float* x, int64_t rows, int64_t T, int64_t n_heads, int64_t HS,
                            int64_t row_stride, float theta, bool inverse, int64_t pos_offset,
                            RopeScaling scaling, const int32_t* positions) {
  const int64_t half = HS / 2;
  const int64_t total = rows * n_heads * half;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = p % half;
    const int64_t h = (p / half) % n_heads;
    const int64_t r = p / (half * n_heads);
    const float inv_freq = RopeInvFreq(i, HS, theta, scaling);
    const int64_t t = positions != nullptr ? positions[r] : pos_offset + r % T;
    const float ang = static_cast<float>(t) * inv_freq;
    const float c = cosf(ang);
    const float s = inverse ? -sinf(ang) : sinf(ang);
    float* head = x + r * row_stride + h * HS;
    const float x1 = head[i], x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

Status Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
            float theta, bool inverse, int64_t pos_offset, const RopeScaling& scaling,
            cudaStream_t stream, const int32_t* positions) {
  if (HS <= 0 || HS % 2 != 0)
    return Status::InvalidArgument("Rope: head size must be even and positive, got " +
                                   std::to_string(HS));
  if (row_stride < n_heads * HS)
    return Status::InvalidArgument("Rope: row_stride " + std::to_string(row_stride) +
                                   " < n_heads*HS " + std::to_string(n_heads * HS));
  const int64_t total = B * T * n_heads * (HS / 2);
  if (total <= 0) return Status::Ok();
  return GPU_LAUNCH(rope_kernel, GridFor(total, kThreads), kThreads, 0, stream, x, B * T, T,
                    n_heads, HS, row_stride, theta, inverse, pos_offset, scaling, positions);
}

TRAIND_GPU_END
