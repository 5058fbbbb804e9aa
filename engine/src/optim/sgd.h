// SGD over a model's flat parameter buffer, torch.optim.SGD semantics: momentum, dampening,
// nesterov and L2 weight decay (added to the gradient, only where ParamInfo::weight_decay).
// State: one fp32 momentum buffer per parameter ("<hf_name>.momentum_buffer") when momentum != 0,
// in the DeviceArena under kOptimizer; none otherwise. As torch, the buffer is the first step's
// gradient (no dampening on step 1).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "backend/step_scalars.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "optim/state_io.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct SgdOptions {
  double momentum = 0.0;      // torch momentum; 0 keeps no state
  double dampening = 0.0;     // torch dampening (not applied on step 1)
  double weight_decay = 0.0;  // L2 added to the gradient where ParamInfo::weight_decay
  bool nesterov = false;      // needs momentum > 0 and dampening == 0 (as torch)
};

class SgdOptimizer {
 public:
  // INVALID_ARGUMENT for options torch rejects (negative momentum or weight decay, nesterov
  // without momentum or with dampening); INTERNAL when a parameter lies outside the flat buffer of
  // `num_params` floats; RESOURCE_EXHAUSTED when the state does not fit the arena. The arena (and
  // its backend) must outlive the optimizer.
  static Result<std::unique_ptr<SgdOptimizer>> Create(const std::vector<ParamInfo>& params,
                                                      int64_t num_params, const SgdOptions& options,
                                                      DeviceArena* arena);
  // The bytes Create() allocates: 4 per parameter element with momentum, else 0.
  static int64_t PlanBytes(const std::vector<ParamInfo>& params, const SgdOptions& options);

  ~SgdOptimizer();
  SgdOptimizer(const SgdOptimizer&) = delete;
  SgdOptimizer& operator=(const SgdOptimizer&) = delete;

  // One step at rate `lr` with gradient grad_scale * grads; increments step() first.
  void Step(float* params, const float* grads, double lr, float grad_scale);
  int64_t step() const { return step_; }

  // The step with its scalars in device memory (capturable; AdamWOptimizer's protocol for the
  // StepRunner): FillNextStep sets the bias corrections (unused by SGD) to 1; IssueStep issues the
  // update with lr = s->lr and the gradient multiplier StepGradMultiplier(s->grad_sq,
  // s->loss_scale, s->max_grad_norm) read on the device, nothing when s->skip_nonfinite and
  // grad_sq is not finite; CountStep counts the step once it is known to have been applied. The
  // first counted step copies the gradient into the momentum buffer (torch), so a graph captured
  // before step() > 0 must not be replayed for later steps when dampening != 0.
  void FillNextStep(StepScalars* s) const;
  void IssueStep(float* params, const float* grads, const StepScalars* device_scalars);
  void CountStep() { ++step_; }

  // "<hf_name>.momentum_buffer" (fp32, the parameter's shape) per parameter when momentum != 0
  // and step() > 0; metadata {"format": "traind-sgd-v1", "step": N}.
  SafetensorsFile SaveState() const;
  // DATA_LOSS naming the tensor when one is missing or has the wrong dtype/shape, or the metadata
  // is bad.
  Status LoadState(const SafetensorsFile& file);
  // SaveState() written to `path` without assembling it: one tensor piece at a time copied device
  // -> host through a bounded buffer (state_io::WriteDeviceTensors); the same bytes.
  Status WriteState(const std::string& path) const;

 private:
  // The state tensors as they lie in device memory, and the file's metadata: what SaveState
  // copies to the host and WriteState streams to a file.
  std::vector<state_io::DeviceTensor> DeviceState(std::map<std::string, std::string>* metadata) const;
  struct Run {  // parameters contiguous in the flat buffer with one decay flag: one update call
    int64_t offset;
    int64_t state_offset;
    int64_t numel;
    bool decay;
  };
  // One update call per run; `s` (device scalars) or null for lr / grad_scale as given.
  void Issue(float* params, const float* grads, float lr, float grad_scale, bool first,
             const StepScalars* s);
  SgdOptimizer(std::vector<ParamInfo> params, const SgdOptions& options, DeviceArena* arena)
      : params_(std::move(params)), options_(options), arena_(arena) {}

  std::vector<ParamInfo> params_;
  std::vector<int64_t> state_offsets_;  // per parameter, into buf_
  std::vector<Run> runs_;
  SgdOptions options_;
  DeviceArena* arena_;
  float* buf_ = nullptr;  // device; sum of numel floats when momentum != 0
  int64_t step_ = 0;
};

}  // namespace traind::engine
