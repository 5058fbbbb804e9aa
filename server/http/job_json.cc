// JSON views of jobs and events for the web page (see job_json.h).
#include "http/job_json.h"

#include "job_state.h"

#include <algorithm>
#include <cmath>

namespace traind::server::http {

using v1::JsonNumber;

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

nlohmann::json JobRowJson(const v1::Job& job, const JobStats& st) {
  nlohmann::json j = {
      {"id", job.id()}, {"name", job.name()}, {"owner", job.owner()}, {"state", v1::JobStateName(job.state())},
      {"step", job.step()}, {"max_steps", job.max_steps()}, {"priority", job.priority()},
      {"attempts", job.attempts()}, {"error", job.error()}, {"output_dir", job.output_dir()},
      {"created_unix_ms", job.created_unix_ms()}, {"started_unix_ms", job.started_unix_ms()},
      {"finished_unix_ms", job.finished_unix_ms()}, {"last_sequence", job.last_sequence()},
      {"loss", JsonNumber(job.last_loss())},
      {"tokens_per_second", JsonNumber(st.tokens_per_second)}, {"seconds_per_step", JsonNumber(st.seconds_per_step)},
      {"mfu", JsonNumber(st.mfu)}, {"eta_seconds", st.eta_seconds >= 0 ? JsonNumber(st.eta_seconds) : nlohmann::json(nullptr)},
      {"memory_peak_bytes", st.memory_peak_bytes}};
  if (job.has_summary()) {
    j["loss"] = JsonNumber(job.summary().train_loss());
    j["eval_loss"] = JsonNumber(job.summary().eval_loss());
    if (job.summary().has_eval_accuracy()) j["eval_accuracy"] = JsonNumber(job.summary().eval_accuracy());
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
    j["summary"] = {{"global_step", s.global_step()}, {"train_loss", JsonNumber(s.train_loss())},
                    {"eval_loss", JsonNumber(s.eval_loss())}, {"train_runtime", JsonNumber(s.train_runtime())},
                    {"train_samples_per_second", JsonNumber(s.train_samples_per_second())},
                    {"train_tokens_per_second", JsonNumber(s.train_tokens_per_second())},
                    {"peak_memory_bytes", s.peak_memory_bytes()}, {"output_dir", s.output_dir()}};
  } else {
    j["summary"] = nullptr;
  }
  return j;
}

}  // namespace traind::server::http
