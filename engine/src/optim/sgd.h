// SGD over a model's flat parameter buffer, torch.optim.SGD semantics: momentum, dampening,
// nesterov and L2 weight decay (added to the gradient, only where ParamInfo::weight_decay).
// State: one fp32 momentum buffer per parameter ("<hf_name>.momentum_buffer") when momentum != 0,
// in the DeviceArena under kOptimizer; none otherwise. As torch, the buffer is the first step's
// gradient (no dampening on step 1).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "core/param_info.h"
#include "core/safetensors.h"
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

  // "<hf_name>.momentum_buffer" (fp32, the parameter's shape) per parameter when momentum != 0
  // and step() > 0; metadata {"format": "traind-sgd-v1", "step": N}.
  SafetensorsFile SaveState() const;
  // DATA_LOSS naming the tensor when one is missing or has the wrong dtype/shape, or the metadata
  // is bad.
  Status LoadState(const SafetensorsFile& file);

 private:
  struct Run {  // parameters contiguous in the flat buffer with one decay flag: one update call
    int64_t offset;
    int64_t state_offset;
    int64_t numel;
    bool decay;
  };
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
