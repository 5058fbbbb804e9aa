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

class CublasLtGemm {
 public:
  // UNAVAILABLE when cuBLASLt cannot start (no device, no driver).
  static Result<std::unique_ptr<CublasLtGemm>> Create(bool allow_tf32);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  Status Run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
             int64_t ldc, DType ab_type, DType c_type, cudaStream_t stream);

 private:
  CublasLtGemm() = default;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory
  size_t workspace_bytes_ = 0;
  bool allow_tf32_ = false;
};

TRAIND_GPU_END
