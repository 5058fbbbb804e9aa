// AdamW: per-run backend calls over the flat buffers, global grad norm, state (de)serialisation.
#include "optim/adamw.h"

#include <cmath>
#include <string>

#include "optim/state_io.h"

namespace traind::engine {

namespace {

// Calls fn(begin, end) for each maximal run of parameters that are contiguous in the flat buffer
// (gaps between views, if any, are skipped).
template <typename Fn>
void ForEachContiguousRun(const std::vector<ParamInfo>& params, Fn fn) {
  size_t i = 0;
  while (i < params.size()) {
    const int64_t begin = params[i].offset;
    int64_t end = begin + params[i].numel;
    size_t j = i + 1;
    while (j < params.size() && params[j].offset == end) end += params[j++].numel;
    fn(begin, end);
    i = j;
  }
}

}  // namespace

double GlobalGradNorm(Backend* backend, const float* grads, const std::vector<ParamInfo>& params) {
  double sum = 0.0;
  ForEachContiguousRun(params, [&](int64_t begin, int64_t end) {
    sum += backend->SumSquares(grads + begin, end - begin);
  });
  return std::sqrt(sum);
}

void AccumulateGradSquares(Backend* backend, const float* grads,
                           const std::vector<ParamInfo>& params, double* acc) {
  ForEachContiguousRun(params, [&](int64_t begin, int64_t end) {
    backend->AccumulateSumSquares(acc, grads + begin, end - begin);
  });
}

float ClipCoefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;
  return ClipGradCoefficient(static_cast<float>(total_norm), static_cast<float>(max_norm));
}

Result<std::unique_ptr<AdamWOptimizer>> AdamWOptimizer::Create(const std::vector<ParamInfo>& params,
                                                               int64_t num_params,
                                                               const AdamWOptions& options,
                                                               DeviceArena* arena) {
  for (const ParamInfo& p : params) {
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > num_params) {
      return Status::Internal("optimizer: parameter " + p.hf_name + " lies outside the flat buffer");
    }
  }
  std::unique_ptr<AdamWOptimizer> opt(new AdamWOptimizer(params, options, arena));
  opt->num_params_ = num_params;
  const int64_t bytes = num_params * 4;
  TRAIND_ASSIGN_OR_RETURN(void* m, arena->Allocate(MemoryCategory::kOptimizer, bytes, "AdamW exp_avg"));
  opt->m_ = static_cast<float*>(m);
  TRAIND_ASSIGN_OR_RETURN(void* v, arena->Allocate(MemoryCategory::kOptimizer, bytes, "AdamW exp_avg_sq"));
  opt->v_ = static_cast<float*>(v);
  for (const ParamInfo& p : opt->params_) {
    const float decay = p.weight_decay ? static_cast<float>(options.weight_decay) : 0.0f;
    if (!opt->runs_.empty() && opt->runs_.back().weight_decay == decay &&
        opt->runs_.back().offset + opt->runs_.back().numel == p.offset) {
      opt->runs_.back().numel += p.numel;
    } else {
      opt->runs_.push_back({p.offset, p.numel, decay});
    }
  }
  return opt;
}

AdamWOptimizer::~AdamWOptimizer() {
  if (m_ != nullptr) arena_->Release(m_);
  if (v_ != nullptr) arena_->Release(v_);
}

void AdamWOptimizer::Step(float* params, const float* grads, double lr, float grad_scale) {
  ++step_;
  // As torch: 1 - beta ** step in double, handed to the kernel in fp32.
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  Backend* backend = arena_->backend();
  for (const AdamWRun& r : runs_) {
    backend->AdamW(params + r.offset, grads + r.offset, m_ + r.offset, v_ + r.offset, r.numel,
                   static_cast<float>(lr), static_cast<float>(options_.beta1),
                   static_cast<float>(options_.beta2), static_cast<float>(options_.eps),
                   r.weight_decay,
                   static_cast<float>(bc1), static_cast<float>(bc2), grad_scale);
  }
}

void AdamWOptimizer::FillNextStep(StepScalars* s) const {
  const double next = static_cast<double>(step_ + 1);
  s->bias_correction1 = static_cast<float>(1.0 - std::pow(options_.beta1, next));
  s->bias_correction2 = static_cast<float>(1.0 - std::pow(options_.beta2, next));
}

void AdamWOptimizer::IssueStep(float* params, const float* grads,
                               const StepScalars* device_scalars) {
  // Every run in one call (one parallel pass on the CPU; one kernel per run elsewhere).
  arena_->backend()->AdamWRunsFromScalars(
      params, grads, m_, v_, runs_.data(), static_cast<int64_t>(runs_.size()),
      device_scalars, static_cast<float>(options_.beta1), static_cast<float>(options_.beta2),
      static_cast<float>(options_.eps));
}

std::vector<state_io::DeviceTensor> AdamWOptimizer::DeviceState(
    std::map<std::string, std::string>* metadata) const {
  *metadata = {{"format", kStateFormat}, {"step", std::to_string(step_)}};
  std::vector<state_io::DeviceTensor> tensors;
  for (const ParamInfo& p : params_) {
    const size_t bytes = static_cast<size_t>(p.numel) * 4;
    tensors.push_back({p.hf_name + ".exp_avg", "F32", p.shape, m_ + p.offset, bytes});
    tensors.push_back({p.hf_name + ".exp_avg_sq", "F32", p.shape, v_ + p.offset, bytes});
  }
  return tensors;
}

SafetensorsFile AdamWOptimizer::SaveState() const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::CopyDeviceTensors(metadata, tensors, arena_->backend());
}

Status AdamWOptimizer::WriteState(const std::string& path) const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::WriteDeviceTensors(path, metadata, tensors, arena_->backend());
}

Status AdamWOptimizer::LoadState(const SafetensorsFile& file) {
  auto fmt = file.metadata.find("format");
  auto st = file.metadata.find("step");
  if (fmt == file.metadata.end() || fmt->second != kStateFormat || st == file.metadata.end()) {
    return Status::DataLoss("optimizer state: metadata lacks format traind-adamw-v1 and step");
  }
  int64_t step = 0;
  try {
    step = std::stoll(st->second);
  } catch (...) {
    return Status::DataLoss("optimizer state: bad step '" + st->second + "'");
  }
  if (step < 0) return Status::DataLoss("optimizer state: negative step " + st->second);
  Backend* backend = arena_->backend();
  for (const ParamInfo& p : params_) {
    for (int which = 0; which < 2; ++which) {
      const std::string name = p.hf_name + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) return Status::DataLoss("optimizer state: missing tensor " + name);
      const HostTensor& t = it->second;
      if (t.dtype != "F32" || t.shape != p.shape ||
          static_cast<int64_t>(t.data.size()) != p.numel * 4) {
        return Status::DataLoss("optimizer state: tensor " + name +
                                " has the wrong dtype or shape for this model");
      }
      float* dst = (which == 0 ? m_ : v_) + p.offset;
      backend->CopyHostToDevice(dst, t.data.data(), t.data.size());
    }
  }
  step_ = step;
  return Status::Ok();
}

}  // namespace traind::engine
