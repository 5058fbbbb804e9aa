// Adafactor's phases (HF transformers semantics; cpu_optim.h), per parameter of (B, R, C)
// (factored) or n elements (unfactored):
//   stats    factored: a block per row (sum over C), a thread per column (sum over R), a block per
//            batch for the row sum; unfactored: elementwise. Reads g once (twice factored): 4-8
//            bytes per element.
//   sum of update^2  reads g and the statistics: ~4 bytes and 6 FLOPs per element, one double
//            atomic per block.
//   apply    reads p, g (, m) and the statistics, writes p (, m): 12-20 bytes per element.
// -> a (768, 3072) weight (2.4M elements) ~ 60 MB: ~20 us on an H100 (3.0 TB/s).
// Every per-tensor scalar (RMS(p), RMS(update), the row means) stays in device memory.
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/optim_kernels.h"
#include "backend/cuda/reduce.cuh"
#include "backend/optim_math.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

// row[b*R + r] update: one block per row (blockIdx.x = b*R + r).
__global__ void adafactor_row_kernel(const float* grad, float* row, int64_t C, float beta2t,
                                     float one_minus, float eps1, float gs) {
  __shared__ double scratch[32];
  const float* g = grad + int64_t{blockIdx.x} * C;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float x = g[c] * gs;
    s += static_cast<double>(x * x + eps1);
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) {
    float& r = row[blockIdx.x];
    r = r * beta2t + one_minus * static_cast<float>(s / static_cast<double>(C));
  }
}

// col[b*C + c] update: a thread per column, loop over the R rows (coalesced across threads).
__global__ void adafactor_col_kernel(const float* grad, float* col, int64_t R, int64_t C,
                                     float beta2t, float one_minus, float eps1, float gs) {
  const int64_t b = blockIdx.y;
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;  // no barrier in this kernel
  const float* g = grad + b * R * C + c;
  double s = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    const float x = g[r * C] * gs;
    s += static_cast<double>(x * x + eps1);
  }
  float& v = col[b * C + c];
  v = v * beta2t + one_minus * static_cast<float>(s / static_cast<double>(R));
}

// row_sum[b] = sum over R of row[b*R + r]: one block per batch.
__global__ void adafactor_row_sum_kernel(const float* row, double* row_sum, int64_t R) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += row[int64_t{blockIdx.x} * R + r];
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) row_sum[blockIdx.x] = s;
}

__global__ void adafactor_v_kernel(const float* grad, float* v, int64_t n, float beta2t,
                                   float one_minus, float eps1, float gs) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = grad[i] * gs;
    v[i] = v[i] * beta2t + one_minus * (x * x + eps1);
  }
}

// The raw update of element i (before clipping and the step size).
__device__ __forceinline__ float RawUpdate(const float* grad, const float* row, const float* col,
                                           const double* row_sum, const float* v, int64_t i,
                                           int64_t R, int64_t C, float gs) {
  const float g = grad[i] * gs;
  if (v != nullptr) return (1.0f * (1.0f / sqrtf(v[i]))) * g;
  const int64_t c = i % C, br = i / C, b = br / R;
  const float mean = static_cast<float>(row_sum[b] / static_cast<double>(R));
  const float rf = 1.0f / sqrtf(row[br] / mean);
  return (rf * (1.0f / sqrtf(col[b * C + c]))) * g;
}

__global__ void adafactor_update_sq_kernel(double* acc, const float* grad, const float* row,
                                           const float* col, const double* row_sum, const float* v,
                                           int64_t n, int64_t R, int64_t C, float gs) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float u = RawUpdate(grad, row, col, row_sum, v, i, R, C, gs);
    s += static_cast<double>(u) * u;
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(acc, s);
}

__global__ void adafactor_apply_kernel(float* param, float* m, const float* grad, const float* row,
                                       const float* col, const double* row_sum, const float* v,
                                       const double* sums, int64_t n, int64_t R, int64_t C,
                                       float gs, float rel_step, float eps2, bool scale_parameter,
                                       float clip, float beta1, float one_minus_beta1,
                                       float weight_decay) {
  const float step = AdafactorStepSize(sums[0], n, rel_step, eps2, scale_parameter);
  const float div = AdafactorUpdateDivisor(sums[1], n, clip);
  const float neg_decay =
      static_cast<float>(-static_cast<double>(weight_decay) * static_cast<double>(step));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float u = RawUpdate(grad, row, col, row_sum, v, i, R, C, gs);
    u = u / div;
    u = u * step;
    if (m != nullptr) {
      u = m[i] * beta1 + one_minus_beta1 * u;
      m[i] = u;
    }
    float p = param[i];
    p = p + neg_decay * p;
    param[i] = p - u;
  }
}

Status CheckDims(const char* op, int64_t B, int64_t R, int64_t C) {
  if (B < 1 || R < 1 || C < 1 || B > 65535) {
    return Status::InvalidArgument(std::string(op) + ": bad shape (B " + std::to_string(B) +
                                   ", R " + std::to_string(R) + ", C " + std::to_string(C) +
                                   "): each >= 1, B <= 65535");
  }
  return Status::Ok();
}

}  // namespace

Status AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                              int64_t R, int64_t C, float beta2t, float eps1, float grad_scale,
                              cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckDims("AdafactorFactoredStats", B, R, C));
  if (B * R > (int64_t{1} << 31) - 1)
    return Status::InvalidArgument("AdafactorFactoredStats: " + std::to_string(B * R) +
                                   " rows exceed the grid");
  const float one_minus = static_cast<float>(1.0 - static_cast<double>(beta2t));
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(adafactor_row_kernel, static_cast<unsigned>(B * R), kThreads, 0,
                                    stream, grad, row, C, beta2t, one_minus, eps1, grad_scale));
  const dim3 col_grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                      static_cast<unsigned>(B));
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(adafactor_col_kernel, col_grid, kThreads, 0, stream, grad, col,
                                    R, C, beta2t, one_minus, eps1, grad_scale));
  return GPU_LAUNCH(adafactor_row_sum_kernel, static_cast<unsigned>(B), kThreads, 0, stream, row,
                    row_sum, R);
}

Status AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                             float grad_scale, cudaStream_t stream) {
  if (n < 0)
    return Status::InvalidArgument("AdafactorSecondMoment: negative size " + std::to_string(n));
  if (n == 0) return Status::Ok();
  const float one_minus = static_cast<float>(1.0 - static_cast<double>(beta2t));
  return GPU_LAUNCH(adafactor_v_kernel, GridFor(n, kThreads), kThreads, 0, stream, grad, v, n,
                    beta2t, one_minus, eps1, grad_scale);
}

Status AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                                 const double* row_sum, const float* v, int64_t B, int64_t R,
                                 int64_t C, float grad_scale, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckDims("AdafactorUpdateSumSquares", B, R, C));
  const int64_t n = B * R * C;
  return GPU_LAUNCH(adafactor_update_sq_kernel, GridFor(n, kThreads, 1024), kThreads, 0, stream,
                    acc, grad, row, col, row_sum, v, n, R, C, grad_scale);
}

Status AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                      const double* row_sum, const float* v, const double* sums, int64_t B,
                      int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                      bool scale_parameter, float clip_threshold, float beta1, float weight_decay,
                      cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckDims("AdafactorApply", B, R, C));
  const int64_t n = B * R * C;
  const float one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  return GPU_LAUNCH(adafactor_apply_kernel, GridFor(n, kThreads), kThreads, 0, stream, param, m,
                    grad, row, col, row_sum, v, sums, n, R, C, grad_scale, rel_step, eps2,
                    scale_parameter, clip_threshold, beta1, one_minus_beta1, weight_decay);
}

TRAIND_GPU_END
