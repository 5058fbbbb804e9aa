// AdamW over a model's flat parameter buffer (torch.optim.AdamW semantics), with the weight-decay
// rule of JOBSPEC.md (decay only where ParamInfo::weight_decay: >= 2-D weights, never biases or
// norm weights), and the global gradient norm / clip coefficient of torch.nn.utils.clip_grad_norm_.
// State (m, v: fp32, one value per parameter) lives in the DeviceArena under kOptimizer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/arena.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "optim/state_io.h"
#include "optim/optimizer.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to the parameters whose ParamInfo::weight_decay is true
};

// The global L2 norm of the gradients of `params` (sqrt of the sum of squares over all of them,
// accumulated in double). Synchronizes.
double GlobalGradNorm(Backend* backend, const float* grads, const std::vector<ParamInfo>& params);

// Issues *acc (device double) += the sum of squares of the gradients of `params`, without
// reading anything back (the device-side half of GlobalGradNorm; capturable).
void AccumulateGradSquares(Backend* backend, const float* grads,
                           const std::vector<ParamInfo>& params, double* acc);

// torch.nn.utils.clip_grad_norm_'s factor: max_norm / (total_norm + 1e-6) when that is < 1, else 1
// (also 1 when max_norm <= 0, i.e. clipping disabled). Pass it as AdamW's grad_scale so the
// gradients themselves are never rewritten.
float ClipCoefficient(double total_norm, double max_norm);

class AdamWOptimizer final : public Optimizer {
 public:
  // Allocates m and v (2 * num_params floats, zeroed) from `arena` under kOptimizer.
  // RESOURCE_EXHAUSTED when they do not fit. `params` must describe views into buffers of
  // `num_params` floats. The arena (and its backend) must outlive the optimizer.
  static Result<std::unique_ptr<AdamWOptimizer>> Create(const std::vector<ParamInfo>& params,
                                                        int64_t num_params,
                                                        const AdamWOptions& options,
                                                        DeviceArena* arena);
  // The bytes Create() allocates.
  static int64_t PlanBytes(int64_t num_params) { return 2 * num_params * 4; }

  ~AdamWOptimizer() override;
  AdamWOptimizer(const AdamWOptimizer&) = delete;
  AdamWOptimizer& operator=(const AdamWOptimizer&) = delete;

  // One step at rate `lr` on every parameter: the gradient used is grad_scale * grads.
  // Increments step() first (torch counts steps from 1 for the bias corrections).
  void Step(float* params, const float* grads, double lr, float grad_scale) override;

  std::string name() const override { return "adamw"; }
  int64_t step() const override { return step_; }
  bool issues_from_device_scalars() const override { return true; }

  // The step with its scalars in device memory (capturable; the trainer's path): FillNextStep
  // writes the bias corrections of step() + 1 into a host StepScalars the caller then copies to
  // the device; IssueStep issues the update of every parameter from the device copy
  // (Backend::AdamWFromScalars, gradient multiplier from its grad_sq); CountStep counts the step
  // once it is known to have been applied (not skipped for an fp16 overflow).
  void FillNextStep(StepScalars* s) const override;
  void IssueStep(float* params, const float* grads, const StepScalars* device_scalars) override;
  void CountStep() override { ++step_; }

  // The state as tensors "<hf_name>.exp_avg" / "<hf_name>.exp_avg_sq" (fp32, our layout shape)
  // and metadata {"step": N, "format": kStateFormat}.
  static constexpr const char* kStateFormat = "traind-adamw-v1";
  SafetensorsFile SaveState() const override;
  // Restores what SaveState() wrote. DATA_LOSS naming the tensor when one is missing or has the
  // wrong shape or dtype, or the metadata is bad.
  Status LoadState(const SafetensorsFile& file) override;
  // SaveState() written to `path` without assembling it in host memory: one tensor piece at a
  // time copied device -> host through a bounded buffer (state_io::WriteDeviceTensors); the same
  // bytes as WriteSafetensors(path, SaveState()).
  Status WriteState(const std::string& path) const override;

 private:
  // The state tensors as they lie in device memory, and the file's metadata: what SaveState
  // copies to the host and WriteState streams to a file.
  std::vector<state_io::DeviceTensor> DeviceState(std::map<std::string, std::string>* metadata) const;
  AdamWOptimizer(std::vector<ParamInfo> params, const AdamWOptions& options, DeviceArena* arena)
      : params_(std::move(params)), options_(options), arena_(arena) {}

  std::vector<ParamInfo> params_;
  // Runs of parameters contiguous in the flat buffer with the same weight decay (0: not
  // decayed): one AdamW call each in Step, all in one AdamWRunsFromScalars in IssueStep.
  std::vector<AdamWRun> runs_;
  AdamWOptions options_;
  DeviceArena* arena_;
  float* m_ = nullptr;  // device, num_params floats
  float* v_ = nullptr;  // device, num_params floats
  int64_t num_params_ = 0;
  int64_t step_ = 0;
};

}  // namespace traind::engine
