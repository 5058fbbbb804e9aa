// LossScaler: torch's _amp_update_scale_ rule on the host (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <cmath>
#include <limits>

namespace traind::engine {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale) {}

bool LossScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return true;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    // As torch: the scale lives in an fp32 tensor and only grows while it stays finite there.
    if (grown <= static_cast<double>(std::numeric_limits<float>::max())) scale_ = grown;
    growth_tracker_ = 0;
  }
  return false;
}

void LossScaler::Restore(const LossScalerState& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  skipped_ = s.skipped_steps;
}

bool LossScaler::IsValid(const LossScalerState& s) {
  return std::isfinite(s.scale) && s.scale > 0.0 &&
         s.scale <= static_cast<double>(std::numeric_limits<float>::max()) &&
         s.growth_tracker >= 0 && s.skipped_steps >= 0;
}

}  // namespace traind::engine
