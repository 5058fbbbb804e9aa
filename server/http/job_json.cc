// JSON views of jobs and events for the web page (see job_json.h).
#include "http/job_json.h"

#include "job_state.h"

#include <algorithm>
#include <cmath>

namespace traind::server::http {

namespace {

// NaN and infinities have no JSON form: null.
nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

JobStats ComputeStats(const v1::Job& job, const std::vector<v1::JobEvent>& recent, double peak_flops) {
  JobStats st;
  double secs = 0, flops_per_s = 0;
  int n = 0;
  for (auto it = recent.rbegin(); it != recent.rend(); ++it) {
    if (it->has_log() && st.tokens_per_second == 0) st.tokens_per_second = it->log().tokens_per_second();
    if (it->has_step()) {
      const auto& s = it->step();
      if (st.memory_peak_bytes == 0) st.memory_peak_bytes = s.memory_peak_bytes();
      if (n < 20 && s.step_seconds() > 0) {
        secs += s.step_seconds();
        flops_per_s += s.model_flops() / s.step_seconds();
        ++n;
      }
    }
  }
  if (n > 0) {
    st.seconds_per_step = secs / n;
    if (peak_flops > 0) st.mfu = flops_per_s / n / peak_flops;
  }
  if (job.has_summary()) {
    if (job.summary().train_tokens_per_second() > 0) st.tokens_per_second = job.summary().train_tokens_per_second();
    if (job.summary().peak_memory_bytes() > 0) st.memory_peak_bytes = job.summary().peak_memory_bytes();
  }
  if (job.state() == v1::JOB_STATE_RUNNING && st.seconds_per_step > 0 && job.max_steps() > 0)
    st.eta_seconds = static_cast<double>(std::max<int64_t>(0, job.max_steps() - job.step())) * st.seconds_per_step;
  return st;
}

nlohmann::json PlanJson(const v1::Plan& p) {
  const auto& b = p.bytes();
  return {{"micro_batch", p.micro_batch()},
          {"gradient_accumulation_steps", p.gradient_accumulation_steps()},
          {"gradient_checkpointing", p.gradient_checkpointing()},
          {"precision", p.precision()},
          {"optimizer", p.optimizer()},
          {"budget_bytes", p.budget_bytes()},
          {"reason", p.reason()},
          {"trainable_params", p.trainable_params()},
          {"total_params", p.total_params()},
          {"bytes", {{"weights", b.weights()}, {"gradients", b.gradients()}, {"optimizer", b.optimizer()},
                     {"activations", b.activations()}, {"temporary", b.temporary()}, {"total", b.total()}}}};
}

nlohmann::json JobRowJson(const v1::Job& job, const JobStats& st) {
  nlohmann::json j = {
      {"id", job.id()}, {"name", job.name()}, {"owner", job.owner()}, {"state", v1::JobStateName(job.state())},
      {"step", job.step()}, {"max_steps", job.max_steps()}, {"priority", job.priority()},
      {"attempts", job.attempts()}, {"error", job.error()}, {"output_dir", job.output_dir()},
      {"created_unix_ms", job.created_unix_ms()}, {"started_unix_ms", job.started_unix_ms()},
      {"finished_unix_ms", job.finished_unix_ms()}, {"last_sequence", job.last_sequence()},
      {"loss", Num(job.last_loss())},
      {"tokens_per_second", Num(st.tokens_per_second)}, {"seconds_per_step", Num(st.seconds_per_step)},
      {"mfu", Num(st.mfu)}, {"eta_seconds", st.eta_seconds >= 0 ? Num(st.eta_seconds) : nlohmann::json(nullptr)},
      {"memory_peak_bytes", st.memory_peak_bytes}};
  if (job.has_summary()) {
    j["loss"] = Num(job.summary().train_loss());
    j["eval_loss"] = Num(job.summary().eval_loss());
  }
  return j;
}

nlohmann::json JobDetailJson(const v1::Job& job, const JobStats& st) {
  nlohmann::json j = JobRowJson(job, st);
  j["spec_yaml"] = job.spec_yaml();
  j["spec_json"] = job.spec_json();
  j["base_dir"] = job.base_dir();
  j["plan"] = job.has_plan() ? PlanJson(job.plan()) : nlohmann::json(nullptr);
  if (job.has_summary()) {
    const auto& s = job.summary();
    j["summary"] = {{"global_step", s.global_step()}, {"train_loss", Num(s.train_loss())},
                    {"eval_loss", Num(s.eval_loss())}, {"train_runtime", Num(s.train_runtime())},
                    {"train_samples_per_second", Num(s.train_samples_per_second())},
                    {"train_tokens_per_second", Num(s.train_tokens_per_second())},
                    {"peak_memory_bytes", s.peak_memory_bytes()}, {"output_dir", s.output_dir()}};
  } else {
    j["summary"] = nullptr;
  }
  return j;
}

nlohmann::json EventJson(const v1::JobEvent& ev) {
  nlohmann::json j = {{"seq", ev.sequence()}, {"time_ms", ev.time_unix_ms()}};
  switch (ev.kind_case()) {
    case v1::JobEvent::kStep: {
      const auto& s = ev.step();
      j["kind"] = "step";
      j.update({{"step", s.step()}, {"max_steps", s.max_steps()}, {"loss", Num(s.loss())},
                {"learning_rate", Num(s.learning_rate())}, {"grad_norm", Num(s.grad_norm())},
                {"step_seconds", Num(s.step_seconds())}, {"tokens", s.tokens()}, {"skipped", s.skipped()},
                {"memory_used_bytes", s.memory_used_bytes()}, {"memory_peak_bytes", s.memory_peak_bytes()},
                {"model_flops", Num(s.model_flops())}});
      break;
    }
    case v1::JobEvent::kLog: {
      const auto& l = ev.log();
      j["kind"] = "log";
      j.update({{"step", l.step()}, {"loss", Num(l.loss())}, {"learning_rate", Num(l.learning_rate())},
                {"grad_norm", Num(l.grad_norm())}, {"tokens_per_second", Num(l.tokens_per_second())},
                {"samples_per_second", Num(l.samples_per_second())}});
      break;
    }
    case v1::JobEvent::kEval:
      j["kind"] = "eval";
      j.update({{"step", ev.eval().step()}, {"eval_loss", Num(ev.eval().eval_loss())}});
      break;
    case v1::JobEvent::kCheckpoint:
      j["kind"] = "checkpoint";
      j.update({{"step", ev.checkpoint().step()}, {"dir", ev.checkpoint().dir()}});
      break;
    case v1::JobEvent::kState:
      j["kind"] = "state";
      j.update({{"state", v1::JobStateName(ev.state().state())}, {"error", ev.state().error()},
                {"attempt", ev.state().attempt()}, {"reason", ev.state().reason()}});
      break;
    case v1::JobEvent::kMessage:
      j["kind"] = "message";
      j["text"] = ev.message();
      break;
    case v1::JobEvent::kPlan:
      j["kind"] = "plan";
      j["plan"] = PlanJson(ev.plan());
      break;
    case v1::JobEvent::kTokenize: {
      const auto& t = ev.tokenize();
      j["kind"] = "tokenize";
      j.update({{"file", t.file()}, {"bytes_done", t.bytes_done()}, {"bytes_total", t.bytes_total()},
                {"tokens", t.tokens()}, {"cache_hit", t.cache_hit()}, {"done", t.done()}});
      break;
    }
    default:
      j["kind"] = "unknown";
  }
  return j;
}

}  // namespace traind::server::http
