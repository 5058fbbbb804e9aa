// ProfilingBackend: a Backend decorator for the benchmarks that times every op (wall clock,
// synchronous CPU ops) and sums the time per op name, GEMMs per shape. Not for production use:
// it adds a clock read around each call. With cpu_time, ops are timed in process CPU seconds
// (all threads), which other processes' load does not inflate as much as wall time. On an
// asynchronous device (CUDA) pass sync_each_op: every op then ends with Synchronize() inside its
// timed region (so times are the op's device time plus one launch; graphs and fused epilogues are
// not used through the decorator).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/backend.h"

namespace traind::bench {

using engine::Backend;
using engine::DType;

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend* inner, bool cpu_time = false, bool sync_each_op = false)
      : in_(inner), cpu_time_(cpu_time), sync_(sync_each_op) {}

  // Prints ops by total time, with calls and the share of `total_s` (seconds).
  // With the GEMM rate the MFU is measured against (`peak_gflops`) and the model FLOPs per step,
  // also prints the ceiling the GEMMs themselves set: the MFU the step would reach if every other
  // op took no time (model FLOPs over the GEMMs' time alone, against the peak).
  void Print(double total_s, int steps, double peak_gflops = 0.0,
             double model_flops_per_step = 0.0) const {
    std::vector<std::pair<std::string, Stat>> v(stats_.begin(), stats_.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.s > b.second.s; });
    double sum = 0.0;
    for (auto& [name, st] : v) sum += st.s;
    std::printf("  %-44s %10s %8s %7s %9s\n", "op", "ms/step", "calls", "share", "GFLOP/s");
    for (auto& [name, st] : v) {
      std::printf("  %-44s %10.3f %8lld %6.1f%% %9.1f\n", name.c_str(), 1e3 * st.s / steps,
                  static_cast<long long>(st.calls / steps), 100.0 * st.s / total_s,
                  st.flops > 0 ? st.flops / st.s / 1e9 : 0.0);
    }
    std::printf("  %-44s %10.3f %8s %6.1f%%\n", "(all ops)", 1e3 * sum / steps, "",
                100.0 * sum / total_s);
    double gemm_s = 0.0, gemm_flops = 0.0;
    for (auto& [name, st] : v) {
      if (name.rfind("gemm ", 0) != 0) continue;
      gemm_s += st.s;
      gemm_flops += st.flops;
    }
    if (peak_gflops > 0.0 && model_flops_per_step > 0.0 && gemm_s > 0.0) {
      const double gemm_rate = gemm_flops / gemm_s / 1e9;
      std::printf(
          "  GEMMs: %.1f%% of the ops' time, at %.1f GFLOP/s = %.1f%% of the 1024^3 GEMM (%.1f); "
          "with every other op free the step's MFU would be %.1f%%\n",
          100.0 * gemm_s / sum, gemm_rate, 100.0 * gemm_rate / peak_gflops, peak_gflops,
          100.0 * model_flops_per_step / (gemm_s / steps) / 1e9 / peak_gflops);
    }
  }
  void Reset() { stats_.clear(); }

  std::string name() const override { return in_->name(); }
  engine::DeviceCapabilities capabilities() const override { return in_->capabilities(); }
  void* Alloc(size_t b) override { return in_->Alloc(b); }
  void Free(void* p) override { in_->Free(p); }
  int64_t PackedGemmBBytes(int64_t K, int64_t N, DType type) const override {
    return in_->PackedGemmBBytes(K, N, type);
  }
  bool PackGemmB(void* storage, int64_t bytes, const void* B, bool tb, int64_t K, int64_t N,
                 int64_t ldb, DType type) override {
    T t(this, "pack_gemm_b");  // packed weights and layer inputs (Backend::PackGemmB)
    return in_->PackGemmB(storage, bytes, B, tb, K, N, ldb, type);
  }
  void ForgetPackedGemmB(const void* begin, const void* end) override {
    in_->ForgetPackedGemmB(begin, end);
  }
  void CopyHostToDevice(void* d, const void* s, size_t b) override {
    T t(this, "copy");
    in_->CopyHostToDevice(d, s, b);
  }
  void CopyDeviceToHost(void* d, const void* s, size_t b) override {
    T t(this, "copy");
    in_->CopyDeviceToHost(d, s, b);
  }
  void CopyDeviceToHost2D(void* d, size_t dp, const void* s, size_t sp, size_t w,
                          size_t h) override {
    T t(this, "copy");
    in_->CopyDeviceToHost2D(d, dp, s, sp, w, h);
  }
  void CopyDeviceToDevice(void* d, const void* s, size_t b) override {
    T t(this, "copy");
    in_->CopyDeviceToDevice(d, s, b);
  }
  static std::string GemmKey(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    char key[96];
    std::snprintf(key, sizeof key, "gemm %c%c %lldx%lldx%lld", ta ? 'T' : 'N', tb ? 'T' : 'N',
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
    return key;
  }
  void Memset0(void* d, size_t b) override {
    T t(this, "memset0");
    in_->Memset0(d, b);
  }
  void Synchronize() override { in_->Synchronize(); }
  void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, DType ab,
            DType c) override {
    T t(this, GemmKey(ta, tb, M, N, K), 2.0 * M * N * K);
    in_->Gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab, c);
  }
  void EmbeddingForward(float* o, const int32_t* i, const float* t, int64_t N, int64_t C,
                        bool acc) override {
    T x(this, "embedding_fwd");
    in_->EmbeddingForward(o, i, t, N, C, acc);
  }
  void EmbeddingBackward(float* d, const float* o, const int32_t* i, int64_t N,
                         int64_t C) override {
    T x(this, "embedding_bwd");
    in_->EmbeddingBackward(d, o, i, N, C);
  }
  // A linear layer: timed whole under its GEMM's name, with "+gelu" or "+bias" when it has them
  // (the CPU and CUDA fuse the bias and the activation into the product's store, one pass or an
  // epilogue).
  void LinearForward(float* pre, float* act, const void* inp, const void* w, const float* bias,
                     int64_t N, int64_t C, int64_t OC, DType type) override {
    const char* epilogue = act != nullptr ? " +gelu" : bias != nullptr ? " +bias" : "";
    T t(this, GemmKey(false, true, N, OC, C) + epilogue, 2.0 * N * OC * C);
    in_->LinearForward(pre, act, inp, w, bias, N, C, OC, type);
  }
  void LinearForwardRoundedAct(float* pre, void* act, DType at, float* scratch, const void* inp,
                               const void* w, const float* bias, int64_t N, int64_t C, int64_t OC,
                               DType type) override {
    T t(this, GemmKey(false, true, N, OC, C) + " +gelu 16-bit", 2.0 * N * OC * C);
    in_->LinearForwardRoundedAct(pre, act, at, scratch, inp, w, bias, N, C, OC, type);
  }
  void BiasBackwardRounded(float* d, const float* o, int64_t N, int64_t OC, void* o16,
                           DType t16) override {
    T x(this, "bias_bwd+cast");
    in_->BiasBackwardRounded(d, o, N, OC, o16, t16);
  }
  void AddBias(float* o, const float* b, int64_t N, int64_t OC) override {
    T x(this, "add_bias");
    in_->AddBias(o, b, N, OC);
  }
  void ScaleRows(float* x, const float* w, int64_t N, int64_t C) override {
    T t(this, "scale_rows");
    in_->ScaleRows(x, w, N, C);
  }
  void RowDot(float* o, const float* a, const float* b, int64_t N, int64_t C) override {
    T t(this, "row_dot");
    in_->RowDot(o, a, b, N, C);
  }
  void BiasBackward(float* d, const float* o, int64_t N, int64_t OC) override {
    T x(this, "bias_bwd");
    in_->BiasBackward(d, o, N, OC);
  }
  void Add(float* o, const float* a, const float* b, int64_t n) override {
    T x(this, "add");
    in_->Add(o, a, b, n);
  }
  void Scale(float* p, float s, int64_t n) override {
    T x(this, "scale");
    in_->Scale(p, s, n);
  }
  double SumSquares(const float* p, int64_t n) override {
    T x(this, "sum_squares");
    return in_->SumSquares(p, n);
  }
  bool HasNonFinite(const float* p, int64_t n) override {
    T x(this, "has_non_finite");
    return in_->HasNonFinite(p, n);
  }
  void Cast(void* d, DType dt, const void* s, DType st, int64_t n) override {
    T x(this, "cast");
    in_->Cast(d, dt, s, st, n);
  }
  void Dequantize4bit(const engine::Quant4View& q, int64_t cols, int64_t r0, int64_t r1,
                      void* out, int64_t ld, DType out_type) override {
    T x(this, "dequantize_4bit");
    in_->Dequantize4bit(q, cols, r0, r1, out, ld, out_type);
  }
  void Dropout(float* o, const void* i, DType it, int64_t n, float p, const uint64_t* key,
               uint64_t stream, bool acc) override {
    T x(this, "dropout");
    in_->Dropout(o, i, it, n, p, key, stream, acc);
  }
  void LayerNormForward(float* o, float* m, float* r, const float* i, const float* w,
                        const float* b, int64_t N, int64_t C, float eps) override {
    T x(this, "layernorm_fwd");
    in_->LayerNormForward(o, m, r, i, w, b, N, C, eps);
  }
  void LayerNormForwardRounded(void* o16, DType ot, float* o32, float* mean, float* rstd,
                               const float* inp, const float* w, const float* b, int64_t N,
                               int64_t C, float eps) override {
    T x(this, "layernorm_fwd 16-bit out");
    in_->LayerNormForwardRounded(o16, ot, o32, mean, rstd, inp, w, b, N, C, eps);
  }
  void ResidualNormForward(float* res, void* out, DType ot, float* scratch, float* mean,
                           float* rstd, const float* a, const float* b, const float* w,
                           const float* bias, int64_t N, int64_t C, float eps, bool rms) override {
    std::string name = rms ? "add+rmsnorm_fwd" : "add+layernorm_fwd";
    if (ot != DType::kF32) name += " 16-bit out";
    T x(this, name);
    in_->ResidualNormForward(res, out, ot, scratch, mean, rstd, a, b, w, bias, N, C, eps, rms);
  }
  void RmsNormForwardRounded(void* o16, DType ot, float* o32, float* rstd, const float* inp,
                             const float* w, int64_t N, int64_t C, float eps) override {
    T x(this, "rmsnorm_fwd 16-bit out");
    in_->RmsNormForwardRounded(o16, ot, o32, rstd, inp, w, N, C, eps);
  }
  void LayerNormBackward(float* di, float* dw, float* db, const float* d, const float* i,
                         const float* w, const float* m, const float* r, int64_t N,
                         int64_t C) override {
    T x(this, "layernorm_bwd");
    in_->LayerNormBackward(di, dw, db, d, i, w, m, r, N, C);
  }
  void RmsNormForward(float* o, float* r, const float* i, const float* w, int64_t N, int64_t C,
                      float eps) override {
    T x(this, "rmsnorm_fwd");
    in_->RmsNormForward(o, r, i, w, N, C, eps);
  }
  void RmsNormBackward(float* di, float* dw, const float* d, const float* i, const float* w,
                       const float* r, int64_t N, int64_t C) override {
    T x(this, "rmsnorm_bwd");
    in_->RmsNormBackward(di, dw, d, i, w, r, N, C);
  }
  void HeadRmsNormForward(float* x, float* s, float* r, const float* w, int64_t N, int64_t nh,
                          int64_t HS, int64_t rs, float eps) override {
    T t(this, "head_rmsnorm_fwd");
    in_->HeadRmsNormForward(x, s, r, w, N, nh, HS, rs, eps);
  }
  void HeadRmsNormBackward(float* dx, float* dw, const float* s, const float* w, const float* r,
                           int64_t N, int64_t nh, int64_t HS, int64_t rs) override {
    T t(this, "head_rmsnorm_bwd");
    in_->HeadRmsNormBackward(dx, dw, s, w, r, N, nh, HS, rs);
  }
  void GeluForward(float* o, const float* i, int64_t n) override {
    T x(this, "gelu_fwd");
    in_->GeluForward(o, i, n);
  }
  void GeluBackward(float* di, const float* i, const float* d, int64_t n) override {
    T x(this, "gelu_bwd");
    in_->GeluBackward(di, i, d, n);
  }
  void GeluBackwardBias(float* di, const float* i, const float* d, float* db, int64_t N,
                        int64_t OC, void* d16, DType t16) override {
    T x(this, d16 != nullptr ? "gelu_bwd+bias_bwd+cast" : "gelu_bwd+bias_bwd");
    in_->GeluBackwardBias(di, i, d, db, N, OC, d16, t16);
  }
  void GeluErfForward(float* o, const float* i, int64_t n) override {
    T x(this, "gelu_erf_fwd");
    in_->GeluErfForward(o, i, n);
  }
  void GeluErfBackward(float* di, const float* i, const float* d, int64_t n) override {
    T x(this, "gelu_erf_bwd");
    in_->GeluErfBackward(di, i, d, n);
  }
  void TanhForward(float* o, const float* i, int64_t n) override {
    T x(this, "tanh_fwd");
    in_->TanhForward(o, i, n);
  }
  void TanhBackward(float* di, const float* o, const float* d, int64_t n) override {
    T x(this, "tanh_bwd");
    in_->TanhBackward(di, o, d, n);
  }
  void SwiGluForward(float* o, const float* i, int64_t N, int64_t H) override {
    T x(this, "swiglu_fwd");
    in_->SwiGluForward(o, i, N, H);
  }
  void SwiGluBackward(float* di, const float* i, const float* d, int64_t N, int64_t H) override {
    T x(this, "swiglu_bwd");
    in_->SwiGluBackward(di, i, d, N, H);
  }
  void GeGluForward(float* o, const float* i, int64_t N, int64_t H) override {
    T x(this, "geglu_fwd");
    in_->GeGluForward(o, i, N, H);
  }
  void GeGluBackward(float* di, const float* i, const float* d, int64_t N, int64_t H) override {
    T x(this, "geglu_bwd");
    in_->GeGluBackward(di, i, d, N, H);
  }
  void SwiGluForwardRounded(void* o, DType ot, float* s, const float* i, int64_t N,
                            int64_t H) override {
    T x(this, "swiglu_fwd 16-bit out");
    in_->SwiGluForwardRounded(o, ot, s, i, N, H);
  }
  void SwiGluBackwardRounded(float* di, void* d16, DType t16, const float* i, const float* d,
                             int64_t N, int64_t H) override {
    T x(this, "swiglu_bwd+cast");
    in_->SwiGluBackwardRounded(di, d16, t16, i, d, N, H);
  }
  void Rope(float* p, int64_t B, int64_t T_, int64_t nh, int64_t HS, int64_t rs, float theta,
            bool inv, int64_t pos_offset = 0,
            const engine::RopeScaling& sc = engine::RopeScaling{},
            const int32_t* positions = nullptr) override {
    T x(this, "rope");
    in_->Rope(p, B, T_, nh, HS, rs, theta, inv, pos_offset, sc, positions);
  }
  void AttentionForward(float* o, float* l, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T_, int64_t NH, int64_t NKV, int64_t HS, int64_t qs,
                        int64_t ks, bool causal = true, const int32_t* mask = nullptr,
                        DType ot = DType::kF32, int64_t w = 0,
                        const int32_t* doc_start = nullptr) override {
    // causal: QK^T and PV halves (4 B NH T^2 HS without the mask)
    T x(this, ot == DType::kF32 ? "attention_fwd" : "attention_fwd 16-bit operands",
        (causal ? 2.0 : 4.0) * B * NH * T_ * T_ * HS);
    in_->AttentionForward(o, l, q, k, v, B, T_, NH, NKV, HS, qs, ks, causal, mask, ot, w,
                          doc_start);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* d, const float* o,
                         const float* l, const float* q, const float* k, const float* v, int64_t B,
                         int64_t T_, int64_t NH, int64_t NKV, int64_t HS, int64_t qs,
                         int64_t ks, bool causal = true, const int32_t* mask = nullptr,
                         DType ot = DType::kF32, int64_t w = 0,
                         const int32_t* doc_start = nullptr) override {
    // recompute S + 4 products (halved when causal)
    T x(this, ot == DType::kF32 ? "attention_bwd" : "attention_bwd 16-bit operands",
        (causal ? 5.0 : 10.0) * B * NH * T_ * T_ * HS);
    in_->AttentionBackward(dq, dk, dv, d, o, l, q, k, v, B, T_, NH, NKV, HS, qs, ks, causal, mask,
                           ot, w, doc_start);
  }
  void AttentionForward16(void* o, float* l, const void* q, const void* k, const void* v, DType ty,
                          int64_t B, int64_t T_, int64_t NH, int64_t NKV, int64_t HS, int64_t qs,
                          int64_t ks, bool causal = true, const int32_t* mask = nullptr,
                          int64_t w = 0, const int32_t* doc_start = nullptr) override {
    T x(this, "attention_fwd 16-bit tensors", (causal ? 2.0 : 4.0) * B * NH * T_ * T_ * HS);
    in_->AttentionForward16(o, l, q, k, v, ty, B, T_, NH, NKV, HS, qs, ks, causal, mask, w,
                            doc_start);
  }
  void AttentionBackward16(float* dq, float* dk, float* dv, const void* d, const void* o,
                           const float* l, const void* q, const void* k, const void* v, DType ty,
                           int64_t B, int64_t T_, int64_t NH, int64_t NKV, int64_t HS, int64_t qs,
                           int64_t ks, bool causal = true, const int32_t* mask = nullptr,
                           int64_t w = 0, const int32_t* doc_start = nullptr) override {
    T x(this, "attention_bwd 16-bit tensors", (causal ? 5.0 : 10.0) * B * NH * T_ * T_ * HS);
    in_->AttentionBackward16(dq, dk, dv, d, o, l, q, k, v, ty, B, T_, NH, NKV, HS, qs, ks, causal,
                             mask, w, doc_start);
  }
  void AttentionDecode(float* o, const float* q, const float* k, const float* v, int64_t B, int64_t T_,
                       int64_t rows, int64_t NH, int64_t NKV, int64_t HS, int64_t qs, int64_t ks,
                       int64_t w = 0) override {
    // QK^T and PV of B*T_ new rows against `rows` cached keys
    T x(this, "attention_decode", 4.0 * B * NH * T_ * rows * HS);
    in_->AttentionDecode(o, q, k, v, B, T_, rows, NH, NKV, HS, qs, ks, w);
  }
  void SoftmaxCrossEntropy(float* lg, float* ls, const int32_t* t, int64_t N, int64_t V, int64_t Vp,
                           float gs, bool g, const float* ds, void* g16 = nullptr,
                           DType g16t = DType::kBF16) override {
    T x(this, g16 != nullptr && g ? "softmax_xent 16-bit gradient" : "softmax_xent");
    in_->SoftmaxCrossEntropy(lg, ls, t, N, V, Vp, gs, g, ds, g16, g16t);
  }
  void AdamW(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
             float eps, float wd, float bc1, float bc2, float gs) override {
    T x(this, "adamw");
    in_->AdamW(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gs);
  }
  void AdamWFromScalars(float* p, const float* g, float* m, float* v, int64_t n,
                        const engine::StepScalars* s, float b1, float b2, float eps,
                        float wd) override {
    T x(this, "adamw");
    in_->AdamWFromScalars(p, g, m, v, n, s, b1, b2, eps, wd);
  }
  void AdamWRunsFromScalars(float* p, const float* g, float* m, float* v,
                            const engine::AdamWRun* runs, int64_t n_runs,
                            const engine::StepScalars* s, float b1, float b2,
                            float eps) override {
    T x(this, "adamw");
    in_->AdamWRunsFromScalars(p, g, m, v, runs, n_runs, s, b1, b2, eps);
  }
  void SgdUpdate(float* p, const float* g, float* buf, int64_t n, float lr, float mom, float damp,
                 float wd, bool nesterov, bool first, float gs, const engine::StepScalars* s) override {
    T x(this, "sgd");
    in_->SgdUpdate(p, g, buf, n, lr, mom, damp, wd, nesterov, first, gs, s);
  }
  void AdafactorFactoredStats(const float* g, float* row, float* col, double* row_sum, int64_t B,
                              int64_t R, int64_t C, float beta2t, float eps1, float gs) override {
    T x(this, "adafactor_stats");
    in_->AdafactorFactoredStats(g, row, col, row_sum, B, R, C, beta2t, eps1, gs);
  }
  void AdafactorSecondMoment(const float* g, float* v, int64_t n, float beta2t, float eps1,
                             float gs) override {
    T x(this, "adafactor_second_moment");
    in_->AdafactorSecondMoment(g, v, n, beta2t, eps1, gs);
  }
  void AdafactorUpdateSumSquares(double* acc, const float* g, const float* row, const float* col,
                                 const double* row_sum, const float* v, int64_t B, int64_t R,
                                 int64_t C, float gs) override {
    T x(this, "adafactor_update_sumsq");
    in_->AdafactorUpdateSumSquares(acc, g, row, col, row_sum, v, B, R, C, gs);
  }
  void AdafactorApply(float* p, float* m, const float* g, const float* row, const float* col,
                      const double* row_sum, const float* v, const double* sums, int64_t B,
                      int64_t R, int64_t C, float gs, float rel_step, float eps2, bool scale_param,
                      float clip, float beta1, float wd) override {
    T x(this, "adafactor_apply");
    in_->AdafactorApply(p, m, g, row, col, row_sum, v, sums, B, R, C, gs, rel_step, eps2,
                        scale_param, clip, beta1, wd);
  }
  void AdamW8bitBlockwise(float* p, const float* g, uint8_t* mc, uint8_t* vc, float* ma, float* va,
                          const float* code_m, const float* code_v, int64_t n, float lr, float b1,
                          float b2, float eps, float wd, float bc1, float bc2, float gs,
                          const engine::StepScalars* s) override {
    T x(this, "adamw_8bit");
    in_->AdamW8bitBlockwise(p, g, mc, vc, ma, va, code_m, code_v, n, lr, b1, b2, eps, wd, bc1, bc2,
                            gs, s);
  }
  void AccumulateSumSquares(double* acc, const float* p, int64_t n) override {
    T x(this, "sum_squares");
    in_->AccumulateSumSquares(acc, p, n);
  }
  void AccumulateSum(double* acc, const float* p, int64_t n, const float* w) override {
    T x(this, "loss_sum");
    in_->AccumulateSum(acc, p, n, w);
  }

 private:
  struct Stat {
    double s = 0.0;
    double flops = 0.0;
    int64_t calls = 0;
  };
  // Times one call into stats_[name].
  struct T {
    T(ProfilingBackend* p, const std::string& n, double f = 0.0)
        : pb(p), name(n), flops(f), t0(pb->Now()) {}
    ~T() {
      if (pb->sync_) pb->in_->Synchronize();
      Stat& s = pb->stats_[name];
      s.s += pb->Now() - t0;
      s.flops += flops;
      ++s.calls;
    }
    ProfilingBackend* pb;
    std::string name;
    double flops;
    double t0;
  };
  double Now() const {
    if (!cpu_time_) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  Backend* in_;
  bool cpu_time_;
  bool sync_;
  std::map<std::string, Stat> stats_;
};

}  // namespace traind::bench

// Every op of backend.h's TRAIND_BACKEND_OPS is forwarded and timed above: a new op without its
// override here would compile (the decorator would inherit Backend's default body) and the profiled
// step would skip it and record UNIMPLEMENTED, so its absence fails the build instead. `&X::Op`
// names the class that declares Op: ProfilingBackend's own override, or Backend's when it is missing.
namespace traind::bench::profiling_internal {
template <typename M>
struct DeclaringClass;
template <typename C, typename M>
struct DeclaringClass<M C::*> {
  using type = C;
};
#define TRAIND_PROFILING_FORWARDS(name)                                                              \
  static_assert(std::is_same_v<DeclaringClass<decltype(&ProfilingBackend::name)>::type, ProfilingBackend>, \
                "bench/profiling_backend.h: ProfilingBackend has no override of " #name             \
                " (a row of TRAIND_BACKEND_OPS): add one that times it, like the others");
TRAIND_BACKEND_OPS(TRAIND_PROFILING_FORWARDS)
#undef TRAIND_PROFILING_FORWARDS
}  // namespace traind::bench::profiling_internal
