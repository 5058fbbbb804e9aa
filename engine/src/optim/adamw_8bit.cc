// 8-bit AdamW: per-parameter update calls (blockwise 8-bit or fp32 AdamW), state layout and
// (de)serialisation.
#include "optim/adamw_8bit.h"

#include <cmath>
#include <string>

#include "optim/optim_ops.h"
#include "optim/quant8.h"
#include "optim/state_io.h"

namespace traind::engine {

namespace {
constexpr const char* kFormat = "traind-adamw8bit-v1";
constexpr int64_t kTableBytes = 2 * 256 * 4;

// bitsandbytes' size rule counts the tensor HF has: a padded vocabulary table's V rows
// (LiveNumel), not the Vp laid out. (Its padded zeros share the last live block without changing
// its absmax, and quantize to the code of 0, so they stay zero.)
bool Quantized(const AdamW8bitOptions& o, size_t i, const ParamInfo& p) {
  if (p.numel <= 0) return false;
  return o.quantized.empty() ? LiveNumel(p) >= o.min_8bit_size : o.quantized[i];
}
}  // namespace

int64_t AdamW8bitOptimizer::PlanBytes(const std::vector<ParamInfo>& params,
                                      const AdamW8bitOptions& options) {
  int64_t bytes = 0;
  bool any8 = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (Quantized(options, i, p)) {
      bytes += 2 * p.numel + 2 * 4 * Quant8Blocks(p.numel);
      any8 = true;
    } else {
      bytes += 2 * 4 * p.numel;
    }
  }
  return bytes + (any8 ? kTableBytes : 0);
}

Result<std::unique_ptr<AdamW8bitOptimizer>> AdamW8bitOptimizer::Create(
    const std::vector<ParamInfo>& params, int64_t num_params, const AdamW8bitOptions& o,
    DeviceArena* arena) {
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0) || !(o.beta2 >= 0.0 && o.beta2 < 1.0) || !(o.eps > 0.0) ||
      !(o.weight_decay >= 0.0)) {
    return Status::InvalidArgument("adamw_8bit: need 0 <= betas < 1 (" + std::to_string(o.beta1) +
                                   ", " + std::to_string(o.beta2) +
                                   "), eps > 0, weight_decay >= 0");
  }
  for (const ParamInfo& p : params) {
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > num_params) {
      return Status::Internal("optimizer: parameter " + p.hf_name +
                              " lies outside the flat buffer");
    }
  }
  if (!o.quantized.empty() && o.quantized.size() != params.size()) {
    return Status::Internal("adamw_8bit: " + std::to_string(o.quantized.size()) +
                            " quantization flags for " + std::to_string(params.size()) +
                            " parameters");
  }
  std::unique_ptr<AdamW8bitOptimizer> opt(new AdamW8bitOptimizer(params, o, arena));
  for (size_t i = 0; i < opt->params_.size(); ++i) {
    const ParamInfo& p = opt->params_[i];
    Slot s;
    s.quantized = Quantized(o, i, p);
    s.decay = p.weight_decay && o.weight_decay != 0.0;
    if (s.quantized) {
      s.off = opt->n8_;
      s.block = opt->blocks_;
      opt->n8_ += p.numel;
      opt->blocks_ += Quant8Blocks(p.numel);
    } else {
      s.off = opt->n32_;
      s.block = 0;
      opt->n32_ += p.numel;
    }
    opt->slots_.push_back(s);
  }
  if (opt->n8_ > 0) {
    TRAIND_ASSIGN_OR_RETURN(
        void* c, arena->Allocate(MemoryCategory::kOptimizer, 2 * opt->n8_, "AdamW8bit codes"));
    opt->codes_ = static_cast<uint8_t*>(c);
    TRAIND_ASSIGN_OR_RETURN(void* a, arena->Allocate(MemoryCategory::kOptimizer,
                                                     2 * 4 * opt->blocks_, "AdamW8bit absmax"));
    opt->absmax_ = static_cast<float*>(a);
    TRAIND_ASSIGN_OR_RETURN(
        void* t, arena->Allocate(MemoryCategory::kOptimizer, kTableBytes, "AdamW8bit code tables"));
    opt->tables_ = static_cast<float*>(t);
    arena->backend()->CopyHostToDevice(opt->tables_, DynamicCodeSigned(), 256 * 4);
    arena->backend()->CopyHostToDevice(opt->tables_ + 256, DynamicCodeUnsigned(), 256 * 4);
  }
  if (opt->n32_ > 0) {
    TRAIND_ASSIGN_OR_RETURN(void* f, arena->Allocate(MemoryCategory::kOptimizer, 2 * 4 * opt->n32_,
                                                     "AdamW8bit fp32 moments"));
    opt->f32_ = static_cast<float*>(f);
  }
  return opt;
}

AdamW8bitOptimizer::~AdamW8bitOptimizer() {
  for (void* p : {static_cast<void*>(codes_), static_cast<void*>(absmax_), static_cast<void*>(f32_),
                  static_cast<void*>(tables_)}) {
    if (p != nullptr) arena_->Release(p);
  }
}

void AdamW8bitOptimizer::Step(float* params, const float* grads, double lr, float grad_scale) {
  ++step_;
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  Issue(params, grads, static_cast<float>(lr), static_cast<float>(bc1), static_cast<float>(bc2),
        grad_scale, nullptr);
}

void AdamW8bitOptimizer::FillNextStep(StepScalars* s) const {
  const double next = static_cast<double>(step_ + 1);
  s->bias_correction1 = static_cast<float>(1.0 - std::pow(options_.beta1, next));
  s->bias_correction2 = static_cast<float>(1.0 - std::pow(options_.beta2, next));
}

void AdamW8bitOptimizer::IssueStep(float* params, const float* grads,
                                   const StepScalars* device_scalars) {
  Issue(params, grads, 0.0f, 1.0f, 1.0f, 1.0f, device_scalars);
}

void AdamW8bitOptimizer::Issue(float* params, const float* grads, float lr, float bc1, float bc2,
                               float grad_scale, const StepScalars* s) {
  Backend* backend = arena_->backend();
  const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const Slot& slot = slots_[i];
    if (p.numel == 0) continue;
    const float wd = slot.decay ? static_cast<float>(options_.weight_decay) : 0.0f;
    if (slot.quantized) {
      optim_ops::AdamW8bitBlockwise(backend, params + p.offset, grads + p.offset, codes_ + slot.off,
                                    codes_ + n8_ + slot.off, absmax_ + slot.block,
                                    absmax_ + blocks_ + slot.block, tables_, tables_ + 256, p.numel,
                                    lr, b1, b2, eps, wd, bc1, bc2, grad_scale, s);
    } else if (s != nullptr) {
      backend->AdamWFromScalars(params + p.offset, grads + p.offset, f32_ + slot.off,
                                f32_ + n32_ + slot.off, p.numel, s, b1, b2, eps, wd);
    } else {
      backend->AdamW(params + p.offset, grads + p.offset, f32_ + slot.off, f32_ + n32_ + slot.off,
                     p.numel, lr, b1, b2, eps, wd, bc1, bc2, grad_scale);
    }
  }
}

std::vector<state_io::DeviceTensor> AdamW8bitOptimizer::DeviceState(
    std::map<std::string, std::string>* metadata) const {
  SafetensorsFile header;
  state_io::SetHeader(&header, kFormat, step_);
  *metadata = header.metadata;
  std::vector<state_io::DeviceTensor> tensors;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const Slot& s = slots_[i];
    for (int which = 0; which < 2; ++which) {
      const std::string name = p.hf_name + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      if (s.quantized) {
        tensors.push_back({name, "U8", p.shape, codes_ + which * n8_ + s.off,
                           static_cast<size_t>(p.numel)});
        const int64_t blocks = Quant8Blocks(p.numel);
        tensors.push_back({name + "_absmax", "F32", {blocks}, absmax_ + which * blocks_ + s.block,
                           static_cast<size_t>(blocks) * 4});
      } else {
        tensors.push_back({name, "F32", p.shape, f32_ + which * n32_ + s.off,
                           static_cast<size_t>(p.numel) * 4});
      }
    }
  }
  return tensors;
}

SafetensorsFile AdamW8bitOptimizer::SaveState() const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::CopyDeviceTensors(metadata, tensors, arena_->backend());
}

Status AdamW8bitOptimizer::WriteState(const std::string& path) const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::WriteDeviceTensors(path, metadata, tensors, arena_->backend());
}

Status AdamW8bitOptimizer::LoadState(const SafetensorsFile& file) {
  TRAIND_ASSIGN_OR_RETURN(int64_t step, state_io::ReadStep(file, kFormat));
  struct Write {
    const HostTensor* t;
    void* dst;
  };
  std::vector<Write> writes;  // all checked before any is applied
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const Slot& s = slots_[i];
    for (int which = 0; which < 2; ++which) {
      const std::string name = p.hf_name + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      if (s.quantized) {
        TRAIND_ASSIGN_OR_RETURN(const HostTensor* t, state_io::Find(file, name, "U8", p.shape));
        writes.push_back({t, codes_ + which * n8_ + s.off});
        TRAIND_ASSIGN_OR_RETURN(const HostTensor* a, state_io::Find(file, name + "_absmax", "F32",
                                                                    {Quant8Blocks(p.numel)}));
        writes.push_back({a, absmax_ + which * blocks_ + s.block});
      } else {
        TRAIND_ASSIGN_OR_RETURN(const HostTensor* t, state_io::Find(file, name, "F32", p.shape));
        writes.push_back({t, f32_ + which * n32_ + s.off});
      }
    }
  }
  Backend* backend = arena_->backend();
  for (const Write& w : writes)
    backend->CopyHostToDevice(w.dst, w.t->data.data(), w.t->data.size());
  step_ = step;
  return Status::Ok();
}

}  // namespace traind::engine
