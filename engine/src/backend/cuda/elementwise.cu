// Elementwise and small ops of the GPU backend: embedding forward/backward, bias add/backward, add,
// scale, sum of squares (global grad-norm), casts and the non-finite check. Memory-bound; roofline
// on an H100 (3.0 TB/s) per call, fp32, with n elements:
//   EmbeddingForward   out(N,C) = table[ids]: 8*N*C bytes (+4*N*C when accumulate) -> N*C=4M: 11 us
//   EmbeddingBackward  dtable[ids] += dout (atomics): 12*N*C bytes                 -> 4M: 16 us
//   AddBias            out(N,OC) += bias: 8*N*OC bytes, N*OC FLOPs                  -> 4M: 11 us
//   BiasBackward       dbias(OC) += colsum dout: 4*N*OC bytes, N*OC FLOPs           -> 4M: 5.6 us
//   BiasBackwardRounded  BiasBackward and the 16-bit copy of dout in the same pass: 6*N*OC bytes
//                      (4M: 8.4 us), against 4 + 6 for BiasBackward then Cast
//   Add / Scale        12n / 8n bytes, n FLOPs                                      -> 4M: 16 / 11 us
//   SumSquares         4n bytes, 2n FLOPs (one double atomic per block)            -> 124M: 165 us
//   WeightedSum        4n bytes, n FLOPs (the loss sum; n = N = B*T)               -> 8K: ~3 us (launch)
//   Cast               (src+dst bytes) * n                                         -> 4M f32->bf16: 8 us
//   FlagNonFinite      4n bytes                                                     -> 124M: 165 us
// Gradient contract (backend.h): parameter gradients +=, activation gradients =.
#include <string>
#include <type_traits>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

__global__ void embedding_forward_kernel(float* out, const int32_t* ids, const float* table,
                                         int64_t N, int64_t C, bool accumulate) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const float v = table[int64_t{ids[n]} * C + c];
    out[i] = accumulate ? out[i] + v : v;
  }
}

__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* ids,
                                          int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    atomicAdd(&dtable[int64_t{ids[n]} * C + c], dout[i]);
  }
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
  const int64_t total = N * OC;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] += bias[i % OC];
}

__global__ void scale_rows_kernel(float* x, const float* w, int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] *= w[i / C];
}

// One block of 256 threads per row: strided partial sums in double, a shared-memory tree.
__global__ void row_dot_kernel(float* out, const float* a, const float* b, int64_t C) {
  __shared__ double part[256];
  const int64_t n = blockIdx.x;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    s += static_cast<double>(a[n * C + c]) * b[n * C + c];
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[n] = static_cast<float>(part[0]);
}

// Block (32, 8): 32 columns per block, 8 row lanes summed through shared memory.
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] *= s;
}

__global__ void sum_squares_kernel(double* result, const float* x, int64_t n) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    s += double{x[i]} * x[i];
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(result, s);
}

__global__ void weighted_sum_kernel(double* result, const float* x, int64_t n,
                                    const float* weight) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    s += double{x[i]};
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(result, double{*weight} * s);
}

template <typename T>
__device__ __forceinline__ float LoadAsFloat(const void* p, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  } else {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
}
template <typename T>
__device__ __forceinline__ void StoreFloat(void* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

template <typename D, typename S>
__global__ void cast_kernel(void* dst, const void* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    StoreFloat<D>(dst, i, LoadAsFloat<S>(src, i));
}

// dbias(OC) += the column sums of dout: 32 columns a block, 8 rows of partial sums then their
// sum in row order (fixed, so a run gives the same bits). kRound: each element read is also
// stored rounded to D into dout16 (BiasBackwardRounded: one pass over dout for both).
template <typename D, bool kRound>
__global__ void bias_backward_kernel(float* dbias, const float* dout, void* dout16, int64_t N,
                                     int64_t OC) {
  __shared__ float part[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  float s = 0.0f;
  if (c < OC)
    for (int64_t n = threadIdx.y; n < N; n += 8) {
      const float v = dout[n * OC + c];
      s += v;
      if constexpr (kRound) StoreFloat<D>(dout16, n * OC + c, v);
    }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float t = 0.0f;
    for (int r = 0; r < 8; ++r) t += part[r][threadIdx.x];
    dbias[c] += t;
  }
}

__global__ void flag_non_finite_kernel(int* flag, const float* x, int64_t n) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    bad = bad || !isfinite(x[i]);
  if (bad) atomicExch(flag, 1);
}

Status CheckCount(const char* op, int64_t n) {
  if (n < 0)
    return Status::InvalidArgument(std::string(op) + ": negative size " + std::to_string(n));
  return Status::Ok();
}

template <typename D>
Status CastFrom(void* dst, const void* src, DType src_type, int64_t n, cudaStream_t stream) {
  const unsigned grid = GridFor(n, kThreads);
  switch (src_type) {
    case DType::kF32:
      return GPU_LAUNCH((cast_kernel<D, float>), grid, kThreads, 0, stream, dst, src, n);
    case DType::kBF16:
      return GPU_LAUNCH((cast_kernel<D, __nv_bfloat16>), grid, kThreads, 0, stream, dst, src, n);
    case DType::kF16:
      return GPU_LAUNCH((cast_kernel<D, __half>), grid, kThreads, 0, stream, dst, src, n);
  }
  return Status::InvalidArgument("Cast: unknown source dtype");
}

}  // namespace

Status EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                        bool accumulate, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("EmbeddingForward", N * C));
  if (N * C == 0) return Status::Ok();
  return GPU_LAUNCH(embedding_forward_kernel, GridFor(N * C, kThreads), kThreads, 0, stream, out,
                    ids, table, N, C, accumulate);
}

Status EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                         cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("EmbeddingBackward", N * C));
  if (N * C == 0) return Status::Ok();
  return GPU_LAUNCH(embedding_backward_kernel, GridFor(N * C, kThreads), kThreads, 0, stream,
                    dtable, dout, ids, N, C);
}

Status AddBias(float* out, const float* bias, int64_t N, int64_t OC, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("AddBias", N * OC));
  if (N * OC == 0) return Status::Ok();
  return GPU_LAUNCH(add_bias_kernel, GridFor(N * OC, kThreads), kThreads, 0, stream, out, bias, N,
                    OC);
}

Status BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("BiasBackward", N * OC));
  if (N * OC == 0) return Status::Ok();
  const unsigned grid = static_cast<unsigned>((OC + 31) / 32);
  return GPU_LAUNCH((bias_backward_kernel<float, false>), grid, dim3(32, 8), 0, stream, dbias,
                    dout, nullptr, N, OC);
}

Status BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                           DType type, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("BiasBackwardRounded", N * OC));
  if (N * OC == 0) return Status::Ok();
  const unsigned grid = static_cast<unsigned>((OC + 31) / 32);
  switch (type) {
    case DType::kBF16:
      return GPU_LAUNCH((bias_backward_kernel<__nv_bfloat16, true>), grid, dim3(32, 8), 0,
                        stream, dbias, dout, dout16, N, OC);
    case DType::kF16:
      return GPU_LAUNCH((bias_backward_kernel<__half, true>), grid, dim3(32, 8), 0, stream,
                        dbias, dout, dout16, N, OC);
    case DType::kF32:
      break;
  }
  return Status::InvalidArgument("BiasBackwardRounded: the rounded type must be bf16 or f16");
}

Status ScaleRows(float* x, const float* w, int64_t N, int64_t C, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("ScaleRows", N * C));
  if (N * C == 0) return Status::Ok();
  return GPU_LAUNCH(scale_rows_kernel, GridFor(N * C, kThreads), kThreads, 0, stream, x, w, N, C);
}

Status RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C,
              cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("RowDot", N * C));
  if (N == 0) return Status::Ok();
  return GPU_LAUNCH(row_dot_kernel, static_cast<unsigned>(N), 256, 0, stream, out, a, b, C);
}

Status Add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("Add", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(add_kernel, GridFor(n, kThreads), kThreads, 0, stream, out, a, b, n);
}

Status Scale(float* x, float s, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("Scale", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(scale_kernel, GridFor(n, kThreads), kThreads, 0, stream, x, s, n);
}

Status SumSquares(double* result, const float* x, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("SumSquares", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(sum_squares_kernel, GridFor(n, kThreads, 1024), kThreads, 0, stream, result, x,
                    n);
}

Status WeightedSum(double* result, const float* x, int64_t n, const float* weight,
                   cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("WeightedSum", n));
  if (weight == nullptr) return Status::InvalidArgument("WeightedSum: null weight");
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(weighted_sum_kernel, GridFor(n, kThreads, 1024), kThreads, 0, stream, result,
                    x, n, weight);
}

Status Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
            cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("Cast", n));
  if (n == 0) return Status::Ok();
  switch (dst_type) {
    case DType::kF32:
      return CastFrom<float>(dst, src, src_type, n, stream);
    case DType::kBF16:
      return CastFrom<__nv_bfloat16>(dst, src, src_type, n, stream);
    case DType::kF16:
      return CastFrom<__half>(dst, src, src_type, n, stream);
  }
  return Status::InvalidArgument("Cast: unknown destination dtype");
}

Status FlagNonFinite(int* flag, const float* x, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(CheckCount("FlagNonFinite", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(flag_non_finite_kernel, GridFor(n, kThreads, 1024), kThreads, 0, stream, flag,
                    x, n);
}

TRAIND_GPU_END
