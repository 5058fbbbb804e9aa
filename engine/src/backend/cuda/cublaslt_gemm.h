// GEMMs on a CUDA device through cuBLASLt, in the row-major convention of Backend::Gemm
// (C(M,N) = alpha * op(A) op(B) + beta * C): fp32 (optionally TF32 tensor cores), bf16 and fp16
// inputs with fp32 accumulation and an fp32 or same-type C. One handle and one workspace per
// object; calls are issued on the given stream and not synchronized. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/gpu_ns.h"
#include "core/dtype.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

// What cuBLASLt applies to the product before it stores C (an fp32 C only).
struct GemmEpilogue {
  const float* bias = nullptr;  // + bias[n] on every row of the row-major C(M,N)
  // GELU (tanh approximation): C = GELU(product + bias), and gelu_input(M,N), row stride ldc,
  // receives product + bias (cuBLASLt's GELU_AUX / GELU_AUX_BIAS).
  float* gelu_input = nullptr;
};

class CublasLtGemm {
 public:
  // UNAVAILABLE when cuBLASLt cannot start (no device, no driver).
  static Result<std::unique_ptr<CublasLtGemm>> Create(bool allow_tf32);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Whether Run can apply `epilogue` to a row-major C(M,N) with row stride ldc: cuBLASLt wants
  // 16-byte aligned bias and GELU-input pointers and an auxiliary row stride divisible by 8.
  // Otherwise the caller applies them as separate kernels.
  static bool CanFuse(const GemmEpilogue& epilogue, int64_t ldc);

  Status Run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
             int64_t ldc, DType ab_type, DType c_type, cudaStream_t stream,
             const GemmEpilogue& epilogue = GemmEpilogue());

 private:
  CublasLtGemm() = default;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory
  size_t workspace_bytes_ = 0;
  bool allow_tf32_ = false;
};

TRAIND_GPU_END
