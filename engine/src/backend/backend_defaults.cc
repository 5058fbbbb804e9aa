// The Backend methods with a default implementation: the op names, Supports (nothing but the
// composed ops), an unsupported op's body (records UNIMPLEMENTED), LinearForward as separate ops,
// and MakeBatchUpload as two plain host slots copied with CopyHostToDevice, which is synchronous on
// the backends that use it (the CPU backend), so Consumed() has nothing to order.
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace traind::engine {
namespace {

class HostBatchUpload final : public BatchUpload {
 public:
  HostBatchUpload(Backend* backend, size_t slot_bytes) : backend_(backend) {
    for (auto& s : slots_) s.resize(slot_bytes == 0 ? 1 : slot_bytes);
  }
  Result<void*> HostSlot(int slot) override {
    TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
    return static_cast<void*>(slots_[slot].data());
  }
  Status Upload(int slot, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
    if (bytes > slots_[slot].size()) {
      return Status::InvalidArgument("BatchUpload::Upload of " + std::to_string(bytes) +
                                     " bytes, slots hold " + std::to_string(slots_[slot].size()));
    }
    backend_->CopyHostToDevice(dst, slots_[slot].data(), bytes);
    return Status::Ok();
  }
  Status Consumed(int slot) override { return CheckSlot(slot); }

 private:
  static Status CheckSlot(int slot) {
    if (slot == 0 || slot == 1) return Status::Ok();
    return Status::InvalidArgument("BatchUpload: slot " + std::to_string(slot) + " is not 0 or 1");
  }
  Backend* backend_;
  std::vector<unsigned char> slots_[2];
};

class SyncHostStaging final : public HostStaging {
 public:
  SyncHostStaging(Backend* backend, int slots, size_t slot_bytes)
      : backend_(backend), slot_bytes_(slot_bytes), slots_(static_cast<size_t>(slots)) {
    for (auto& s : slots_) s.resize(slot_bytes == 0 ? 1 : slot_bytes);
  }
  int slots() const override { return static_cast<int>(slots_.size()); }
  size_t slot_bytes() const override { return slot_bytes_; }
  Result<void*> Host(int slot) override {
    TRAIND_RETURN_IF_ERROR(CheckRange("Host", slot, 0, 0));
    return static_cast<void*>(slots_[static_cast<size_t>(slot)].data());
  }
  Status Download(int slot, size_t offset, const void* src, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(CheckRange("Download", slot, offset, bytes));
    backend_->CopyDeviceToHost(slots_[static_cast<size_t>(slot)].data() + offset, src, bytes);
    return backend_->status();
  }
  Status Upload(int slot, size_t offset, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(CheckRange("Upload", slot, offset, bytes));
    backend_->CopyHostToDevice(dst, slots_[static_cast<size_t>(slot)].data() + offset, bytes);
    return backend_->status();
  }

 private:
  Backend* backend_;
  size_t slot_bytes_;
  std::vector<std::vector<unsigned char>> slots_;
};

}  // namespace

const char* OpName(Op op) {
  switch (op) {
#define TRAIND_OP_NAME(name) \
  case Op::k##name:          \
    return #name;
    TRAIND_BACKEND_OPS(TRAIND_OP_NAME)
#undef TRAIND_OP_NAME
    case Op::kCount:
      break;
  }
  return "unknown op";
}

void Backend::CopyDeviceToHost2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                 size_t width, size_t height) {
  if (width == 0) return;
  for (size_t r = 0; r < height; ++r) {
    CopyDeviceToHost(static_cast<char*>(dst) + r * dst_pitch,
                     static_cast<const char*>(src) + r * src_pitch, width);
  }
}

bool Backend::Supports(Op op) const {
  switch (op) {
    case Op::kLinearForward:
      return Supports(Op::kGemm) && Supports(Op::kAddBias) && Supports(Op::kGeluForward);
    case Op::kLinearForwardRoundedAct:
      return Supports(Op::kLinearForward) && Supports(Op::kCast);
    case Op::kBiasBackwardRounded:
      return Supports(Op::kBiasBackward) && Supports(Op::kCast);
    case Op::kResidualNormForward:
      return Supports(Op::kAdd) &&
             (Supports(Op::kLayerNormForwardRounded) || Supports(Op::kRmsNormForwardRounded));
    case Op::kGeluBackwardBias:
      return Supports(Op::kGeluBackward) && Supports(Op::kBiasBackwardRounded);
    case Op::kSwiGluForwardRounded:
      return Supports(Op::kSwiGluForward) && Supports(Op::kCast);
    case Op::kSwiGluBackwardRounded:
      return Supports(Op::kSwiGluBackward) && Supports(Op::kCast);
    case Op::kAdamWRunsFromScalars:
      return Supports(Op::kAdamWFromScalars);
    case Op::kLayerNormForwardRounded:
      return Supports(Op::kLayerNormForward) && Supports(Op::kCast);
    case Op::kRmsNormForwardRounded:
      return Supports(Op::kRmsNormForward) && Supports(Op::kCast);
    case Op::kHasNonFinite:
      return Supports(Op::kSumSquares);
    default:
      return false;
  }
}

void Backend::Unsupported(Op op) {
  if (unsupported_.ok()) {
    unsupported_ = Status::Unimplemented("backend " + name() + " does not implement op " +
                                         OpName(op));
  }
}

Status CheckSupports(const Backend& backend, const std::vector<Op>& ops) {
  for (Op op : ops) {
    if (!backend.Supports(op)) {
      return Status::FailedPrecondition("backend " + backend.name() + " does not implement op " +
                                        OpName(op) + ", which this job needs");
    }
  }
  return Status::Ok();
}

// ---- an unsupported op does nothing but record it ----
void Backend::Gemm(bool /*trans_a*/, bool /*trans_b*/, int64_t /*M*/, int64_t /*N*/, int64_t /*K*/, float /*alpha*/, const void* /*A*/, int64_t /*lda*/, const void* /*B*/, int64_t /*ldb*/, float /*beta*/, void* /*C*/, int64_t /*ldc*/, DType /*ab_type*/, DType /*c_type*/) {
  Unsupported(Op::kGemm);
}

void Backend::EmbeddingForward(float* /*out*/, const int32_t* /*ids*/, const float* /*table*/, int64_t /*N*/, int64_t /*C*/, bool /*accumulate*/) {
  Unsupported(Op::kEmbeddingForward);
}

void Backend::EmbeddingBackward(float* /*dtable*/, const float* /*dout*/, const int32_t* /*ids*/, int64_t /*N*/, int64_t /*C*/) {
  Unsupported(Op::kEmbeddingBackward);
}

void Backend::AddBias(float* /*out*/, const float* /*bias*/, int64_t /*N*/, int64_t /*OC*/) {
  Unsupported(Op::kAddBias);
}

void Backend::BiasBackward(float* /*dbias*/, const float* /*dout*/, int64_t /*N*/, int64_t /*OC*/) {
  Unsupported(Op::kBiasBackward);
}

void Backend::ScaleRows(float* /*x*/, const float* /*w*/, int64_t /*N*/, int64_t /*C*/) {
  Unsupported(Op::kScaleRows);
}

void Backend::RowDot(float* /*out*/, const float* /*a*/, const float* /*b*/, int64_t /*N*/,
                     int64_t /*C*/) {
  Unsupported(Op::kRowDot);
}

void Backend::Add(float* /*out*/, const float* /*a*/, const float* /*b*/, int64_t /*n*/) {
  Unsupported(Op::kAdd);
}

void Backend::Scale(float* /*x*/, float /*s*/, int64_t /*n*/) {
  Unsupported(Op::kScale);
}

double Backend::SumSquares(const float* /*x*/, int64_t /*n*/) {
  Unsupported(Op::kSumSquares);
  return std::numeric_limits<double>::quiet_NaN();
}

void Backend::AccumulateSumSquares(double* /*acc*/, const float* /*x*/, int64_t /*n*/) {
  Unsupported(Op::kAccumulateSumSquares);
}

void Backend::AccumulateSum(double* /*acc*/, const float* /*x*/, int64_t /*n*/, const float* /*weight*/) {
  Unsupported(Op::kAccumulateSum);
}

void Backend::Cast(void* /*dst*/, DType /*dst_type*/, const void* /*src*/, DType /*src_type*/, int64_t /*n*/) {
  Unsupported(Op::kCast);
}

void Backend::Dequantize4bit(const Quant4View& /*q*/, int64_t /*cols*/, int64_t /*r0*/, int64_t /*r1*/,
                             void* /*out*/, int64_t /*ld*/, DType /*out_type*/) {
  Unsupported(Op::kDequantize4bit);
}

void Backend::Dropout(float* /*out*/, const void* /*inp*/, DType /*inp_type*/, int64_t /*n*/, float /*p*/, const uint64_t* /*key*/, uint64_t /*stream*/, bool /*accumulate*/) {
  Unsupported(Op::kDropout);
}

void Backend::LayerNormForward(float* /*out*/, float* /*mean*/, float* /*rstd*/, const float* /*inp*/, const float* /*weight*/, const float* /*bias*/, int64_t /*N*/, int64_t /*C*/, float /*eps*/) {
  Unsupported(Op::kLayerNormForward);
}

void Backend::LayerNormBackward(float* /*dinp*/, float* /*dweight*/, float* /*dbias*/, const float* /*dout*/, const float* /*inp*/, const float* /*weight*/, const float* /*mean*/, const float* /*rstd*/, int64_t /*N*/, int64_t /*C*/) {
  Unsupported(Op::kLayerNormBackward);
}

void Backend::RmsNormForward(float* /*out*/, float* /*rstd*/, const float* /*inp*/, const float* /*weight*/, int64_t /*N*/, int64_t /*C*/, float /*eps*/) {
  Unsupported(Op::kRmsNormForward);
}

void Backend::RmsNormBackward(float* /*dinp*/, float* /*dweight*/, const float* /*dout*/, const float* /*inp*/, const float* /*weight*/, const float* /*rstd*/, int64_t /*N*/, int64_t /*C*/) {
  Unsupported(Op::kRmsNormBackward);
}

void Backend::HeadRmsNormForward(float* /*x*/, float* /*saved*/, float* /*rstd*/, const float* /*weight*/, int64_t /*N*/, int64_t /*n_heads*/, int64_t /*HS*/, int64_t /*row_stride*/, float /*eps*/) {
  Unsupported(Op::kHeadRmsNormForward);
}

void Backend::HeadRmsNormBackward(float* /*dx*/, float* /*dweight*/, const float* /*saved*/, const float* /*weight*/, const float* /*rstd*/, int64_t /*N*/, int64_t /*n_heads*/, int64_t /*HS*/, int64_t /*row_stride*/) {
  Unsupported(Op::kHeadRmsNormBackward);
}

void Backend::GeluForward(float* /*out*/, const float* /*inp*/, int64_t /*n*/) {
  Unsupported(Op::kGeluForward);
}

void Backend::GeluBackward(float* /*dinp*/, const float* /*inp*/, const float* /*dout*/, int64_t /*n*/) {
  Unsupported(Op::kGeluBackward);
}

void Backend::GeluErfForward(float* /*out*/, const float* /*inp*/, int64_t /*n*/) {
  Unsupported(Op::kGeluErfForward);
}

void Backend::GeluErfBackward(float* /*dinp*/, const float* /*inp*/, const float* /*dout*/, int64_t /*n*/) {
  Unsupported(Op::kGeluErfBackward);
}

void Backend::TanhForward(float* /*out*/, const float* /*inp*/, int64_t /*n*/) {
  Unsupported(Op::kTanhForward);
}

void Backend::TanhBackward(float* /*dinp*/, const float* /*out*/, const float* /*dout*/, int64_t /*n*/) {
  Unsupported(Op::kTanhBackward);
}

void Backend::SwiGluForward(float* /*out*/, const float* /*inp*/, int64_t /*N*/, int64_t /*H*/) {
  Unsupported(Op::kSwiGluForward);
}

void Backend::SwiGluBackward(float* /*dinp*/, const float* /*inp*/, const float* /*dout*/, int64_t /*N*/, int64_t /*H*/) {
  Unsupported(Op::kSwiGluBackward);
}

void Backend::GeGluForward(float* /*out*/, const float* /*inp*/, int64_t /*N*/, int64_t /*H*/) {
  Unsupported(Op::kGeGluForward);
}

void Backend::GeGluBackward(float* /*dinp*/, const float* /*inp*/, const float* /*dout*/, int64_t /*N*/, int64_t /*H*/) {
  Unsupported(Op::kGeGluBackward);
}

void Backend::Rope(float* /*x*/, int64_t /*B*/, int64_t /*T*/, int64_t /*n_heads*/, int64_t /*HS*/, int64_t /*row_stride*/, float /*theta*/, bool /*inverse*/, int64_t /*pos_offset*/, const RopeScaling& /*scaling*/, const int32_t* /*positions*/) {
  Unsupported(Op::kRope);
}

void Backend::AttentionForward(float* /*out*/, float* /*lse*/, const float* /*q*/, const float* /*k*/, const float* /*v*/, int64_t /*B*/, int64_t /*T*/, int64_t /*NH*/, int64_t /*NKV*/, int64_t /*HS*/, int64_t /*q_stride*/, int64_t /*kv_stride*/, bool /*causal*/, const int32_t* /*key_mask*/, DType /*operand_type*/, int64_t /*window*/, const int32_t* /*doc_start*/) {
  Unsupported(Op::kAttentionForward);
}

void Backend::AttentionBackward(float* /*dq*/, float* /*dk*/, float* /*dv*/, const float* /*dout*/, const float* /*out*/, const float* /*lse*/, const float* /*q*/, const float* /*k*/, const float* /*v*/, int64_t /*B*/, int64_t /*T*/, int64_t /*NH*/, int64_t /*NKV*/, int64_t /*HS*/, int64_t /*q_stride*/, int64_t /*kv_stride*/, bool /*causal*/, const int32_t* /*key_mask*/, DType /*operand_type*/, int64_t /*window*/, const int32_t* /*doc_start*/) {
  Unsupported(Op::kAttentionBackward);
}

void Backend::AttentionForward16(void* /*out*/, float* /*lse*/, const void* /*q*/, const void* /*k*/, const void* /*v*/, DType /*type*/, int64_t /*B*/, int64_t /*T*/, int64_t /*NH*/, int64_t /*NKV*/, int64_t /*HS*/, int64_t /*q_stride*/, int64_t /*kv_stride*/, bool /*causal*/, const int32_t* /*key_mask*/, int64_t /*window*/, const int32_t* /*doc_start*/) {
  Unsupported(Op::kAttentionForward16);
}

void Backend::AttentionBackward16(float* /*dq*/, float* /*dk*/, float* /*dv*/, const void* /*dout*/, const void* /*out*/, const float* /*lse*/, const void* /*q*/, const void* /*k*/, const void* /*v*/, DType /*type*/, int64_t /*B*/, int64_t /*T*/, int64_t /*NH*/, int64_t /*NKV*/, int64_t /*HS*/, int64_t /*q_stride*/, int64_t /*kv_stride*/, bool /*causal*/, const int32_t* /*key_mask*/, int64_t /*window*/, const int32_t* /*doc_start*/) {
  Unsupported(Op::kAttentionBackward16);
}

void Backend::AttentionDecode(float* /*out*/, const float* /*q*/, const float* /*k*/, const float* /*v*/, int64_t /*B*/, int64_t /*T*/, int64_t /*cache_rows*/, int64_t /*NH*/, int64_t /*NKV*/, int64_t /*HS*/, int64_t /*q_stride*/, int64_t /*kv_stride*/, int64_t /*window*/) {
  Unsupported(Op::kAttentionDecode);
}

void Backend::SoftmaxCrossEntropy(float* /*logits*/, float* /*losses*/, const int32_t* /*targets*/, int64_t /*N*/, int64_t /*V*/, int64_t /*Vp*/, float /*grad_scale*/, bool /*compute_grad*/, const float* /*device_scale*/, void* /*grad16*/, DType /*grad16_type*/) {
  Unsupported(Op::kSoftmaxCrossEntropy);
}

void Backend::AdamW(float* /*param*/, const float* /*grad*/, float* /*m*/, float* /*v*/, int64_t /*n*/, float /*lr*/, float /*beta1*/, float /*beta2*/, float /*eps*/, float /*weight_decay*/, float /*bias_correction1*/, float /*bias_correction2*/, float /*grad_scale*/) {
  Unsupported(Op::kAdamW);
}

void Backend::AdamWFromScalars(float* /*param*/, const float* /*grad*/, float* /*m*/, float* /*v*/, int64_t /*n*/, const StepScalars* /*s*/, float /*beta1*/, float /*beta2*/, float /*eps*/, float /*weight_decay*/) {
  Unsupported(Op::kAdamWFromScalars);
}

void Backend::SgdUpdate(float* /*param*/, const float* /*grad*/, float* /*buf*/, int64_t /*n*/,
                        float /*lr*/, float /*momentum*/, float /*dampening*/,
                        float /*weight_decay*/, bool /*nesterov*/, bool /*first_step*/,
                        float /*grad_scale*/, const StepScalars* /*s*/) {
  Unsupported(Op::kSgdUpdate);
}

void Backend::AdafactorFactoredStats(const float* /*grad*/, float* /*row*/, float* /*col*/,
                                     double* /*row_sum*/, int64_t /*B*/, int64_t /*R*/,
                                     int64_t /*C*/, float /*beta2t*/, float /*eps1*/,
                                     float /*grad_scale*/) {
  Unsupported(Op::kAdafactorFactoredStats);
}

void Backend::AdafactorSecondMoment(const float* /*grad*/, float* /*v*/, int64_t /*n*/,
                                    float /*beta2t*/, float /*eps1*/, float /*grad_scale*/) {
  Unsupported(Op::kAdafactorSecondMoment);
}

void Backend::AdafactorUpdateSumSquares(double* /*acc*/, const float* /*grad*/,
                                        const float* /*row*/, const float* /*col*/,
                                        const double* /*row_sum*/, const float* /*v*/,
                                        int64_t /*B*/, int64_t /*R*/, int64_t /*C*/,
                                        float /*grad_scale*/) {
  Unsupported(Op::kAdafactorUpdateSumSquares);
}

void Backend::AdafactorApply(float* /*param*/, float* /*m*/, const float* /*grad*/,
                             const float* /*row*/, const float* /*col*/, const double* /*row_sum*/,
                             const float* /*v*/, const double* /*sums*/, int64_t /*B*/,
                             int64_t /*R*/, int64_t /*C*/, float /*grad_scale*/, float /*rel_step*/,
                             float /*eps2*/, bool /*scale_parameter*/, float /*clip_threshold*/,
                             float /*beta1*/, float /*weight_decay*/) {
  Unsupported(Op::kAdafactorApply);
}

void Backend::AdamW8bitBlockwise(float* /*param*/, const float* /*grad*/, uint8_t* /*m_codes*/,
                                 uint8_t* /*v_codes*/, float* /*m_absmax*/, float* /*v_absmax*/,
                                 const float* /*code_m*/, const float* /*code_v*/, int64_t /*n*/,
                                 float /*lr*/, float /*beta1*/, float /*beta2*/, float /*eps*/,
                                 float /*weight_decay*/, float /*bias_correction1*/,
                                 float /*bias_correction2*/, float /*grad_scale*/,
                                 const StepScalars* /*s*/) {
  Unsupported(Op::kAdamW8bitBlockwise);
}

void Backend::LinearForward(float* pre, float* act, const void* inp, const void* weight,
                            const float* bias, int64_t N, int64_t C, int64_t OC, DType type) {
  Gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, pre, OC, type, DType::kF32);
  if (bias != nullptr) AddBias(pre, bias, N, OC);
  if (act != nullptr) GeluForward(act, pre, N * OC);
}

void Backend::LinearForwardRoundedAct(float* pre, void* act, DType act_type, float* scratch,
                                      const void* inp, const void* weight, const float* bias,
                                      int64_t N, int64_t C, int64_t OC, DType type) {
  LinearForward(pre, scratch, inp, weight, bias, N, C, OC, type);
  Cast(act, act_type, scratch, DType::kF32, N * OC);
}

void Backend::BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC,
                                  void* dout16, DType type) {
  BiasBackward(dbias, dout, N, OC);
  Cast(dout16, type, dout, DType::kF32, N * OC);
}

void Backend::ResidualNormForward(float* res, void* out, DType out_type, float* scratch,
                                  float* mean, float* rstd, const float* a, const float* b,
                                  const float* weight, const float* bias, int64_t N, int64_t C,
                                  float eps, bool rms) {
  Add(res, a, b, N * C);
  const bool f32 = out_type == DType::kF32;
  if (rms && f32) {
    RmsNormForward(static_cast<float*>(out), rstd, res, weight, N, C, eps);
  } else if (rms) {
    RmsNormForwardRounded(out, out_type, scratch, rstd, res, weight, N, C, eps);
  } else if (f32) {
    LayerNormForward(static_cast<float*>(out), mean, rstd, res, weight, bias, N, C, eps);
  } else {
    LayerNormForwardRounded(out, out_type, scratch, mean, rstd, res, weight, bias, N, C, eps);
  }
}

void Backend::GeluBackwardBias(float* dinp, const float* inp, const float* dout, float* dbias,
                               int64_t N, int64_t OC, void* dinp16, DType type) {
  GeluBackward(dinp, inp, dout, N * OC);
  if (dinp16 == nullptr) {
    if (dbias != nullptr) BiasBackward(dbias, dinp, N, OC);
  } else if (dbias != nullptr) {
    BiasBackwardRounded(dbias, dinp, N, OC, dinp16, type);
  } else {
    Cast(dinp16, type, dinp, DType::kF32, N * OC);
  }
}

void Backend::SwiGluForwardRounded(void* out, DType out_type, float* scratch, const float* inp,
                                   int64_t N, int64_t H) {
  SwiGluForward(scratch, inp, N, H);
  Cast(out, out_type, scratch, DType::kF32, N * H);
}

void Backend::SwiGluBackwardRounded(float* dinp, void* dinp16, DType type, const float* inp,
                                    const float* dout, int64_t N, int64_t H) {
  SwiGluBackward(dinp, inp, dout, N, H);
  Cast(dinp16, type, dinp, DType::kF32, N * 2 * H);
}

void Backend::AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                                   const AdamWRun* runs, int64_t n_runs, const StepScalars* s,
                                   float beta1, float beta2, float eps) {
  for (int64_t i = 0; i < n_runs; ++i) {
    const AdamWRun& r = runs[i];
    AdamWFromScalars(param + r.offset, grad + r.offset, m + r.offset, v + r.offset, r.numel, s,
                     beta1, beta2, eps, r.weight_decay);
  }
}

void Backend::LayerNormForwardRounded(void* out16, DType out_type, float* out32, float* mean,
                                      float* rstd, const float* inp, const float* weight,
                                      const float* bias, int64_t N, int64_t C, float eps) {
  LayerNormForward(out32, mean, rstd, inp, weight, bias, N, C, eps);
  Cast(out16, out_type, out32, DType::kF32, N * C);
}

void Backend::RmsNormForwardRounded(void* out16, DType out_type, float* out32, float* rstd,
                                    const float* inp, const float* weight, int64_t N, int64_t C,
                                    float eps) {
  RmsNormForward(out32, rstd, inp, weight, N, C, eps);
  Cast(out16, out_type, out32, DType::kF32, N * C);
}

Result<std::unique_ptr<BatchUpload>> Backend::MakeBatchUpload(size_t slot_bytes) {
  return std::unique_ptr<BatchUpload>(new HostBatchUpload(this, slot_bytes));
}

Result<std::unique_ptr<HostStaging>> Backend::MakeHostStaging(int slots, size_t slot_bytes) {
  if (slots < 1) return Status::InvalidArgument("MakeHostStaging: " + std::to_string(slots) + " slots");
  return std::unique_ptr<HostStaging>(new SyncHostStaging(this, slots, slot_bytes));
}

Status HostStaging::CheckRange(const char* what, int slot, size_t offset, size_t bytes) const {
  if (slot < 0 || slot >= slots()) {
    return Status::InvalidArgument(std::string("HostStaging::") + what + ": slot " + std::to_string(slot) +
                                   " is not in [0, " + std::to_string(slots()) + ")");
  }
  if (offset > slot_bytes() || bytes > slot_bytes() - offset) {
    return Status::InvalidArgument(std::string("HostStaging::") + what + " of " + std::to_string(bytes) +
                                   " bytes at " + std::to_string(offset) + ", slots hold " +
                                   std::to_string(slot_bytes()));
  }
  return Status::Ok();
}

}  // namespace traind::engine
