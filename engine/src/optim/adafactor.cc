// Adafactor: per-parameter op sequence (sum of p^2, second-moment statistics, sum of update^2,
// apply), every scalar kept in device memory; state (de)serialisation.
#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "optim/optim_ops.h"
#include "optim/state_io.h"

namespace traind::engine {

namespace {

constexpr const char* kFormat = "traind-adafactor-v1";

int64_t LeadingProduct(const std::vector<int64_t>& shape) {
  int64_t b = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) b *= shape[i];
  return b;
}

}  // namespace

int64_t AdafactorOptimizer::PlanBytes(const std::vector<ParamInfo>& params,
                                      const AdafactorOptions& options) {
  int64_t floats = 0, max_b = 1;
  for (const ParamInfo& p : params) {
    if (options.beta1.has_value()) floats += p.numel;
    if (p.shape.size() >= 2) {
      const int64_t B = LeadingProduct(p.shape);
      floats += B * p.shape[p.shape.size() - 2] + B * p.shape.back();
      max_b = std::max(max_b, B);
    } else {
      floats += p.numel;
    }
  }
  return floats * 4 + (2 + max_b) * 8;
}

Result<std::unique_ptr<AdafactorOptimizer>> AdafactorOptimizer::Create(
    const std::vector<ParamInfo>& params, int64_t num_params, const AdafactorOptions& o,
    DeviceArena* arena) {
  if (o.lr.has_value() && o.relative_step) {
    return Status::InvalidArgument("adafactor: cannot combine a manual lr (" +
                                   std::to_string(*o.lr) + ") with relative_step=true");
  }
  if (o.warmup_init && !o.relative_step) {
    return Status::InvalidArgument("adafactor: warmup_init=true requires relative_step=true");
  }
  if (!(o.clip_threshold > 0.0) || !(o.eps1 >= 0.0) || !(o.eps2 >= 0.0) || !(o.decay_rate < 0.0) ||
      (o.beta1.has_value() && !(*o.beta1 >= 0.0 && *o.beta1 < 1.0)) || !(o.weight_decay >= 0.0)) {
    return Status::InvalidArgument(
        "adafactor: need clip_threshold > 0, eps >= 0, decay_rate < 0, 0 <= beta1 < 1, "
        "weight_decay >= 0");
  }
  for (const ParamInfo& p : params) {
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > num_params) {
      return Status::Internal("optimizer: parameter " + p.hf_name +
                              " lies outside the flat buffer");
    }
  }
  std::unique_ptr<AdafactorOptimizer> opt(new AdafactorOptimizer(params, o, arena));
  int64_t off = 0;
  for (const ParamInfo& p : opt->params_) {
    Slot s;
    s.factored = p.shape.size() >= 2;
    s.decay = p.weight_decay && o.weight_decay != 0.0;
    // The statistics run over the tensor HF has (LiveShape: a padded vocabulary's first V rows,
    // a prefix of the view); the state keeps the view's shape, its padded rows zero.
    const std::vector<int64_t> live = LiveShape(p);
    s.n = LiveNumel(p);
    if (s.factored) {
      s.B = LeadingProduct(live);
      s.R = live[live.size() - 2];
      s.C = live.back();
    } else {
      s.B = s.R = 1;
      s.C = s.n;
    }
    if (o.beta1.has_value()) {
      s.m = off;
      off += p.numel;
    }
    if (s.factored) {  // laid out by the view's shape (StateTensors), padded rows included
      const int64_t full_b = LeadingProduct(p.shape);
      s.row = off;
      off += full_b * p.shape[p.shape.size() - 2];
      s.col = off;
      off += full_b * p.shape.back();
    } else {
      s.v = off;
      off += p.numel;
    }
    opt->slots_.push_back(s);
  }
  const int64_t scratch_bytes = PlanBytes(params, o) - off * 4;
  TRAIND_ASSIGN_OR_RETURN(void* st,
                          arena->Allocate(MemoryCategory::kOptimizer, off * 4, "Adafactor state"));
  opt->state_ = static_cast<float*>(st);
  TRAIND_ASSIGN_OR_RETURN(
      void* sc, arena->Allocate(MemoryCategory::kOptimizer, scratch_bytes, "Adafactor scratch"));
  opt->scratch_ = static_cast<double*>(sc);
  return opt;
}

AdafactorOptimizer::~AdafactorOptimizer() {
  if (state_ != nullptr) arena_->Release(state_);
  if (scratch_ != nullptr) arena_->Release(scratch_);
}

double AdafactorOptimizer::RelativeStep(int64_t t, double lr) const {
  if (!options_.relative_step) return lr;
  const double min_step = options_.warmup_init ? 1e-6 * static_cast<double>(t) : 1e-2;
  return std::min(min_step, 1.0 / std::sqrt(static_cast<double>(t)));
}

void AdafactorOptimizer::Step(float* params, const float* grads, double lr, float grad_scale) {
  ++step_;
  Backend* backend = arena_->backend();
  const float rel_step = static_cast<float>(RelativeStep(step_, lr));
  const float beta2t =
      static_cast<float>(1.0 - std::pow(static_cast<double>(step_), options_.decay_rate));
  const float eps1 = static_cast<float>(options_.eps1);
  const float beta1 = options_.beta1.has_value() ? static_cast<float>(*options_.beta1) : 0.0f;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const Slot& s = slots_[i];
    if (s.n == 0) continue;
    float* param = params + p.offset;
    const float* grad = grads + p.offset;
    float* m = s.m >= 0 ? state_ + s.m : nullptr;
    float* row = s.factored ? state_ + s.row : nullptr;
    float* col = s.factored ? state_ + s.col : nullptr;
    float* v = s.factored ? nullptr : state_ + s.v;
    double* row_sum = scratch_ + 2;
    backend->Memset0(scratch_, 2 * sizeof(double));
    backend->AccumulateSumSquares(scratch_, param, s.n);
    if (s.factored) {
      optim_ops::AdafactorFactoredStats(backend, grad, row, col, row_sum, s.B, s.R, s.C, beta2t,
                                        eps1, grad_scale);
    } else {
      optim_ops::AdafactorSecondMoment(backend, grad, v, s.n, beta2t, eps1, grad_scale);
    }
    optim_ops::AdafactorUpdateSumSquares(backend, scratch_ + 1, grad, row, col, row_sum, v, s.B,
                                         s.R, s.C, grad_scale);
    optim_ops::AdafactorApply(backend, param, m, grad, row, col, row_sum, v, scratch_, s.B, s.R,
                              s.C, grad_scale, rel_step, static_cast<float>(options_.eps2),
                              options_.scale_parameter, static_cast<float>(options_.clip_threshold),
                              beta1, s.decay ? static_cast<float>(options_.weight_decay) : 0.0f);
  }
}

// The state tensors of parameter i as (name, shape), with their offsets into state_.
std::vector<std::pair<std::string, std::vector<int64_t>>> AdafactorOptimizer::StateTensors(
    size_t i, std::vector<int64_t>* offs) const {
  const ParamInfo& p = params_[i];
  const Slot& s = slots_[i];
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  offs->clear();
  if (s.m >= 0) {
    out.push_back({p.hf_name + ".exp_avg", p.shape});
    offs->push_back(s.m);
  }
  if (s.factored) {
    std::vector<int64_t> row(p.shape.begin(), p.shape.end() - 1);
    std::vector<int64_t> col(p.shape.begin(), p.shape.end() - 2);
    col.push_back(p.shape.back());
    out.push_back({p.hf_name + ".exp_avg_sq_row", row});
    offs->push_back(s.row);
    out.push_back({p.hf_name + ".exp_avg_sq_col", col});
    offs->push_back(s.col);
  } else {
    out.push_back({p.hf_name + ".exp_avg_sq", p.shape});
    offs->push_back(s.v);
  }
  return out;
}

std::vector<state_io::DeviceTensor> AdafactorOptimizer::DeviceState(
    std::map<std::string, std::string>* metadata) const {
  SafetensorsFile header;
  state_io::SetHeader(&header, kFormat, step_);
  *metadata = header.metadata;
  std::vector<state_io::DeviceTensor> tensors;
  std::vector<int64_t> offs;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto named = StateTensors(i, &offs);
    for (size_t k = 0; k < named.size(); ++k) {
      int64_t n = 1;
      for (int64_t d : named[k].second) n *= d;
      tensors.push_back({std::move(named[k].first), "F32", std::move(named[k].second),
                         state_ + offs[k], static_cast<size_t>(n) * 4});
    }
  }
  return tensors;
}

SafetensorsFile AdafactorOptimizer::SaveState() const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::CopyDeviceTensors(metadata, tensors, arena_->backend());
}

Status AdafactorOptimizer::WriteState(const std::string& path) const {
  std::map<std::string, std::string> metadata;
  const std::vector<state_io::DeviceTensor> tensors = DeviceState(&metadata);
  return state_io::WriteDeviceTensors(path, metadata, tensors, arena_->backend());
}

Status AdafactorOptimizer::LoadState(const SafetensorsFile& file) {
  TRAIND_ASSIGN_OR_RETURN(int64_t step, state_io::ReadStep(file, kFormat));
  Backend* backend = arena_->backend();
  std::vector<int64_t> offs;
  // Check every tensor before writing any, so a bad file leaves the state as it was.
  std::vector<std::pair<const HostTensor*, int64_t>> writes;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto tensors = StateTensors(i, &offs);
    for (size_t k = 0; k < tensors.size(); ++k) {
      TRAIND_ASSIGN_OR_RETURN(const HostTensor* t,
                              state_io::Find(file, tensors[k].first, "F32", tensors[k].second));
      writes.push_back({t, offs[k]});
    }
  }
  for (const auto& [t, off] : writes)
    backend->CopyHostToDevice(state_ + off, t->data.data(), t->data.size());
  step_ = step;
  return Status::Ok();
}

}  // namespace traind::engine
