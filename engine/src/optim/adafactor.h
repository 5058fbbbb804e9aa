// Adafactor over a model's flat parameter buffer, with the semantics of HF transformers'
// transformers.optimization.Adafactor (arXiv:1804.04235): for a parameter of >= 2 dimensions
// (ours are (OC, C) Linear weights; leading dimensions batch) the second moment is factored into
// a row statistic (mean over the last dim) and a column statistic (mean over the second-to-last);
// vectors keep a full second moment. Per step t, with g = grad_scale * grad:
//   beta2t = 1 - t^decay_rate; update = g^2 + eps1;
//   factored:   row = beta2t row + (1-beta2t) mean_C(update); col likewise over R;
//               update = g * rsqrt(row / mean_R(row)) * rsqrt(col)
//   unfactored: v = beta2t v + (1-beta2t) update; update = g * rsqrt(v)
//   update /= max(1, RMS(update) / clip_threshold)
//   lr_t = (relative_step ? min(warmup_init ? 1e-6 t : 1e-2, 1/sqrt(t)) : lr)
//          * (scale_parameter ? max(eps2, RMS(p)) : 1)       (RMS(p) before the step)
//   update *= lr_t; beta1 set: m = beta1 m + (1-beta1) update, update = m
//   p -= weight_decay * lr_t * p (only where ParamInfo::weight_decay); p -= update.
// State (fp32, DeviceArena kOptimizer) under HF's names: "<hf_name>.exp_avg_sq_row" (shape[:-1]),
// ".exp_avg_sq_col" (shape[:-2] + shape[-1:]), ".exp_avg_sq" (vectors), ".exp_avg" (beta1 set).
// A padded vocabulary table (ParamInfo LiveShape: Vp rows laid out, V in HF) is the tensor of its
// V live rows to every statistic, as HF's (V, C) tensor is: RMS(p), RMS(update), the row and
// column means and mean_R(row) count V rows; the padded rows of the weights and of the state
// (exp_avg, exp_avg_sq_row, a vector's exp_avg_sq) are never touched and stay zero.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "optim/state_io.h"
#include "traind/engine/status.h"

namespace traind::engine {

// HF Adafactor's constructor arguments and defaults.
struct AdafactorOptions {
  std::optional<double> lr;     // external lr; must be unset with relative_step (HF: lr=None)
  double eps1 = 1e-30;          // eps[0]: added to g^2
  double eps2 = 1e-3;           // eps[1]: floor of the parameter scale RMS(p)
  double clip_threshold = 1.0;  // RMS threshold of the update
  double decay_rate = -0.8;     // beta2t = 1 - t^decay_rate
  std::optional<double> beta1;  // first moment only when set (HF: None)
  double weight_decay = 0.0;    // where ParamInfo::weight_decay
  bool scale_parameter = true;  // lr scaled by max(eps2, RMS(p))
  bool relative_step = true;    // time-dependent lr; Step()'s lr argument is then ignored
  bool warmup_init = false;     // relative step min(1e-6 t, 1/sqrt(t)); needs relative_step
};

class AdafactorOptimizer {
 public:
  // INVALID_ARGUMENT for the combinations HF rejects (lr with relative_step, warmup_init without
  // relative_step) and out-of-range values; INTERNAL when a parameter lies outside the flat
  // buffer of `num_params` floats; RESOURCE_EXHAUSTED when the state does not fit the arena.
  static Result<std::unique_ptr<AdafactorOptimizer>> Create(const std::vector<ParamInfo>& params,
                                                            int64_t num_params,
                                                            const AdafactorOptions& options,
                                                            DeviceArena* arena);
  // The bytes Create() allocates: the state above (4 bytes per value) plus a scratch of
  // 2 + max(B) doubles (per-tensor sums; B = product of the leading dims).
  static int64_t PlanBytes(const std::vector<ParamInfo>& params, const AdafactorOptions& options);

  ~AdafactorOptimizer();
  AdafactorOptimizer(const AdafactorOptimizer&) = delete;
  AdafactorOptimizer& operator=(const AdafactorOptimizer&) = delete;

  // One step (increments step() first). `lr` is the external learning rate (the scheduled
  // options.lr) when !relative_step, ignored otherwise. Issues backend ops only (no host sync).
  void Step(float* params, const float* grads, double lr, float grad_scale);
  int64_t step() const { return step_; }
  // The relative step of step t (1-based) as HF's _get_lr computes it before the parameter scale:
  // min(warmup_init ? 1e-6 t : 1e-2, 1/sqrt(t)) with relative_step, else `lr`.
  double RelativeStep(int64_t t, double lr) const;

  // The state tensors above; metadata {"format": "traind-adafactor-v1", "step": N}.
  SafetensorsFile SaveState() const;
  // DATA_LOSS naming the tensor when one is missing or differs in dtype/shape, or bad metadata.
  Status LoadState(const SafetensorsFile& file);
  // SaveState() written to `path` without assembling it: one tensor piece at a time copied device
  // -> host through a bounded buffer (state_io::WriteDeviceTensors); the same bytes.
  Status WriteState(const std::string& path) const;

 private:
  // The state tensors as they lie in device memory, and the file's metadata: what SaveState
  // copies to the host and WriteState streams to a file.
  std::vector<state_io::DeviceTensor> DeviceState(std::map<std::string, std::string>* metadata) const;
  struct Slot {       // one parameter
    int64_t n;        // the live elements (LiveNumel): every statistic's count
    int64_t B, R, C;  // of LiveShape; factored: (B, R, C); unfactored: (1, 1, n)
    bool factored;
    bool decay;
    int64_t m = -1;  // offsets into state_ (-1: none)
    int64_t row = -1, col = -1, v = -1;
  };
  AdafactorOptimizer(std::vector<ParamInfo> params, const AdafactorOptions& options,
                     DeviceArena* arena)
      : params_(std::move(params)), options_(options), arena_(arena) {}
  std::vector<std::pair<std::string, std::vector<int64_t>>> StateTensors(
      size_t i, std::vector<int64_t>* offs) const;

  std::vector<ParamInfo> params_;
  std::vector<Slot> slots_;
  AdafactorOptions options_;
  DeviceArena* arena_;
  float* state_ = nullptr;     // device
  double* scratch_ = nullptr;  // device: [sum p^2, sum update^2, row sums (max B)]
  int64_t step_ = 0;
};

}  // namespace traind::engine
