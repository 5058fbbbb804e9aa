// CpuBackend: the reference backend. Host memory (64-byte aligned; blocks of 2 MiB and more on
// 2 MiB boundaries as transparent huge pages), synchronous ops, kernels in cpu_*.cc threaded with
// OpenMP over `threads` threads (GEMM libraries too; see cpu_gemm.cc).
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/device_registry.h"

namespace traind::engine {
namespace {

// The threads the kernels ask for: the job's (0 = every processor), never more than
// OMP_THREAD_LIMIT lets a parallel region have. Asking oneDNN for more threads than run made its
// results depend on the process's history, so a resumed run was no longer bit-identical.
int UsableThreads(int threads) {
  const int want = threads > 0 ? threads : omp_get_num_procs();
  return std::max(1, std::min(want, omp_get_thread_limit()));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : nt_(UsableThreads(threads)) {
    cpu::SetGemmThreads(nt_);
  }
  ~CpuBackend() override { cpu::DnnlForgetPackedB(nullptr, reinterpret_cast<const void*>(~uintptr_t{0}), this); }
  std::string name() const override { return "cpu"; }
  bool Supports(Op /*op*/) const override { return true; }  // the reference: every op
  DeviceCapabilities capabilities() const override {
    return DeviceCapabilitiesOf(DeviceKind::kCpu);
  }

  // Large blocks (weights, gradients, optimizer state, activations) are 2 MiB aligned and asked to
  // be transparent huge pages (MADV_HUGEPAGE: the kernel's default THP mode is often "madvise"):
  // one page fault per 2 MiB instead of 512, which made the arena's first touch (its Memset0) of
  // the tiny gpt2's 100 MiB take 0.28 s on a VM whose page faults are slow, and fewer TLB misses
  // in the kernels. The advice is a hint: where THP is off it is ignored, and so is its error.
  void* Alloc(size_t bytes) override {
    constexpr size_t kHuge = size_t{2} << 20;
    void* p = nullptr;
    if (bytes >= kHuge) {
      const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
      if (posix_memalign(&p, kHuge, rounded) != 0) return nullptr;
      (void)madvise(p, rounded, MADV_HUGEPAGE);
      return p;
    }
    const size_t rounded = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, rounded == 0 ? 64 : rounded) != 0) return nullptr;
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  void CopyHostToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void CopyDeviceToHost2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                          size_t width, size_t height) override {
    if (width == 0) return;
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
    }
  }
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  void Memset0(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void Synchronize() override {}

  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            DType ab_type, DType c_type) override {
    cpu::Gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type, nt_);
  }

  void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                        bool accumulate) override {
    cpu::EmbeddingForward(out, ids, table, N, C, accumulate, nt_);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                         int64_t C) override {
    cpu::EmbeddingBackward(dtable, dout, ids, N, C, nt_);
  }
  // Packed weights: oneDNN's blocked bf16 layout (cpu_gemm_dnnl.cc).
  int64_t PackedGemmBBytes(int64_t K, int64_t N, DType type) const override {
    return cpu::DnnlPackedBBytes(K, N, type);
  }
  bool PackGemmB(void* storage, int64_t storage_bytes, const void* B, bool trans_b, int64_t K,
                 int64_t N, int64_t ldb, DType type) override {
    return cpu::DnnlPackB(storage, storage_bytes, B, trans_b, K, N, ldb, type, this, nt_);
  }
  void ForgetPackedGemmB(const void* begin, const void* end) override {
    cpu::DnnlForgetPackedB(begin, end, nullptr);
  }

  // The product with the bias added as it is stored where the library can (cpu::LinearGemm), else
  // the bias in the same pass over each row as the GELU (backend.h's LinearForward).
  void LinearForward(float* pre, float* act, const void* inp, const void* weight, const float* bias,
                     int64_t N, int64_t C, int64_t OC, DType type) override {
    if (cpu::LinearGemm(pre, inp, weight, bias, N, C, OC, type, nt_)) bias = nullptr;
    if (act != nullptr) {
      cpu::BiasGelu(pre, bias, N, OC, act, DType::kF32, nt_);
    } else if (bias != nullptr) {
      cpu::AddBias(pre, bias, N, OC, nt_);
    }
  }
  void LinearForwardRoundedAct(float* pre, void* act, DType act_type, float* /*scratch*/,
                               const void* inp, const void* weight, const float* bias, int64_t N,
                               int64_t C, int64_t OC, DType type) override {
    if (cpu::LinearGemm(pre, inp, weight, bias, N, C, OC, type, nt_)) bias = nullptr;
    cpu::BiasGelu(pre, bias, N, OC, act, act_type, nt_);
  }
  void BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                           DType type) override {
    cpu::BiasBackwardRounded(dbias, dout, N, OC, dout16, type, nt_);
  }
  void GeluBackwardBias(float* dinp, const float* inp, const float* dout, float* dbias, int64_t N,
                        int64_t OC, void* dinp16, DType type) override {
    cpu::GeluBackwardBias(dinp, inp, dout, dbias, N, OC, dinp16, type, nt_);
  }
  void AddBias(float* out, const float* bias, int64_t N, int64_t OC) override {
    cpu::AddBias(out, bias, N, OC, nt_);
  }
  void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) override {
    cpu::BiasBackward(dbias, dout, N, OC, nt_);
  }
  void ScaleRows(float* x, const float* w, int64_t N, int64_t C) override {
    cpu::ScaleRows(x, w, N, C, nt_);
  }
  void RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C) override {
    cpu::RowDot(out, a, b, N, C, nt_);
  }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
    cpu::Add(out, a, b, n, nt_);
  }
  void Scale(float* x, float s, int64_t n) override { cpu::Scale(x, s, n, nt_); }
  double SumSquares(const float* x, int64_t n) override { return cpu::SumSquares(x, n, nt_); }
  bool HasNonFinite(const float* x, int64_t n) override { return cpu::HasNonFinite(x, n, nt_); }
  void AccumulateSumSquares(double* acc, const float* x, int64_t n) override {
    *acc += cpu::SumSquares(x, n, nt_);
  }
  void AccumulateSum(double* acc, const float* x, int64_t n, const float* weight) override {
    double sum = 0.0;  // in order, as the host-side loss mean sums the per-position losses
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    *acc += static_cast<double>(*weight) * sum;
  }
  void Dequantize4bit(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out, int64_t ld,
                      DType out_type) override {
    cpu::Dequantize4bitRows(q, cols, r0, r1, out, ld, out_type, nt_);
  }
  void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) override {
    cpu::Cast(dst, dst_type, src, src_type, n, nt_);
  }
  void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
               const uint64_t* key, uint64_t stream, bool accumulate) override {
    cpu::Dropout(out, inp, inp_type, n, p, *key, stream, accumulate, nt_);
  }

  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps) override {
    cpu::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, nt_);
  }
  void LayerNormForwardRounded(void* out16, DType out_type, float* /*out32*/, float* mean,
                               float* rstd, const float* inp, const float* weight,
                               const float* bias, int64_t N, int64_t C, float eps) override {
    cpu::LayerNormForwardRounded(out16, out_type, mean, rstd, inp, weight, bias, N, C, eps, nt_);
  }
  void ResidualNormForward(float* res, void* out, DType out_type, float* /*scratch*/, float* mean,
                           float* rstd, const float* a, const float* b, const float* weight,
                           const float* bias, int64_t N, int64_t C, float eps, bool rms) override {
    cpu::ResidualNormForward(res, out, out_type, mean, rstd, a, b, weight, bias, N, C, eps, rms,
                             nt_);
  }
  void RmsNormForwardRounded(void* out16, DType out_type, float* /*out32*/, float* rstd,
                             const float* inp, const float* weight, int64_t N, int64_t C,
                             float eps) override {
    cpu::RmsNormForwardRounded(out16, out_type, rstd, inp, weight, N, C, eps, nt_);
  }
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C) override {
    cpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, nt_);
  }
  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    cpu::RmsNormForward(out, rstd, inp, weight, N, C, eps, nt_);
  }
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    cpu::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, nt_);
  }

  void GeluForward(float* out, const float* inp, int64_t n) override {
    cpu::GeluForward(out, inp, n, nt_);
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    cpu::GeluBackward(dinp, inp, dout, n, nt_);
  }
  void GeluErfForward(float* out, const float* inp, int64_t n) override {
    cpu::GeluErfForward(out, inp, n, nt_);
  }
  void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    cpu::GeluErfBackward(dinp, inp, dout, n, nt_);
  }
  void TanhForward(float* out, const float* inp, int64_t n) override {
    cpu::TanhForward(out, inp, n, nt_);
  }
  void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) override {
    cpu::TanhBackward(dinp, out, dout, n, nt_);
  }
  void SwiGluForward(float* out, const float* inp, int64_t N, int64_t H) override {
    cpu::SwiGluForward(out, inp, N, H, nt_);
  }
  void SwiGluForwardRounded(void* out, DType out_type, float* /*scratch*/, const float* inp,
                            int64_t N, int64_t H) override {
    cpu::SwiGluForwardRounded(out, out_type, inp, N, H, nt_);
  }
  void SwiGluBackwardRounded(float* dinp, void* dinp16, DType type, const float* inp,
                             const float* dout, int64_t N, int64_t H) override {
    cpu::SwiGluBackwardRounded(dinp, dinp16, type, inp, dout, N, H, nt_);
  }
  void GeGluForward(float* out, const float* inp, int64_t N, int64_t H) override {
    cpu::GeGluForward(out, inp, N, H, nt_);
  }
  void GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                     int64_t H) override {
    cpu::GeGluBackward(dinp, inp, dout, N, H, nt_);
  }
  void HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                          int64_t n_heads, int64_t HS, int64_t row_stride, float eps) override {
    cpu::HeadRmsNormForward(x, saved, rstd, weight, N, n_heads, HS, row_stride, eps, nt_);
  }
  void HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                           const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                           int64_t row_stride) override {
    cpu::HeadRmsNormBackward(dx, dweight, saved, weight, rstd, N, n_heads, HS, row_stride, nt_);
  }
  void SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                      int64_t H) override {
    cpu::SwiGluBackward(dinp, inp, dout, N, H, nt_);
  }

  void Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
            float theta, bool inverse, int64_t pos_offset = 0,
            const RopeScaling& scaling = RopeScaling{},
            const int32_t* positions = nullptr) override {
    cpu::Rope(x, B, T, n_heads, HS, row_stride, theta, inverse, pos_offset, scaling, nt_,
              positions);
  }
  void AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                       int64_t q_stride, int64_t kv_stride, int64_t window = 0) override {
    cpu::AttentionDecode(out, q, k, v, B, T, cache_rows, NH, NKV, HS, q_stride, kv_stride, window,
                         nt_);
  }

  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                        int64_t kv_stride, bool causal = true, const int32_t* key_mask = nullptr,
                        DType operand_type = DType::kF32, int64_t window = 0,
                        const int32_t* doc_start = nullptr) override {
    cpu::AttentionForward(out, lse, q, k, v, B, T, NH, NKV, HS, q_stride, kv_stride, causal,
                          key_mask, operand_type, window, nt_, doc_start);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal = true,
                         const int32_t* key_mask = nullptr,
                         DType operand_type = DType::kF32, int64_t window = 0,
                         const int32_t* doc_start = nullptr) override {
    cpu::AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, q_stride,
                           kv_stride, causal, key_mask, operand_type, window, nt_, doc_start);
  }
  void AttentionForward16(void* out, float* lse, const void* q, const void* k, const void* v,
                          DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                          int64_t q_stride, int64_t kv_stride, bool causal = true,
                          const int32_t* key_mask = nullptr, int64_t window = 0,
                          const int32_t* doc_start = nullptr) override {
    cpu::AttentionForward16Bit(out, lse, q, k, v, type, B, T, NH, NKV, HS, q_stride, kv_stride,
                               causal, key_mask, window, nt_, doc_start);
  }
  void AttentionBackward16(float* dq, float* dk, float* dv, const void* dout, const void* out,
                           const float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, bool causal = true,
                           const int32_t* key_mask = nullptr, int64_t window = 0,
                           const int32_t* doc_start = nullptr) override {
    cpu::AttentionBackward16Bit(dq, dk, dv, dout, out, lse, q, k, v, type, B, T, NH, NKV, HS,
                                q_stride, kv_stride, causal, key_mask, window, nt_, doc_start);
  }

  void SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float grad_scale, bool compute_grad,
                           const float* device_scale, void* grad16 = nullptr,
                           DType grad16_type = DType::kBF16) override {
    const float scale = device_scale != nullptr ? grad_scale * *device_scale : grad_scale;
    if (compute_grad && grad16 != nullptr) {
      cpu::SoftmaxCrossEntropy16(logits, grad16, grad16_type, losses, targets, N, V, Vp, scale,
                                 nt_);
      return;
    }
    cpu::SoftmaxCrossEntropy(logits, losses, targets, N, V, Vp, scale, compute_grad, nt_);
  }

  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bias_correction1,
             float bias_correction2, float grad_scale) override {
    cpu::AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bias_correction1,
               bias_correction2, grad_scale, nt_);
  }
  void AdamWFromScalars(float* param, const float* grad, float* m, float* v, int64_t n,
                        const StepScalars* s, float beta1, float beta2, float eps,
                        float weight_decay) override {
    if (s->skip_nonfinite != 0 && !std::isfinite(s->grad_sq)) return;
    cpu::AdamW(param, grad, m, v, n, s->lr, beta1, beta2, eps, weight_decay, s->bias_correction1,
               s->bias_correction2, StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm),
               nt_);
  }
  void AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                            const AdamWRun* runs, int64_t n_runs, const StepScalars* s, float beta1,
                            float beta2, float eps) override {
    if (s->skip_nonfinite != 0 && !std::isfinite(s->grad_sq)) return;
    cpu::AdamWRuns(param, grad, m, v, runs, n_runs, s->lr, beta1, beta2, eps, s->bias_correction1,
                   s->bias_correction2,
                   StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm), nt_);
  }
  void SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                 float dampening, float weight_decay, bool nesterov, bool first_step,
                 float grad_scale, const StepScalars* s) override {
    cpu::SgdUpdate(param, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov, first_step,
                   grad_scale, s, nt_);
  }
  void AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                              int64_t R, int64_t C, float beta2t, float eps1,
                              float grad_scale) override {
    cpu::AdafactorFactoredStats(grad, row, col, row_sum, B, R, C, beta2t, eps1, grad_scale, nt_);
  }
  void AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                             float grad_scale) override {
    cpu::AdafactorSecondMoment(grad, v, n, beta2t, eps1, grad_scale, nt_);
  }
  void AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                                 const double* row_sum, const float* v, int64_t B, int64_t R,
                                 int64_t C, float grad_scale) override {
    cpu::AdafactorUpdateSumSquares(acc, grad, row, col, row_sum, v, B, R, C, grad_scale, nt_);
  }
  void AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                      const double* row_sum, const float* v, const double* sums, int64_t B,
                      int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                      bool scale_parameter, float clip_threshold, float beta1,
                      float weight_decay) override {
    cpu::AdafactorApply(param, m, grad, row, col, row_sum, v, sums, B, R, C, grad_scale, rel_step,
                        eps2, scale_parameter, clip_threshold, beta1, weight_decay, nt_);
  }
  void AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes,
                          float* m_absmax, float* v_absmax, const float* code_m,
                          const float* code_v, int64_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float bias_correction1,
                          float bias_correction2, float grad_scale, const StepScalars* s) override {
    cpu::AdamW8bitBlockwise(param, grad, m_codes, v_codes, m_absmax, v_absmax, code_m, code_v, n,
                            lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2,
                            grad_scale, s, nt_);
  }

 private:
  const int nt_;
};

}  // namespace

bool CpuPacksGemmB(DType type) {
  if (std::strcmp(cpu::GemmLibrary(), "onednn") != 0) return false;
  return type == DType::kF32 || (type == DType::kBF16 && cpu::Bf16GemmNative());
}

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace traind::engine
