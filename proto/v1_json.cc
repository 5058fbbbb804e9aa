// JSON views of traind.v1 messages (see v1_json.h).
#include "v1_json.h"

#include <cmath>
#include <ctime>

#include "job_state.h"

namespace traind::v1 {

nlohmann::json JsonNumber(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

std::string UtcTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json PlanJson(const Plan& p) {
  const auto& b = p.bytes();
  return {{"micro_batch", p.micro_batch()},
          {"gradient_accumulation_steps", p.gradient_accumulation_steps()},
          {"gradient_checkpointing", p.gradient_checkpointing()},
          {"precision", p.precision()},
          {"optimizer", p.optimizer().empty() ? "adamw" : p.optimizer()},
          {"trainable_params", p.trainable_params()},
          {"total_params", p.total_params()},
          {"offload", p.offload().empty() ? "none" : p.offload()},
          {"offload_state_bytes", p.offload_state_bytes()},
          {"offload_master_bytes", p.offload_master_bytes()},
          {"quantized_base_bytes", p.quantized_base_bytes()},
          {"budget_bytes", p.budget_bytes()},
          {"reason", p.reason()},
          {"bytes", {{"weights", b.weights()}, {"gradients", b.gradients()}, {"optimizer", b.optimizer()},
                     {"activations", b.activations()}, {"temporary", b.temporary()}, {"total", b.total()}}}};
}

nlohmann::json TokenizeJson(const TokenizeEvent& t) {
  return {{"file", t.file()},           {"tokenizer", t.tokenizer()}, {"bytes_done", t.bytes_done()},
          {"bytes_total", t.bytes_total()}, {"tokens", t.tokens()},   {"seconds", JsonNumber(t.seconds())},
          {"cache_hit", t.cache_hit()}, {"done", t.done()}};
}

nlohmann::json EventJson(const JobEvent& ev) {
  nlohmann::json j = {{"sequence", ev.sequence()}, {"time", UtcTime(ev.time_unix_ms())},
                      {"time_ms", ev.time_unix_ms()}};
  switch (ev.kind_case()) {
    case JobEvent::kState:
      j["type"] = "state";
      j.update({{"state", JobStateName(ev.state().state())}, {"error", ev.state().error()},
                {"attempt", ev.state().attempt()}, {"reason", ev.state().reason()}});
      break;
    case JobEvent::kStep: {
      const auto& s = ev.step();
      j["type"] = "step";
      j.update({{"step", s.step()}, {"max_steps", s.max_steps()}, {"loss", JsonNumber(s.loss())},
                {"learning_rate", JsonNumber(s.learning_rate())}, {"grad_norm", JsonNumber(s.grad_norm())},
                {"step_seconds", JsonNumber(s.step_seconds())}, {"tokens", s.tokens()},
                {"samples", s.samples()}, {"skipped", s.skipped()},
                {"memory_used_bytes", s.memory_used_bytes()}, {"memory_peak_bytes", s.memory_peak_bytes()},
                {"model_flops", JsonNumber(s.model_flops())}});
      break;
    }
    case JobEvent::kLog: {
      const auto& l = ev.log();
      j["type"] = "log";
      j.update({{"step", l.step()}, {"loss", JsonNumber(l.loss())},
                {"learning_rate", JsonNumber(l.learning_rate())}, {"grad_norm", JsonNumber(l.grad_norm())},
                {"tokens_per_second", JsonNumber(l.tokens_per_second())},
                {"samples_per_second", JsonNumber(l.samples_per_second())}});
      break;
    }
    case JobEvent::kEval:
      j["type"] = "eval";
      j.update({{"step", ev.eval().step()}, {"eval_loss", JsonNumber(ev.eval().eval_loss())}});
      break;
    case JobEvent::kSample: {
      const auto& s = ev.sample();
      j["type"] = "sample";
      j.update({{"step", s.step()}, {"prompt", s.prompt()}, {"text", s.text()},
                {"prompt_ids", std::vector<int32_t>(s.prompt_ids().begin(), s.prompt_ids().end())},
                {"ids", std::vector<int32_t>(s.ids().begin(), s.ids().end())}});
      break;
    }
    case JobEvent::kCheckpoint:
      j["type"] = "checkpoint";
      j.update({{"step", ev.checkpoint().step()}, {"dir", ev.checkpoint().dir()}});
      break;
    case JobEvent::kMessage:
      j["type"] = "message";
      j["message"] = ev.message();
      break;
    case JobEvent::kPlan:
      j["type"] = "plan";
      j["plan"] = PlanJson(ev.plan());
      break;
    case JobEvent::kTokenize:
      j["type"] = "tokenize";
      j.update(TokenizeJson(ev.tokenize()));
      break;
    default:
      j["type"] = "unknown";
  }
  return j;
}

}  // namespace traind::v1
