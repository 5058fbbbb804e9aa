// cuBLASLt GEMM: the row-major problem is solved as its column-major transpose,
// C^T(N,M) = op(B)^T(N,K) * op(A)^T(K,M), so A and B swap places and keep their leading dimensions.
// Epilogues (bias, GELU with its input saved) are applied by the same kernel: one pass over C
// instead of three (GEMM, bias add, GELU). cuBLASLt's GELU is the tanh approximation (the form
// llm.c relies on for GPT-2's gelu_new); nothing here has run on a device yet, so the first GPU
// run must compare it with the unfused path (TRAIND_CUBLASLT_EPILOGUES=0 turns fusion off).
#include "backend/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

TRAIND_GPU_BEGIN
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt's heuristics want for Hopper

Status Check(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(call) + " failed with cublasStatus " +
                          std::to_string(static_cast<int>(s)));
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// Frees the cuBLASLt descriptors of one call on every path.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

Result<std::unique_ptr<CublasLtGemm>> CublasLtGemm::Create(bool allow_tf32) {
  std::unique_ptr<CublasLtGemm> g(new CublasLtGemm());
  g->allow_tf32_ = allow_tf32;
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t s = cublasLtCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS)
    return Status::Unavailable("cublasLtCreate failed with cublasStatus " +
                               std::to_string(static_cast<int>(s)));
  g->handle_ = h;
  const cudaError_t e = cudaMalloc(&g->workspace_, kWorkspaceBytes);
  if (e != cudaSuccess)
    return Status::ResourceExhausted(std::string("cuBLASLt workspace: ") + cudaGetErrorString(e));
  g->workspace_bytes_ = kWorkspaceBytes;
  return g;
}

CublasLtGemm::~CublasLtGemm() {
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

bool CublasLtGemm::CanFuse(const GemmEpilogue& e, int64_t ldc) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (e.bias != nullptr && !aligned(e.bias)) return false;
  if (e.gelu_input != nullptr && (!aligned(e.gelu_input) || ldc % 8 != 0)) return false;
  return true;
}

Status CublasLtGemm::Run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
                         void* C, int64_t ldc, DType ab_type, DType c_type, cudaStream_t stream,
                         const GemmEpilogue& epilogue) {
  if (M < 0 || N < 0 || K < 0) return Status::InvalidArgument("Gemm: negative size");
  if (c_type != DType::kF32 && c_type != ab_type)
    return Status::InvalidArgument(std::string("Gemm: C type ") + DTypeName(c_type) +
                                   " must be f32 or the A/B type " + DTypeName(ab_type));
  const bool fused = epilogue.bias != nullptr || epilogue.gelu_input != nullptr;
  if (fused && (c_type != DType::kF32 || !CanFuse(epilogue, ldc)))
    return Status::InvalidArgument("Gemm: this epilogue needs an fp32 C and aligned pointers");
  if (M == 0 || N == 0) return Status::Ok();
  const cublasComputeType_t compute =
      ab_type == DType::kF32 && allow_tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Descs d;
  TRAIND_RETURN_IF_ERROR(
      Check(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  // Column-major: first operand is B (op T when trans_b), second is A (op T when trans_a).
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TRAIND_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                              &op_first, sizeof(op_first)),
                               "TRANSA"));
  TRAIND_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                              &op_second, sizeof(op_second)),
                               "TRANSB"));
  if (fused) {
    // Column-major, C^T is (N, M): cuBLASLt's bias runs along its rows, i.e. our columns n.
    const cublasLtEpilogue_t ep = epilogue.gelu_input == nullptr ? CUBLASLT_EPILOGUE_BIAS
                                  : epilogue.bias == nullptr     ? CUBLASLT_EPILOGUE_GELU_AUX
                                                                 : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    TRAIND_RETURN_IF_ERROR(Check(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)),
        "EPILOGUE"));
    if (epilogue.bias != nullptr) {
      const void* bias = epilogue.bias;
      TRAIND_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(
                                       d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                                   "BIAS_POINTER"));
    }
    if (epilogue.gelu_input != nullptr) {
      void* aux = epilogue.gelu_input;
      const int64_t aux_ld = ldc;
      TRAIND_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(
                                       d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof(aux)),
                                   "EPILOGUE_AUX_POINTER"));
      TRAIND_RETURN_IF_ERROR(Check(cublasLtMatmulDescSetAttribute(
                                       d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                       sizeof(aux_ld)),
                                   "EPILOGUE_AUX_LD"));
    }
  }
  const cudaDataType_t ab = CudaType(ab_type), ct = CudaType(c_type);
  // Stored shapes (rows, cols) in column-major terms.
  const uint64_t first_rows = trans_b ? K : N, first_cols = trans_b ? N : K;
  const uint64_t second_rows = trans_a ? M : K, second_cols = trans_a ? K : M;
  TRAIND_RETURN_IF_ERROR(
      Check(cublasLtMatrixLayoutCreate(&d.a, ab, first_rows, first_cols, ldb), "layout B"));
  TRAIND_RETURN_IF_ERROR(
      Check(cublasLtMatrixLayoutCreate(&d.b, ab, second_rows, second_cols, lda), "layout A"));
  TRAIND_RETURN_IF_ERROR(Check(cublasLtMatrixLayoutCreate(&d.c, ct, N, M, ldc), "layout C"));
  TRAIND_RETURN_IF_ERROR(
      Check(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t ws = workspace_bytes_;
  TRAIND_RETURN_IF_ERROR(
      Check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)),
            "workspace preference"));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  auto h = static_cast<cublasLtHandle_t>(handle_);
  TRAIND_RETURN_IF_ERROR(Check(
      cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found),
      "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0)
    return Status::Unimplemented("cuBLASLt has no algorithm for this GEMM (M=" + std::to_string(M) +
                                 " N=" + std::to_string(N) + " K=" + std::to_string(K) + ")");
  return Check(cublasLtMatmul(h, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                              &heuristic.algo, workspace_, workspace_bytes_, stream),
               "cublasLtMatmul");
}

TRAIND_GPU_END
