// JSON views of traind.v1 messages shared by trainctl (`-o json`, CLI.md's shapes) and traind's web
// page (server/http), so both print the same keys: plans, tokenization progress and job events.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "traind/v1/job_service.pb.h"

namespace traind::v1 {

// A number, or null for NaN and infinities (which have no JSON form).
nlohmann::json JsonNumber(double v);
// "2026-11-23T01:02:03Z" (UTC) for milliseconds since the epoch; "-" for 0 (not yet).
std::string UtcTime(int64_t unix_ms);

// CLI.md's plan object: micro_batch, gradient_accumulation_steps, bytes{weights, gradients,
// optimizer, activations, temporary, total}, plus checkpointing, precision, optimizer, parameter
// counts, budget and the planner's reason.
nlohmann::json PlanJson(const Plan& plan);
nlohmann::json TokenizeJson(const TokenizeEvent& t);
// One event: sequence, time (UTC text) and time_ms, type ("state", "step", "log", "eval",
// "checkpoint", "message", "plan", "tokenize") and that kind's fields.
nlohmann::json EventJson(const JobEvent& ev);

}  // namespace traind::v1
