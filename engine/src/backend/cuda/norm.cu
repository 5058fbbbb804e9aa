// LayerNorm and RMSNorm of the GPU backend, forward and backward (one file, as ggml's norm.cuh).
// One warp per row (C reduced with warp shuffles); the backward accumulates dweight/dbias per block
// in shared memory (shared atomics) and adds them to global memory once per block.
// Memory-bound; roofline on an H100 (3.0 TB/s) per call, fp32, N rows of C:
//   LayerNormForward  reads inp, writes out: 8*N*C bytes, ~8*N*C FLOPs -> N*C = 8M: 21 us
//   LayerNormBackward reads dout, inp, dinp; writes dinp: 16*N*C bytes, ~16*N*C FLOPs -> 8M: 43 us
//   RmsNorm{Fwd,Bwd}  same bytes as LayerNorm                         -> 8M: 21 / 43 us
//   ResidualNormForward reads a, b; writes res and out: 16*N*C bytes (12 with a 16-bit out),
//                     against 20*N*C for Add then the norm (24 with the Cast of a 16-bit out)
// Gradient contract: dinp +=, dweight +=, dbias += (backend.h).
#include <string>
#include <type_traits>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

TRAIND_GPU_BEGIN
namespace {

constexpr int kRowsPerBlock = 8;                // warps per block
constexpr int64_t kMaxSharedC = 40 * 1024 / 8;  // 2 floats per channel in 40 KiB

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t N,
                                         int64_t C, float eps) {
  const int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (row >= N) return;  // whole warp: no block barrier in this kernel
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = WarpSum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float rs = 1.0f / sqrtf(WarpSum(v) / static_cast<float>(C) + eps);
  float* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dweight/dbias: in shared memory when use_shared (2*C floats), else global atomics per element.
__global__ void layernorm_backward_kernel(float* dinp, float* dweight, float* dbias,
                                          const float* dout, const float* inp, const float* weight,
                                          const float* mean, const float* rstd, int64_t N,
                                          int64_t C, bool use_shared) {
  GPU_DYNAMIC_SHARED(float, acc);  // (2, C) when use_shared: [dweight | dbias]
  const int tid = threadIdx.y * 32 + threadIdx.x;
  const int nthreads = blockDim.x * blockDim.y;
  if (use_shared)
    for (int64_t c = tid; c < 2 * C; c += nthreads) acc[c] = 0.0f;
  __syncthreads();
  float* dw = use_shared ? acc : dweight;
  float* db = use_shared ? acc + C : dbias;
  const int lane = threadIdx.x;
  for (int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; row < N;
       row += int64_t{gridDim.x} * blockDim.y) {
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    const float m = mean[row], rs = rstd[row];
    float sum_dn = 0.0f, sum_dn_n = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
      const float n = (x[c] - m) * rs;
      const float dn = weight[c] * dy[c];
      sum_dn += dn;
      sum_dn_n += dn * n;
    }
    const float mean_dn = WarpSum(sum_dn) / static_cast<float>(C);
    const float mean_dn_n = WarpSum(sum_dn_n) / static_cast<float>(C);
    float* dx = dinp + row * C;
    for (int64_t c = lane; c < C; c += 32) {
      const float n = (x[c] - m) * rs;
      const float dn = weight[c] * dy[c];
      dx[c] += (dn - mean_dn - n * mean_dn_n) * rs;
      atomicAdd(&dw[c], n * dy[c]);
      atomicAdd(&db[c], dy[c]);
    }
  }
  __syncthreads();
  if (use_shared)
    for (int64_t c = tid; c < C; c += nthreads) {
      atomicAdd(&dweight[c], acc[c]);
      atomicAdd(&dbias[c], acc[C + c]);
    }
}

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int64_t N, int64_t C, float eps) {
  const int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (row >= N) return;  // whole warp: no block barrier in this kernel
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float rs = 1.0f / sqrtf(WarpSum(ss) / static_cast<float>(C) + eps);
  float* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) o[c] = x[c] * rs * weight[c];
  if (lane == 0) rstd[row] = rs;
}

__global__ void rmsnorm_backward_kernel(float* dinp, float* dweight, const float* dout,
                                        const float* inp, const float* weight, const float* rstd,
                                        int64_t N, int64_t C, bool use_shared) {
  GPU_DYNAMIC_SHARED(float, acc);  // (C) when use_shared: dweight
  const int tid = threadIdx.y * 32 + threadIdx.x;
  const int nthreads = blockDim.x * blockDim.y;
  if (use_shared)
    for (int64_t c = tid; c < C; c += nthreads) acc[c] = 0.0f;
  __syncthreads();
  float* dw = use_shared ? acc : dweight;
  const int lane = threadIdx.x;
  for (int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; row < N;
       row += int64_t{gridDim.x} * blockDim.y) {
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    const float rs = rstd[row];
    float sum_dn_n = 0.0f;
    for (int64_t c = lane; c < C; c += 32) sum_dn_n += weight[c] * dy[c] * x[c] * rs;
    const float mean_dn_n = WarpSum(sum_dn_n) / static_cast<float>(C);
    float* dx = dinp + row * C;
    for (int64_t c = lane; c < C; c += 32) {
      const float n = x[c] * rs;
      dx[c] += (weight[c] * dy[c] - n * mean_dn_n) * rs;
      atomicAdd(&dw[c], n * dy[c]);
    }
  }
  __syncthreads();
  if (use_shared)
    for (int64_t c = tid; c < C; c += nthreads) atomicAdd(&dweight[c], acc[c]);
}

// Per-head RMSNorm in place: one warp per (row, head); the input saved for the backward.
__global__ void head_rmsnorm_forward_kernel(float* x, float* saved, float* rstd,
                                            const float* weight, int64_t N, int64_t n_heads,
                                            int64_t HS, int64_t row_stride, float eps) {
  const int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (r >= N * n_heads) return;  // whole warp: no block barrier in this kernel
  const int lane = threadIdx.x;
  float* h = x + (r / n_heads) * row_stride + (r % n_heads) * HS;
  float ss = 0.0f;
  for (int64_t c = lane; c < HS; c += 32) ss += h[c] * h[c];
  const float rs = 1.0f / sqrtf(WarpSum(ss) / static_cast<float>(HS) + eps);
  for (int64_t c = lane; c < HS; c += 32) {
    const float v = h[c];
    if (saved != nullptr) saved[r * HS + c] = v;
    h[c] = v * rs * weight[c];
  }
  if (lane == 0 && rstd != nullptr) rstd[r] = rs;
}

__global__ void head_rmsnorm_backward_kernel(float* dx, float* dweight, const float* saved,
                                             const float* weight, const float* rstd, int64_t N,
                                             int64_t n_heads, int64_t HS, int64_t row_stride,
                                             bool use_shared) {
  GPU_DYNAMIC_SHARED(float, acc);  // (HS) when use_shared: dweight
  const int tid = threadIdx.y * 32 + threadIdx.x;
  const int nthreads = blockDim.x * blockDim.y;
  if (use_shared)
    for (int64_t c = tid; c < HS; c += nthreads) acc[c] = 0.0f;
  __syncthreads();
  float* dw = use_shared ? acc : dweight;
  const int lane = threadIdx.x;
  const int64_t rows = N * n_heads;
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < rows;
       r += int64_t{gridDim.x} * blockDim.y) {
    const float* xs = saved + r * HS;
    float* d = dx + (r / n_heads) * row_stride + (r % n_heads) * HS;
    const float rs = rstd[r];
    float sum_dn_n = 0.0f;
    for (int64_t c = lane; c < HS; c += 32) sum_dn_n += weight[c] * d[c] * xs[c] * rs;
    const float mean_dn_n = WarpSum(sum_dn_n) / static_cast<float>(HS);
    for (int64_t c = lane; c < HS; c += 32) {
      const float n = xs[c] * rs;
      const float dy = d[c];
      d[c] = (weight[c] * dy - n * mean_dn_n) * rs;
      atomicAdd(&dw[c], n * dy);
    }
  }
  __syncthreads();
  if (use_shared)
    for (int64_t c = tid; c < HS; c += nthreads) atomicAdd(&dweight[c], acc[c]);
}

template <typename O>
__device__ __forceinline__ void StoreAs(O* p, int64_t i, float v) {
  if constexpr (std::is_same_v<O, float>) {
    p[i] = v;
  } else if constexpr (std::is_same_v<O, __nv_bfloat16>) {
    p[i] = __float2bfloat16_rn(v);
  } else {
    p[i] = __float2half_rn(v);
  }
}

// Backend::ResidualNormForward: one warp per row; res = a + b (Add's bits), then the norm of res
// with layernorm_forward_kernel's / rmsnorm_forward_kernel's arithmetic, out stored as O (fp32,
// or rounded to nearest even: the bits of the norm followed by Cast). Each lane reads back only
// the res elements it wrote, so res may alias a or b. b == nullptr: no add, the norm of a (res
// unused): LayerNormForwardRounded / RmsNormForwardRounded.
template <typename O, bool kRms>
__global__ void residual_norm_forward_kernel(float* res, O* out, float* mean, float* rstd,
                                             const float* a, const float* b, const float* weight,
                                             const float* bias, int64_t N, int64_t C, float eps) {
  const int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (row >= N) return;  // whole warp: no block barrier in this kernel
  const int lane = threadIdx.x;
  const float* ar = a + row * C;
  const bool add = b != nullptr;  // uniform
  float* x = add ? res + row * C : nullptr;
  const float* br = add ? b + row * C : nullptr;
  const float* xs = add ? x : ar;  // the normalised row, once written
  O* o = out + row * C;
  float s = 0.0f;  // sum of squares (rms) or sum
  for (int64_t c = lane; c < C; c += 32) {
    const float v = add ? ar[c] + br[c] : ar[c];
    if (add) x[c] = v;
    s += kRms ? v * v : v;
  }
  if constexpr (kRms) {
    const float rs = 1.0f / sqrtf(WarpSum(s) / static_cast<float>(C) + eps);
    for (int64_t c = lane; c < C; c += 32) StoreAs(o, c, xs[c] * rs * weight[c]);
    if (lane == 0) rstd[row] = rs;
  } else {
    const float m = WarpSum(s) / static_cast<float>(C);
    float var = 0.0f;
    for (int64_t c = lane; c < C; c += 32) var += (xs[c] - m) * (xs[c] - m);
    const float rs = 1.0f / sqrtf(WarpSum(var) / static_cast<float>(C) + eps);
    for (int64_t c = lane; c < C; c += 32) StoreAs(o, c, (xs[c] - m) * rs * weight[c] + bias[c]);
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = rs;
    }
  }
}

Status CheckRows(const char* op, int64_t N, int64_t C) {
  if (N < 0 || C <= 0)
    return Status::InvalidArgument(std::string(op) + ": bad shape N=" + std::to_string(N) +
                                   " C=" + std::to_string(C));
  return Status::Ok();
}

unsigned RowBlocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}
// Backward grids: enough blocks to fill a GPU, few enough that the per-block flush stays cheap.
unsigned BackwardBlocks(int64_t N) {
  const int64_t b = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  return static_cast<unsigned>(b < 264 ? b : 264);
}

}  // namespace

Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("LayerNormForward", N, C));
  if (N == 0) return Status::Ok();
  return GPU_LAUNCH(layernorm_forward_kernel, RowBlocks(N), dim3(32, kRowsPerBlock), 0, stream, out,
                    mean, rstd, inp, weight, bias, N, C, eps);
}

Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("LayerNormBackward", N, C));
  if (N == 0) return Status::Ok();
  const bool use_shared = C <= kMaxSharedC;
  const size_t shmem = use_shared ? static_cast<size_t>(2 * C) * sizeof(float) : 0;
  return GPU_LAUNCH(layernorm_backward_kernel, BackwardBlocks(N), dim3(32, kRowsPerBlock), shmem,
                    stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, use_shared);
}

Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("RmsNormForward", N, C));
  if (N == 0) return Status::Ok();
  return GPU_LAUNCH(rmsnorm_forward_kernel, RowBlocks(N), dim3(32, kRowsPerBlock), 0, stream, out,
                    rstd, inp, weight, N, C, eps);
}

Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C,
                       cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("RmsNormBackward", N, C));
  if (N == 0) return Status::Ok();
  const bool use_shared = C <= 2 * kMaxSharedC;
  const size_t shmem = use_shared ? static_cast<size_t>(C) * sizeof(float) : 0;
  return GPU_LAUNCH(rmsnorm_backward_kernel, BackwardBlocks(N), dim3(32, kRowsPerBlock), shmem,
                    stream, dinp, dweight, dout, inp, weight, rstd, N, C, use_shared);
}

namespace {
template <typename O>
Status LaunchResidualNorm(float* res, void* out, float* mean, float* rstd, const float* a,
                          const float* b, const float* weight, const float* bias, int64_t N,
                          int64_t C, float eps, bool rms, cudaStream_t stream) {
  O* o = static_cast<O*>(out);
  if (rms)
    return GPU_LAUNCH((residual_norm_forward_kernel<O, true>), RowBlocks(N),
                      dim3(32, kRowsPerBlock), 0, stream, res, o, mean, rstd, a, b, weight, bias,
                      N, C, eps);
  return GPU_LAUNCH((residual_norm_forward_kernel<O, false>), RowBlocks(N),
                    dim3(32, kRowsPerBlock), 0, stream, res, o, mean, rstd, a, b, weight, bias, N,
                    C, eps);
}
}  // namespace

Status ResidualNormForward(float* res, void* out, DType out_type, float* mean, float* rstd,
                           const float* a, const float* b, const float* weight, const float* bias,
                           int64_t N, int64_t C, float eps, bool rms, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("ResidualNormForward", N, C));
  if (!rms && (mean == nullptr || bias == nullptr))
    return Status::InvalidArgument("ResidualNormForward: LayerNorm needs mean and bias");
  if (b != nullptr && res == nullptr)
    return Status::InvalidArgument("ResidualNormForward: null res");
  if (N == 0) return Status::Ok();
  switch (out_type) {
    case DType::kF32:
      return LaunchResidualNorm<float>(res, out, mean, rstd, a, b, weight, bias, N, C, eps, rms,
                                       stream);
    case DType::kBF16:
      return LaunchResidualNorm<__nv_bfloat16>(res, out, mean, rstd, a, b, weight, bias, N, C, eps,
                                               rms, stream);
    case DType::kF16:
      return LaunchResidualNorm<__half>(res, out, mean, rstd, a, b, weight, bias, N, C, eps, rms,
                                        stream);
  }
  return Status::InvalidArgument("ResidualNormForward: unknown output dtype");
}

Status HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                          int64_t n_heads, int64_t HS, int64_t row_stride, float eps,
                          cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("HeadRmsNormForward", N * n_heads, HS));
  if (N * n_heads == 0) return Status::Ok();
  return GPU_LAUNCH(head_rmsnorm_forward_kernel, RowBlocks(N * n_heads), dim3(32, kRowsPerBlock), 0,
                    stream, x, saved, rstd, weight, N, n_heads, HS, row_stride, eps);
}

Status HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                           const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                           int64_t row_stride, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckRows("HeadRmsNormBackward", N * n_heads, HS));
  if (N * n_heads == 0) return Status::Ok();
  const bool use_shared = HS <= 2 * kMaxSharedC;
  const size_t shmem = use_shared ? static_cast<size_t>(HS) * sizeof(float) : 0;
  return GPU_LAUNCH(head_rmsnorm_backward_kernel, BackwardBlocks(N * n_heads),
                    dim3(32, kRowsPerBlock), shmem, stream, dx, dweight, saved, weight, rstd, N,
                    n_heads, HS, row_stride, use_shared);
}

TRAIND_GPU_END
