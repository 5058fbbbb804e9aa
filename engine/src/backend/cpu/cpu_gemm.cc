// GEMM on the CPU. fp32: oneDNN's dnnl_sgemm when the build has it (its JIT kernels use AVX-512
// whatever OPENBLAS_CORETYPE says, and it threads with the same OpenMP pool as our kernels), else
// OpenBLAS cblas_sgemm, called single-threaded on row blocks that we spread over OpenMP threads;
// TRAIND_CPU_GEMM=openblas forces OpenBLAS. bf16/f16 operands: oneDNN's matmul where it has a
// native kernel (cpu_gemm_dnnl.cc), else widened to fp32 in a reused per-thread scratch (exact),
// multiplied in fp32, and C rounded back to nearest even when it is stored in 16 bits.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef TRAIND_HAVE_DNNL
#include <dnnl.h>
#endif

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_transpose.h"
#include "core/environment.h"

namespace traind::engine::cpu {
namespace {

// Elements spanned by a row-major (rows, cols) matrix with leading dimension ld.
int64_t Span(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 ? 0 : (rows - 1) * ld + cols;
}

const float* Widen(std::vector<float>* buf, const void* src, DType type, int64_t n, int nt) {
  if (type == DType::kF32) return static_cast<const float*>(src);
  buf->resize(static_cast<size_t>(n));
  Cast(buf->data(), DType::kF32, src, type, n, nt);
  return buf->data();
}

// LinearGemm: the widest fp32 product (output columns) that oneDNN's matmul runs with its bias.
constexpr int64_t kMaxFp32MatmulWidth = 1024;

// -1: not decided yet (TRAIND_CPU_GEMM decides on first use), 0: OpenBLAS, 1: oneDNN.
std::atomic<int> g_use_dnnl{-1};

bool UseDnnl() {
#ifdef TRAIND_HAVE_DNNL
  int v = g_use_dnnl.load(std::memory_order_relaxed);
  if (v < 0) {
    v = ReadEngineEnvironment().cpu_gemm_openblas ? 0 : 1;  // TRAIND_CPU_GEMM
    g_use_dnnl.store(v, std::memory_order_relaxed);
  }
  return v == 1;
#else
  return false;
#endif
}

// B (N x K, row stride ldb) transposed into a reused per-thread (K x N) scratch, on the calling
// thread (a second parallel region cost more than it saved: ops_bench layouts).
TRAIND_CPU_CLONES void TransposeInto(float* dst, const float* b, int64_t ldb, int64_t N,
                                     int64_t K) {
  TransposeBlock(dst, N, b, ldb, N, K);
}

const float* TransposedB(const float* b, int64_t ldb, int64_t N, int64_t K) {
  static thread_local std::vector<float> bt;  // reused: no steady-state allocation
  bt.resize(static_cast<size_t>(N * K));
  TransposeInto(bt.data(), b, ldb, N, K);
  return bt.data();
}

}  // namespace

void Sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int nt) {
#ifdef TRAIND_HAVE_DNNL
  if (UseDnnl()) {
    // oneDNN (OpenMP runtime) uses omp_get_max_threads() of the calling thread.
    if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
    // oneDNN's sgemm runs a transposed B whose rows are long and few far slower than a plain B
    // (ops_bench layouts, 2 threads, before this: NT 1024x256x1024 175 GFLOP/s against NN 223,
    // 256x256x1024 106 against 211; small's 2048x384x1536 173 in its step profile; TT likewise):
    // such a B (N <= 512) is transposed into scratch first, N*K copies against M*N*K products.
    if (tb && N <= 512 && M >= 256 && K >= 256) {
      b = TransposedB(b, ldb, N, K);
      ldb = N;
      tb = false;
    }
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, a, lda, b, ldb, beta, c, ldc) ==
        dnnl_success) {
      return;
    }
  }
#endif
  // OpenBLAS runs single-threaded (SetGemmThreads); we split the rows of C over our own OpenMP
  // threads, so no second thread pool competes with OpenMP's for the cores.
  auto rows = [&](int64_t m0, int64_t m1) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m1 - m0), static_cast<blasint>(N), static_cast<blasint>(K),
                alpha, a + (ta ? m0 : m0 * lda), static_cast<blasint>(lda), b,
                static_cast<blasint>(ldb), beta, c + m0 * ldc, static_cast<blasint>(ldc));
  };
  const int threads = (nt > 1 && M >= 64 && M * N * K >= (1 << 20) && !omp_in_parallel()) ? nt : 1;
  if (threads == 1) {
    rows(0, M);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const int64_t per = ((M + n - 1) / n + 15) / 16 * 16;
    const int64_t m0 = std::min(M, per * t), m1 = std::min(M, m0 + per);
    if (m1 > m0) rows(m0, m1);
  }
}

bool LinearGemm(float* out, const void* inp, const void* weight, const float* bias, int64_t N,
                int64_t C, int64_t OC, DType type, int nt) {
  // fp32 products wider than kMaxFp32MatmulWidth outputs run dnnl_sgemm and leave the bias to the
  // caller: oneDNN's matmul (weights read transposed) was slower there than sgemm and a bias pass
  // (ops_bench linear, 2 threads: 2048x1536x384 6.87 ms against 5.89 + 0.39, 2048x1152x384 5.15
  // against 4.47 + 0.26) and, before a GELU (whose pass adds the bias), than sgemm alone (ops_bench
  // gelufwd: 2048x1536x384 7.80-7.93 ms against 7.64-7.68 with the GELU). At 1024 outputs the
  // matmul still won with its GELU (1.75 against 2.01 ms: the GELU then reads an output still in
  // cache).
  const bool matmul_bias = type != DType::kF32 || OC <= kMaxFp32MatmulWidth;
  if (bias != nullptr && matmul_bias && UseDnnl() &&
      DnnlMatmul(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, type, DType::kF32,
                 bias, nt)) {
    return true;
  }
  Gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, type, DType::kF32, nt);
  return false;
}

void SetGemmThreads(int nt) { openblas_set_num_threads(1); }

const char* GemmLibrary() { return UseDnnl() ? "onednn" : "openblas"; }

bool SetGemmLibraryForTesting(bool use_onednn) {
#ifdef TRAIND_HAVE_DNNL
  g_use_dnnl.store(use_onednn ? 1 : 0);
  return true;
#else
  return !use_onednn;
#endif
}

void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, DType ab_type,
          DType c_type, int nt) {
  if (M <= 0 || N <= 0) return;
  // An fp32 packed weight (Backend::PackGemmB) goes to oneDNN's matmul (16-bit B: DnnlGemm16's
  // matmul below looks the packed copy up itself).
  if (ab_type == DType::kF32 && K > 0 && UseDnnl() &&
      DnnlMatmulPackedB(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type,
                        c_type, nt)) {
    return;
  }
  if (ab_type != DType::kF32 && K > 0 && UseDnnl() &&
      DnnlGemm16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type,
                 nt)) {
    return;
  }
  static thread_local std::vector<float> a_buf, b_buf, c_buf;  // reused: no steady-state allocation
  const float* a = Widen(&a_buf, A, ab_type, trans_a ? Span(K, M, lda) : Span(M, K, lda), nt);
  const float* b = Widen(&b_buf, B, ab_type, trans_b ? Span(N, K, ldb) : Span(K, N, ldb), nt);
  float* c = static_cast<float*>(C);
  const int64_t c_span = Span(M, N, ldc);
  if (c_type != DType::kF32) {
    c_buf.resize(static_cast<size_t>(c_span));
    if (beta != 0.0f) Cast(c_buf.data(), DType::kF32, C, c_type, c_span, nt);
    c = c_buf.data();
  }
  if (K <= 0) {  // C = beta * C (BLAS semantics; beta == 0 clears, even NaNs)
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
  } else {
    Sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, nt);
  }
  if (c_type != DType::kF32) {
    // Round back only the M x N block: the gaps between rows (ldc > N) keep their bytes.
    auto* out = static_cast<uint16_t*>(C);
    for (int64_t i = 0; i < M; ++i) {
      const float* row = c + i * ldc;
      uint16_t* dst = out + i * ldc;
      for (int64_t j = 0; j < N; ++j) {
        dst[j] = c_type == DType::kBF16 ? F32ToBF16(row[j]) : F32ToF16(row[j]);
      }
    }
  }
}

}  // namespace traind::engine::cpu
