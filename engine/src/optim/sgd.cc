// SGD: per-run update calls over the flat buffers, state (de)serialisation.
#include "optim/sgd.h"

#include "optim/optim_ops.h"
#include "optim/state_io.h"

namespace traind::engine {

namespace {
constexpr const char* kFormat = "traind-sgd-v1";
}

int64_t SgdOptimizer::PlanBytes(const std::vector<ParamInfo>& params, const SgdOptions& options) {
  if (options.momentum == 0.0) return 0;
  int64_t n = 0;
  for (const ParamInfo& p : params) n += p.numel;
  return n * 4;
}

Result<std::unique_ptr<SgdOptimizer>> SgdOptimizer::Create(const std::vector<ParamInfo>& params,
                                                           int64_t num_params,
                                                           const SgdOptions& options,
                                                           DeviceArena* arena) {
  if (!(options.momentum >= 0.0) || !(options.weight_decay >= 0.0)) {
    return Status::InvalidArgument("sgd: momentum " + std::to_string(options.momentum) +
                                   " and weight_decay " + std::to_string(options.weight_decay) +
                                   " must be >= 0");
  }
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0)) {
    return Status::InvalidArgument("sgd: nesterov needs momentum > 0 and dampening 0 (momentum " +
                                   std::to_string(options.momentum) + ", dampening " +
                                   std::to_string(options.dampening) + ")");
  }
  for (const ParamInfo& p : params) {
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > num_params) {
      return Status::Internal("optimizer: parameter " + p.hf_name +
                              " lies outside the flat buffer");
    }
  }
  std::unique_ptr<SgdOptimizer> opt(new SgdOptimizer(params, options, arena));
  int64_t state = 0;
  for (const ParamInfo& p : opt->params_) {
    const bool decay = p.weight_decay && options.weight_decay != 0.0;
    opt->state_offsets_.push_back(state);
    Run* last = opt->runs_.empty() ? nullptr : &opt->runs_.back();
    if (last != nullptr && last->decay == decay && last->offset + last->numel == p.offset &&
        last->state_offset + last->numel == state) {
      last->numel += p.numel;
    } else {
      opt->runs_.push_back({p.offset, state, p.numel, decay});
    }
    state += p.numel;
  }
  const int64_t bytes = PlanBytes(params, options);
  if (bytes > 0) {
    TRAIND_ASSIGN_OR_RETURN(
        void* b, arena->Allocate(MemoryCategory::kOptimizer, bytes, "SGD momentum_buffer"));
    opt->buf_ = static_cast<float*>(b);
  }
  return opt;
}

SgdOptimizer::~SgdOptimizer() {
  if (buf_ != nullptr) arena_->Release(buf_);
}

void SgdOptimizer::Step(float* params, const float* grads, double lr, float grad_scale) {
  const bool first = step_ == 0;
  ++step_;
  Issue(params, grads, static_cast<float>(lr), grad_scale, first, nullptr);
}

void SgdOptimizer::FillNextStep(StepScalars* s) const {
  s->bias_correction1 = 1.0f;
  s->bias_correction2 = 1.0f;
}

void SgdOptimizer::IssueStep(float* params, const float* grads, const StepScalars* device_scalars) {
  Issue(params, grads, 0.0f, 1.0f, step_ == 0, device_scalars);
}

void SgdOptimizer::Issue(float* params, const float* grads, float lr, float grad_scale, bool first,
                         const StepScalars* s) {
  Backend* backend = arena_->backend();
  for (const Run& r : runs_) {
    optim_ops::SgdUpdate(backend, params + r.offset, grads + r.offset,
                         buf_ == nullptr ? nullptr : buf_ + r.state_offset, r.numel, lr,
                         static_cast<float>(options_.momentum),
                         static_cast<float>(options_.dampening),
                         r.decay ? static_cast<float>(options_.weight_decay) : 0.0f,
                         options_.nesterov, first, grad_scale, s);
  }
}

std::vector<state_io::DeviceTensor> SgdOptimizer::DeviceState(
    std::map<std::string, std::string>* metadata) const {
  SafetensorsFile header;
  state_io::SetHeader(&header, kFormat, step_);
  *metadata = header.metadata;
  std::vector<state_io::DeviceTensor> tensors;
  if (buf_ != nullptr && step_ != 0) {  // no momentum buffers before the first step
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamInfo& p = params_[i];
      tensors.push_back({p.hf_name + ".momentum_buffer", "F32", p.shape,
                         buf_ + state_offsets_[i], static_cast<size_t>(p.numel) * 4});
    }
  }
  return tensors;
}

SafetensorsFile SgdOptimizer::SaveState() const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::CopyDeviceTensors(metadata, tensors, arena_->backend());
}

Status SgdOptimizer::WriteState(const std::string& path) const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::WriteDeviceTensors(path, metadata, tensors, arena_->backend());
}

Status SgdOptimizer::LoadState(const SafetensorsFile& file) {
  TRAIND_ASSIGN_OR_RETURN(int64_t step, state_io::ReadStep(file, kFormat));
  if (buf_ != nullptr && step > 0) {
    Backend* backend = arena_->backend();
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamInfo& p = params_[i];
      TRAIND_ASSIGN_OR_RETURN(const HostTensor* t,
                              state_io::Find(file, p.hf_name + ".momentum_buffer", "F32", p.shape));
      backend->CopyHostToDevice(buf_ + state_offsets_[i], t->data.data(), t->data.size());
    }
  }
  step_ = step;
  return Status::Ok();
}

}  // namespace traind::engine
