// MakeOptimizer and OptimizerPlanBytes: training.optim to a concrete optimizer behind Optimizer.
#include "optim/optimizer.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "optim/adafactor.h"
#include "optim/adamw.h"
#include "optim/adamw_8bit.h"
#include "optim/sgd.h"

namespace traind::engine {
namespace {

// One concrete optimizer class behind the interface. kDevice: it has the device-scalar protocol
// (FillNextStep / IssueStep / CountStep); otherwise the step runner drives Step from the host.
template <class Impl, bool kDevice>
class Adapter final : public Optimizer {
 public:
  Adapter(std::string name, std::unique_ptr<Impl> impl)
      : name_(std::move(name)), impl_(std::move(impl)) {}
  std::string name() const override { return name_; }
  int64_t step() const override { return impl_->step(); }
  bool issues_from_device_scalars() const override { return kDevice; }
  void FillNextStep(StepScalars* s) const override {
    if constexpr (kDevice) impl_->FillNextStep(s);
  }
  void IssueStep(float* params, const float* grads, const StepScalars* device_scalars) override {
    if constexpr (kDevice) impl_->IssueStep(params, grads, device_scalars);
  }
  void CountStep() override {
    if constexpr (kDevice) impl_->CountStep();
  }
  void Step(float* params, const float* grads, double lr, float grad_scale) override {
    impl_->Step(params, grads, lr, grad_scale);
  }
  SafetensorsFile SaveState() const override { return impl_->SaveState(); }
  Status LoadState(const SafetensorsFile& file) override { return impl_->LoadState(file); }
  Status WriteState(const std::string& path) const override { return impl_->WriteState(path); }

 private:
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

// AdamW and 8-bit AdamW take the same training.adam_* fields and weight_decay.
template <class Options>
Options AdamFrom(const TrainingSpec& t) {
  Options o;
  o.beta1 = t.adam_beta1;
  o.beta2 = t.adam_beta2;
  o.eps = t.adam_epsilon;
  o.weight_decay = t.weight_decay;
  return o;
}
AdamWOptions AdamWFrom(const TrainingSpec& t) { return AdamFrom<AdamWOptions>(t); }
AdamW8bitOptions AdamW8bitFrom(const TrainingSpec& t) { return AdamFrom<AdamW8bitOptions>(t); }

SgdOptions SgdFrom(const TrainingSpec& t) {
  SgdOptions o;
  o.momentum = t.optim_args.momentum;
  o.dampening = t.optim_args.dampening;
  o.nesterov = t.optim_args.nesterov;
  o.weight_decay = t.weight_decay;
  return o;
}

AdafactorOptions AdafactorFrom(const TrainingSpec& t) {
  const OptimArgs& a = t.optim_args;
  AdafactorOptions o;
  if (!a.relative_step) o.lr = t.learning_rate;  // the scheduled rate reaches Step() each step
  o.clip_threshold = a.clip_threshold;
  o.decay_rate = a.decay_rate;
  o.beta1 = a.beta1;
  o.weight_decay = t.weight_decay;
  o.scale_parameter = a.scale_parameter;
  o.relative_step = a.relative_step;
  o.warmup_init = a.warmup_init;
  return o;
}

template <class Impl, bool kDevice, class Options>
Result<std::unique_ptr<Optimizer>> Make(const std::string& name, const std::vector<ParamInfo>& params,
                                        int64_t num_params, const Options& options,
                                        DeviceArena* arena) {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Create(params, num_params, options, arena));
  return std::unique_ptr<Optimizer>(new Adapter<Impl, kDevice>(name, std::move(impl)));
}

}  // namespace

Result<SafetensorsStream> Optimizer::StateStream() const {
  auto state = std::make_shared<const SafetensorsFile>(SaveState());
  TRAIND_RETURN_IF_ERROR(status());
  SafetensorsStream out;
  out.metadata = state->metadata;
  auto order = std::make_shared<std::vector<const HostTensor*>>();
  for (const auto& [name, t] : state->tensors) {
    out.tensors.push_back({name, t.dtype, t.shape});
    order->push_back(&t);
  }
  out.data = [state, order](size_t i, const SafetensorsSink& sink) -> Status {
    const HostTensor& t = *(*order)[i];
    (void)sink(t.data.data(), t.data.size());  // a failed sink is the writer's to report
    return Status::Ok();
  };
  return out;
}

namespace {

Status ArgError(const char* key, const std::string& why) {
  return Status::InvalidArgument(std::string("training.optim_args.") + key + ": " + why);
}

Status NoArgs(const OptimArgs&) { return Status::Ok(); }

Status CheckSgdArgs(const OptimArgs& a) {
  if (a.momentum < 0) return ArgError("momentum", "must be >= 0");
  if (a.nesterov && (a.momentum <= 0 || a.dampening != 0)) {
    return ArgError("nesterov", "needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  return Status::Ok();
}

Status CheckAdafactorArgs(const OptimArgs& a) {
  if (a.warmup_init && !a.relative_step) {
    return ArgError("warmup_init", "needs relative_step: true (as HF's Adafactor)");
  }
  if (a.beta1 && !(*a.beta1 >= 0 && *a.beta1 < 1)) return ArgError("beta1", "must be in [0, 1) or null");
  if (!(a.clip_threshold > 0)) return ArgError("clip_threshold", "must be > 0");
  if (!(a.decay_rate < 0)) return ArgError("decay_rate", "must be < 0 (beta2 = 1 - t^decay_rate)");
  return Status::Ok();
}

Result<std::unique_ptr<Optimizer>> CreateAdamW(const TrainingSpec& t,
                                               const std::vector<ParamInfo>& params,
                                               int64_t num_params, DeviceArena* arena,
                                               const std::vector<bool>&) {
  // AdamWOptimizer implements Optimizer itself.
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<AdamWOptimizer> adamw,
                          AdamWOptimizer::Create(params, num_params, AdamWFrom(t), arena));
  return std::unique_ptr<Optimizer>(std::move(adamw));
}
int64_t PlanAdamW(const TrainingSpec&, const std::vector<ParamInfo>&, int64_t num_params,
                  const std::vector<bool>&) {
  return AdamWOptimizer::PlanBytes(num_params);
}

Result<std::unique_ptr<Optimizer>> CreateAdamW8bit(const TrainingSpec& t,
                                                   const std::vector<ParamInfo>& params,
                                                   int64_t num_params, DeviceArena* arena,
                                                   const std::vector<bool>& quantized) {
  AdamW8bitOptions o = AdamW8bitFrom(t);
  o.quantized = quantized;
  return Make<AdamW8bitOptimizer, true>(t.optim, params, num_params, o, arena);
}
int64_t PlanAdamW8bit(const TrainingSpec& t, const std::vector<ParamInfo>& params, int64_t,
                      const std::vector<bool>& quantized) {
  AdamW8bitOptions o = AdamW8bitFrom(t);
  o.quantized = quantized;
  return AdamW8bitOptimizer::PlanBytes(params, o);
}

Result<std::unique_ptr<Optimizer>> CreateSgd(const TrainingSpec& t,
                                             const std::vector<ParamInfo>& params,
                                             int64_t num_params, DeviceArena* arena,
                                             const std::vector<bool>&) {
  return Make<SgdOptimizer, true>(t.optim, params, num_params, SgdFrom(t), arena);
}
int64_t PlanSgd(const TrainingSpec& t, const std::vector<ParamInfo>& params, int64_t,
                const std::vector<bool>&) {
  return SgdOptimizer::PlanBytes(params, SgdFrom(t));
}

Result<std::unique_ptr<Optimizer>> CreateAdafactor(const TrainingSpec& t,
                                                   const std::vector<ParamInfo>& params,
                                                   int64_t num_params, DeviceArena* arena,
                                                   const std::vector<bool>&) {
  return Make<AdafactorOptimizer, false>(t.optim, params, num_params, AdafactorFrom(t), arena);
}
int64_t PlanAdafactor(const TrainingSpec& t, const std::vector<ParamInfo>& params, int64_t,
                      const std::vector<bool>&) {
  return AdafactorOptimizer::PlanBytes(params, AdafactorFrom(t));
}

using Z = OptimizerRow::Zero1;
using Off = OptimizerRow::Offload;

}  // namespace

const std::vector<OptimizerRow>& Optimizers() {
  static const std::vector<OptimizerRow> kRows = {
      {OptimKind::kAdamW, "adamw", {}, NoArgs, CreateAdamW, PlanAdamW, Z::kElementwise,
       /*quantized_8bit=*/false, Off::kChunkedAdamW,
       /*leaner=*/{OptimKind::kAdamW8bit, OptimKind::kAdafactor}},
      {OptimKind::kAdafactor, "adafactor",
       {"scale_parameter", "relative_step", "warmup_init", "beta1", "clip_threshold", "decay_rate"},
       CheckAdafactorArgs, CreateAdafactor, PlanAdafactor, Z::kWholeTensors, false, Off::kGroups},
      {OptimKind::kAdamW8bit, "adamw_8bit", {}, NoArgs, CreateAdamW8bit, PlanAdamW8bit,
       Z::kQuantizedBlocks, /*quantized_8bit=*/true, Off::kGroups},
      {OptimKind::kSgd, "sgd", {"momentum", "dampening", "nesterov"}, CheckSgdArgs, CreateSgd,
       PlanSgd, Z::kElementwise, false, Off::kGroups},
  };
  return kRows;
}

const OptimizerRow* FindOptimizer(std::string_view name) {
  for (const OptimizerRow& row : Optimizers()) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

const OptimizerRow& OptimizerOf(const TrainingSpec& training) {
  const OptimizerRow* row = FindOptimizer(training.optim);
  if (row == nullptr) {
    std::fprintf(stderr, "traind: training.optim '%s' is not one of %s\n", training.optim.c_str(),
                 OptimizerNames().c_str());
    std::abort();
  }
  return *row;
}

std::string OptimizerNames() {
  std::string s;
  for (const OptimizerRow& row : Optimizers()) s += (s.empty() ? "" : ", ") + std::string(row.name);
  return s;
}

Result<std::unique_ptr<Optimizer>> MakeOptimizer(const TrainingSpec& t,
                                                 const std::vector<ParamInfo>& params,
                                                 int64_t num_params, DeviceArena* arena,
                                                 const std::vector<bool>& quantized) {
  const OptimizerRow* row = FindOptimizer(t.optim);
  if (row == nullptr) {
    return Status::InvalidArgument("training.optim: unknown optimizer '" + t.optim + "' (" +
                                   OptimizerNames() + ")");
  }
  return row->create(t, params, num_params, arena, quantized);
}

int64_t OptimizerPlanBytes(const TrainingSpec& t, const std::vector<ParamInfo>& params,
                           int64_t num_params, const std::vector<bool>& quantized) {
  const OptimizerRow* row = FindOptimizer(t.optim);
  if (row == nullptr) row = &Optimizers().front();  // MakeOptimizer refuses it
  return row->plan_bytes(t, params, num_params, quantized);
}

}  // namespace traind::engine
