// 8-bit AdamW over a model's flat parameter buffer, with bitsandbytes' AdamW8bit semantics
// (optim_bits=8, block-wise): a tensor of at least min_8bit_size elements keeps both moments as
// uint8 codes of the block-wise dynamic quantization of optim/quant8.h (blocks of 256, fp32
// absmax per block; the signed dynamic map for exp_avg, the unsigned one for exp_avg_sq). Each step
// dequantizes a block, updates it in fp32, and requantizes it with the block's new absmax:
//   g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr * (m / bc1) / (sqrt(v) / sqrt(bc2) + eps); p *= 1 - lr * weight_decay
// (bitsandbytes decays after the Adam step; only where ParamInfo::weight_decay); an element
// whose gradient is not finite keeps its parameter and gets m = v = 0. Smaller tensors (biases,
// norm weights) keep fp32 moments and the fp32 AdamW update (Backend::AdamW, torch's order:
// decay first; they never decay under the JOBSPEC rule, so the orders agree there).
// State bytes: 2 + 8/256 per element of the 8-bit tensors, 8 per element of the others, plus the
// two 256-entry code tables (2 KiB) on the device. A padded vocabulary table (ParamInfo
// LiveShape: Vp rows laid out, V in HF) is sized by its V rows for the min_8bit_size rule, as
// bitsandbytes sizes HF's tensor; its padding (zero weights and gradients) shares the last real
// block without changing its absmax and stays 0.
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

// bitsandbytes.optim.AdamW8bit's arguments (lr is Step()'s).
struct AdamW8bitOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;     // where ParamInfo::weight_decay (bitsandbytes' default: 1e-2)
  int64_t min_8bit_size = 4096;  // smaller tensors keep fp32 moments
  // Per parameter when not empty (ZeRO-1's slices keep their whole tensor's choice): whether it
  // keeps 8-bit moments (a slice must then start on a block of its tensor); empty: the size rule.
  std::vector<bool> quantized;
};

class AdamW8bitOptimizer {
 public:
  // INVALID_ARGUMENT for betas outside [0, 1), eps <= 0 or negative weight decay; INTERNAL when a
  // parameter lies outside the flat buffer of `num_params` floats; RESOURCE_EXHAUSTED when the
  // state does not fit the arena.
  static Result<std::unique_ptr<AdamW8bitOptimizer>> Create(const std::vector<ParamInfo>& params,
                                                            int64_t num_params,
                                                            const AdamW8bitOptions& options,
                                                            DeviceArena* arena);
  // The bytes Create() allocates (see the header comment).
  static int64_t PlanBytes(const std::vector<ParamInfo>& params, const AdamW8bitOptions& options);

  ~AdamW8bitOptimizer();
  AdamW8bitOptimizer(const AdamW8bitOptimizer&) = delete;
  AdamW8bitOptimizer& operator=(const AdamW8bitOptimizer&) = delete;

  // One step at rate `lr` with gradient grad_scale * grads; increments step() first (bias
  // corrections 1 - beta^step from 1, computed in double as AdamWOptimizer does).
  void Step(float* params, const float* grads, double lr, float grad_scale);
  int64_t step() const { return step_; }

  // The step with its scalars in device memory (capturable; AdamWOptimizer's protocol for the
  // StepRunner): FillNextStep writes the bias corrections of step() + 1 into a host StepScalars
  // the caller copies to the device; IssueStep issues the update reading lr, the bias corrections
  // and the gradient multiplier from `device_scalars` (nothing when s->skip_nonfinite and grad_sq
  // is not finite); CountStep counts the step once it is known to have been applied.
  void FillNextStep(StepScalars* s) const;
  void IssueStep(float* params, const float* grads, const StepScalars* device_scalars);
  void CountStep() { ++step_; }

  // Per parameter: 8-bit tensors "<hf_name>.exp_avg" and ".exp_avg_sq" (U8 codes, the parameter's
  // shape) with ".exp_avg_absmax" / ".exp_avg_sq_absmax" (F32, one per block); fp32 tensors
  // ".exp_avg" / ".exp_avg_sq" (F32). Metadata {"format": "traind-adamw8bit-v1", "step": N}.
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
  struct Slot {
    bool quantized;
    bool decay;
    int64_t off;    // quantized: into the code buffers; else into the fp32 buffers
    int64_t block;  // quantized: first absmax index
  };
  // One update call per parameter; `s` (device scalars) or null for the arguments as given.
  void Issue(float* params, const float* grads, float lr, float bc1, float bc2, float grad_scale,
             const StepScalars* s);
  AdamW8bitOptimizer(std::vector<ParamInfo> params, const AdamW8bitOptions& options,
                     DeviceArena* arena)
      : params_(std::move(params)), options_(options), arena_(arena) {}

  std::vector<ParamInfo> params_;
  std::vector<Slot> slots_;
  AdamW8bitOptions options_;
  DeviceArena* arena_;
  int64_t n8_ = 0, blocks_ = 0, n32_ = 0;
  uint8_t* codes_ = nullptr;  // device: m codes [0, n8), v codes [n8, 2 n8)
  float* absmax_ = nullptr;   // device: m [0, blocks), v [blocks, 2 blocks)
  float* f32_ = nullptr;      // device: m [0, n32), v [n32, 2 n32)
  float* tables_ = nullptr;   // device: signed map [0, 256), unsigned [256, 512)
  int64_t step_ = 0;
};

}  // namespace traind::engine
