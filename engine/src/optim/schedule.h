// Learning-rate schedules with linear warmup, exactly as Hugging Face's
// get_constant_schedule_with_warmup / get_linear_schedule_with_warmup /
// get_cosine_schedule_with_warmup (num_cycles 0.5): the rate of optimizer step s (0-based) is
// base_lr * LrLambda(s).
#pragma once

#include <cstdint>
#include <string>

#include "traind/engine/status.h"

namespace traind::engine {

enum class LrScheduleType { kConstant, kLinear, kCosine };

// "constant" | "linear" | "cosine"; INVALID_ARGUMENT naming training.lr_scheduler_type otherwise.
Result<LrScheduleType> ParseLrScheduleType(const std::string& name);

// The multiplier of the base rate at 0-based optimizer step `step` of `total_steps`:
//   step < warmup:  step / max(1, warmup)
//   constant:       1
//   linear:         max(0, (total - step) / max(1, total - warmup))
//   cosine:         max(0, 0.5 * (1 + cos(pi * progress))), progress = (step - warmup) / max(1, total - warmup)
double LrLambda(LrScheduleType type, int64_t warmup_steps, int64_t total_steps, int64_t step);

}  // namespace traind::engine
