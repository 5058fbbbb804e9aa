// Learning-rate schedules: the HF formulas, in double precision as Python evaluates them.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace traind::engine {

Result<LrScheduleType> ParseLrScheduleType(const std::string& name) {
  if (name == "constant") return LrScheduleType::kConstant;
  if (name == "linear") return LrScheduleType::kLinear;
  if (name == "cosine") return LrScheduleType::kCosine;
  return Status::InvalidArgument("training.lr_scheduler_type: '" + name +
                                 "' is not one of constant, linear, cosine");
}

double LrLambda(LrScheduleType type, int64_t warmup_steps, int64_t total_steps, int64_t step) {
  if (step < warmup_steps) {
    return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  }
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  switch (type) {
    case LrScheduleType::kConstant:
      return 1.0;
    case LrScheduleType::kLinear:
      return std::max(0.0, static_cast<double>(total_steps - step) / decay_steps);
    case LrScheduleType::kCosine: {
      const double progress = static_cast<double>(step - warmup_steps) / decay_steps;
      // HF: 0.5 * (1 + cos(pi * num_cycles * 2 * progress)) with num_cycles = 0.5.
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress)));
    }
  }
  return 1.0;
}

}  // namespace traind::engine
