// Dynamic loss scaling for fp16 mixed precision, with the semantics of torch.cuda.amp.GradScaler
// (which the HF Trainer uses for fp16): the loss gradient is multiplied by scale() (Forward's
// grad_scale), the optimizer step unscales (AdamW's grad_scale = clip / scale()), and a step
// whose gradients hold an inf or NaN is skipped and halves the scale; after growth_interval
// consecutive clean steps the scale doubles.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine {

// The scaler's mutable state, as saved in trainer checkpoints (docs/checkpoint-format.md).
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // clean steps since the last change
  int64_t skipped_steps = 0;   // steps skipped so far
};

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps before the scale grows
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  // The current scale (what Forward's grad_scale is multiplied by).
  float scale() const { return static_cast<float>(scale_); }

  // True when some of the n (scaled) gradients is inf or NaN (Backend::HasNonFinite; synchronizes).
  static bool FoundInf(Backend* backend, const float* grads, int64_t n) {
    return backend->HasNonFinite(grads, n);
  }

  // Ends a step. found_inf: the step must be skipped; the scale is multiplied by backoff_factor
  // and the clean-step count restarts. Otherwise the clean-step count grows, and at
  // growth_interval the scale is multiplied by growth_factor (unless that is not finite in fp32)
  // and the count restarts. Returns found_inf (true = skip the optimizer step).
  bool Update(bool found_inf);

  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps since the last change
  int64_t skipped_steps() const { return skipped_; }          // steps skipped so far

  // Snapshot and restore (resume): after Restore(state()) the scaler behaves exactly as before.
  // Restore expects a state that IsValid accepts.
  LossScalerState state() const { return {scale_, growth_tracker_, skipped_}; }
  void Restore(const LossScalerState& s);
  // scale finite and > 0 (and finite in fp32), counters >= 0.
  static bool IsValid(const LossScalerState& s);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace traind::engine
