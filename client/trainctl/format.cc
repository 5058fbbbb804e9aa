// trainctl output formats (see format.h).
#include "format.h"
#include "job_state.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace traind::trainctl {
namespace {

using v1::JsonNumber;
using v1::TokenizeJson;

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string Pad(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }
std::string PadLeft(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

std::string Time(int64_t ms) { return v1::UtcTime(ms); }

}  // namespace

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string HumanDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// "tokenizing F: 45% (0.5 MiB of 1.1 MiB, 12.0 MiB/s)", "tokenized F: 1.1 MiB -> 338025 tokens in
// 0.05 s (22.1 MiB/s)", "tokens of F from the cache (338025 tokens)".
// A sample on one line: the prompt and the continuation, quoted, newlines and tabs escaped; the
// ids when there is no text (format: tokens).
std::string SampleText(const v1::SampleEvent& s) {
  if (s.prompt().empty() && s.text().empty()) {
    std::string ids = "ids";
    for (int32_t id : s.ids()) {
      ids.push_back(' ');
      ids += std::to_string(id);
    }
    return ids;
  }
  std::string out = "\"";
  for (const std::string* part : {&s.prompt(), &s.text()}) {
    for (char ch : *part) {
      if (ch == '\n') {
        out += "\\n";
      } else if (ch == '\t') {
        out += "\\t";
      } else if (ch == '"') {
        out += "\\\"";
      } else {
        out.push_back(ch);
      }
    }
  }
  out.push_back('"');
  return out;
}

std::string TokenizeText(const v1::TokenizeEvent& t) {
  if (t.cache_hit()) return "tokens of " + t.file() + " from the cache (" + std::to_string(t.tokens()) + " tokens)";
  const double mib = t.seconds() > 0 ? static_cast<double>(t.bytes_done()) / t.seconds() / (1 << 20) : 0;
  if (t.done()) {
    return "tokenized " + t.file() + ": " + HumanBytes(t.bytes_total()) + " -> " + std::to_string(t.tokens()) +
           " tokens in " + Fmt("%.2f", t.seconds()) + " s" + (mib > 0 ? " (" + Fmt("%.1f", mib) + " MiB/s)" : "");
  }
  const double pct = t.bytes_total() > 0 ? 100.0 * static_cast<double>(t.bytes_done()) / static_cast<double>(t.bytes_total()) : 0;
  return "tokenizing " + t.file() + ": " + Fmt("%.0f", pct) + "% (" + HumanBytes(t.bytes_done()) + " of " +
         HumanBytes(t.bytes_total()) + (mib > 0 ? ", " + Fmt("%.1f", mib) + " MiB/s" : "") + ")";
}

nlohmann::json JobJson(const v1::Job& j) {
  nlohmann::json metrics = {{"train_loss", nullptr}, {"eval_loss", nullptr}, {"train_runtime", nullptr},
                            {"train_samples_per_second", nullptr}, {"train_tokens_per_second", nullptr},
                            {"peak_memory_bytes", nullptr}};
  if (j.has_summary()) {
    const auto& s = j.summary();
    metrics = {{"train_loss", JsonNumber(s.train_loss())}, {"eval_loss", JsonNumber(s.eval_loss())},
               {"train_runtime", JsonNumber(s.train_runtime())},
               {"train_samples_per_second", JsonNumber(s.train_samples_per_second())},
               {"train_tokens_per_second", JsonNumber(s.train_tokens_per_second())},
               {"peak_memory_bytes", s.peak_memory_bytes()}};
    // Sequence classification (bert): an extension of CLI.md's metrics.
    if (s.has_eval_accuracy()) metrics["eval_accuracy"] = JsonNumber(s.eval_accuracy());
  }
  return {{"id", j.id()},
          {"name", j.name()},
          {"state", v1::JobStateName(j.state())},
          {"step", j.step()},
          {"max_steps", j.max_steps()},
          {"error", j.error()},
          {"output_dir", j.output_dir()},
          {"owner", j.owner()},
          {"priority", j.priority()},
          {"attempts", j.attempts()},
          // Preemptions (SIGTERM): how many, and the step of the newest preemption checkpoint.
          {"interruptions", j.interruptions()},
          {"interrupted_step", j.interrupted_step()},
          {"created_at", Time(j.created_unix_ms())},
          {"started_at", Time(j.started_unix_ms())},
          {"finished_at", Time(j.finished_unix_ms())},
          {"metrics", metrics},
          {"trainable_params", j.plan().trainable_params()},
          {"total_params", j.plan().total_params()},
          {"plan", PlanJson(j.plan())},
          // training.offload I/O so far (null without offload or before the first step).
          {"offload", j.has_offload() ? nlohmann::json{{"read_bytes", j.offload().read_bytes()},
                                                       {"written_bytes", j.offload().written_bytes()},
                                                       {"io_seconds", JsonNumber(j.offload().io_seconds())},
                                                       {"background_io_seconds",
                                                        JsonNumber(j.offload().background_io_seconds())},
                                                       {"store_bytes", j.offload().store_bytes()}}
                                      : nlohmann::json(nullptr)},
          // Tokenization of the training data (null until it started): tokenizing is true while
          // the running job encodes its data into the token cache.
          {"tokenize", j.has_tokenize() ? TokenizeJson(j.tokenize()) : nlohmann::json(nullptr)},
          {"tokenizing", j.state() == v1::JOB_STATE_RUNNING && j.has_tokenize() && !j.tokenize().done()},
          // Data parallel (trainctl submit --hosts): this job's rank of the run; null for a plain job.
          // comm_seconds / comm_bytes: this rank's collectives so far (time not hidden by
          // compute, bytes sent).
          {"distributed", j.world_size() > 1 ? nlohmann::json{{"world_size", j.world_size()},
                                                              {"rank", j.rank()},
                                                              {"run_id", j.run_id()},
                                                              {"comm_seconds", JsonNumber(j.comm().seconds())},
                                                              {"comm_bytes", j.comm().bytes()},
                                                              {"comm_hidden_seconds", JsonNumber(j.comm().hidden_seconds())}}
                                             : nlohmann::json(nullptr)}};
}

namespace {

// "trainable 294912 of 124734720 total (0.24%)" (status and estimate; plans from daemons that
// count parameters).
std::string ParamsText(const v1::Plan& p) {
  return "trainable " + std::to_string(p.trainable_params()) + " of " + std::to_string(p.total_params()) +
         " total" + Fmt(" (%.2f%%)", 100.0 * static_cast<double>(p.trainable_params()) /
                                        static_cast<double>(p.total_params()));
}

}  // namespace

std::string StatusText(const v1::Job& j) {
  std::ostringstream o;
  auto row = [&](const std::string& k, const std::string& v) { o << Pad(k + ":", 26) << v << "\n"; };
  row("id", j.id());
  row("name", j.name());
  row("state", v1::JobStateName(j.state()));
  row("step", std::to_string(j.step()) + "/" + std::to_string(j.max_steps()));
  if (!j.error().empty()) row("error", j.error());
  row("output_dir", j.output_dir());
  if (j.world_size() > 1) {
    row("distributed", "rank " + std::to_string(j.rank()) + " of " + std::to_string(j.world_size()) +
                           (j.run_id().empty() ? std::string() : " (run " + j.run_id() + ")") +
                           (j.rank() == 0 ? "; writes output_dir" : "; rank 0 writes output_dir"));
    if (j.has_comm()) {
      const double hidden = j.comm().hidden_seconds(), total = j.comm().seconds() + hidden;
      row("communication", Fmt("%.2f s", j.comm().seconds()) + " in collectives not hidden by compute, " +
                               Fmt("%.2f s", hidden) + " hidden behind backward" +
                               (total > 0 ? Fmt(" (%.0f%%)", 100.0 * hidden / total) : std::string()) + ", " +
                               HumanBytes(j.comm().bytes()) + " sent by this rank");
    }
  }
  row("attempts", std::to_string(j.attempts()));
  if (j.interruptions() > 0) {
    const int64_t at = j.interrupted_step();
    row("interrupted", std::to_string(j.interruptions()) + (j.interruptions() == 1 ? " time" : " times") +
                           " by SIGTERM, last " +
                           (at > 0 ? "at step " + std::to_string(at) + " (resumes from checkpoint-" +
                                         std::to_string(at) + ")"
                                   : std::string("before its first step (starts again)")));
  }
  row("created", Time(j.created_unix_ms()));
  if (j.has_summary()) {
    const auto& s = j.summary();
    row("train_loss", Fmt("%.4f", s.train_loss()));
    row("eval_loss", Fmt("%.4f", s.eval_loss()));
    if (s.has_eval_accuracy()) row("eval_accuracy", Fmt("%.4f", s.eval_accuracy()));
    row("train_runtime", Fmt("%.1f s", s.train_runtime()));
    row("train_tokens_per_second", Fmt("%.0f", s.train_tokens_per_second()));
    row("peak_memory", HumanBytes(s.peak_memory_bytes()));
  } else if (j.step() > 0) {
    row("loss", Fmt("%.4f", j.last_loss()));
  }
  if (j.has_tokenize()) {
    row("phase", j.state() == v1::JOB_STATE_RUNNING && !j.tokenize().done() ? "tokenizing" :
                 j.state() == v1::JOB_STATE_RUNNING ? "training" : "-");
    row("tokenize", TokenizeText(j.tokenize()));
  }
  row("plan", "micro_batch " + std::to_string(j.plan().micro_batch()) + " x " +
                  std::to_string(j.plan().gradient_accumulation_steps()) + " accumulation, " +
                  HumanBytes(j.plan().bytes().total()));
  if (!j.plan().offload().empty() && j.plan().offload() != "none") {
    row("offload", j.plan().offload() + ": " + HumanBytes(j.plan().offload_state_bytes()) +
                       " optimizer state" +
                       (j.plan().offload_master_bytes() > 0
                            ? " and " + HumanBytes(j.plan().offload_master_bytes()) + " fp32 master weights"
                            : std::string()) +
                       " off the device, " +
                       (j.plan().bytes().optimizer() > 0 ? HumanBytes(j.plan().bytes().optimizer()) + " window on it"
                                                         : std::string("updated on the host")));
    if (j.has_offload()) {
      row("offload_io", "read " + HumanBytes(j.offload().read_bytes()) + ", written " +
                            HumanBytes(j.offload().written_bytes()) + ", waited " +
                            Fmt("%.2f s", j.offload().io_seconds()) + " (behind compute " +
                            Fmt("%.2f s", j.offload().background_io_seconds()) + "), store " +
                            HumanBytes(j.offload().store_bytes()));
    }
  }
  if (j.plan().total_params() > 0) row("parameters", ParamsText(j.plan()));
  return o.str();
}

std::string ListText(const std::vector<v1::Job>& jobs) {
  std::ostringstream o;
  o << Pad("ID", 12) << Pad("NAME", 22) << Pad("STATE", 11) << PadLeft("STEP", 13) << PadLeft("LOSS", 9) << "  CREATED\n";
  for (const auto& j : jobs) {
    const double loss = j.has_summary() ? j.summary().train_loss() : j.last_loss();
    o << Pad(j.id(), 12) << Pad(j.name().substr(0, 21), 22) << Pad(v1::JobStateName(j.state()), 11)
      << PadLeft(std::to_string(j.step()) + "/" + std::to_string(j.max_steps()), 13)
      << PadLeft(j.step() > 0 ? Fmt("%.4f", loss) : "-", 9) << "  " << Time(j.created_unix_ms()) << "\n";
  }
  return o.str();
}

bool EstimateFits(const v1::EstimateJobResponse& r) { return !r.has_fits() || r.fits(); }

nlohmann::json EstimateJson(const v1::EstimateJobResponse& r) {
  nlohmann::json levers = nlohmann::json::array();
  for (const v1::PlanLever& l : r.levers()) {
    levers.push_back({{"change", l.change()}, {"bytes", l.bytes()}, {"fits", l.fits()}});
  }
  return {{"plan", PlanJson(r.plan())}, {"reason", r.reason()}, {"fits", EstimateFits(r)}, {"levers", levers}};
}

std::string EstimateText(const v1::EstimateJobResponse& r) {
  const auto& p = r.plan();
  const auto& b = p.bytes();
  std::ostringstream o;
  auto row = [&](const std::string& k, int64_t v) {
    o << Pad(k, 14) << PadLeft(HumanBytes(v), 12) << PadLeft(std::to_string(v), 16) << "\n";
  };
  o << Pad("category", 14) << PadLeft("size", 12) << PadLeft("bytes", 16) << "\n";
  row("weights", b.weights());
  if (p.quantized_base_bytes() > 0) row("  4-bit base", p.quantized_base_bytes());
  row("gradients", b.gradients());
  row("optimizer", b.optimizer());
  row("activations", b.activations());
  row("temporary", b.temporary());
  row("total", b.total());
  if (p.budget_bytes() > 0) row("budget", p.budget_bytes());
  o << "\nmicro_batch " << p.micro_batch() << ", gradient_accumulation_steps " << p.gradient_accumulation_steps()
    << ", gradient_checkpointing " << (p.gradient_checkpointing() ? "on" : "off") << ", precision "
    << (p.precision().empty() ? "fp32" : p.precision()) << ", optimizer "
    << (p.optimizer().empty() ? "adamw" : p.optimizer()) << "\n";
  if (p.total_params() > 0) o << "parameters: " << ParamsText(p) << "\n";
  if (!p.offload().empty() && p.offload() != "none") {
    o << "offload " << p.offload() << ": optimizer state " << HumanBytes(p.offload_state_bytes());
    if (p.offload_master_bytes() > 0) {
      o << " and fp32 master weights " << HumanBytes(p.offload_master_bytes());
    }
    o << " off the device ("
      << (p.bytes().optimizer() > 0 ? "optimizer row: the window of one group on it"
                                    : "updated on the host: no optimizer bytes on the device")
      << ")\n";
  }
  if (EstimateFits(r)) {
    if (!r.reason().empty()) o << "reason: " << r.reason() << "\n";
    return o.str();
  }
  o << "\ndoes not fit: " << r.reason() << "\n";
  if (r.levers_size() > 0) {
    size_t w = std::string("change").size();
    for (const v1::PlanLever& l : r.levers()) w = std::max(w, l.change().size());
    o << "\n" << Pad("change", w + 2) << PadLeft("size", 12) << PadLeft("bytes", 16) << "\n";
    for (const v1::PlanLever& l : r.levers()) {
      o << Pad(l.change(), w + 2) << PadLeft(HumanBytes(l.bytes()), 12) << PadLeft(std::to_string(l.bytes()), 16)
        << (l.fits() ? "  fits" : "  does not fit") << "\n";
    }
  }
  return o.str();
}

std::string EventText(const v1::JobEvent& ev) {
  std::string t = Time(ev.time_unix_ms()) + "  ";
  switch (ev.kind_case()) {
    case v1::JobEvent::kState: {
      const auto& s = ev.state();
      t += std::string("state ") + v1::JobStateName(s.state());
      if (!s.reason().empty()) t += " (" + s.reason() + ")";
      if (!s.error().empty()) t += ": " + s.error();
      return t;
    }
    case v1::JobEvent::kStep: {
      const auto& s = ev.step();
      t += "step " + std::to_string(s.step()) + "/" + std::to_string(s.max_steps()) + "  loss " + Fmt("%.4f", s.loss()) +
           "  lr " + Fmt("%.3g", s.learning_rate()) + "  grad_norm " + Fmt("%.3f", s.grad_norm());
      if (s.step_seconds() > 0) t += "  " + Fmt("%.0f", static_cast<double>(s.tokens()) / s.step_seconds()) + " tokens/s";
      return t;
    }
    case v1::JobEvent::kLog: {
      const auto& l = ev.log();
      return t + "log step " + std::to_string(l.step()) + "  loss " + Fmt("%.4f", l.loss()) + "  lr " +
             Fmt("%.3g", l.learning_rate()) + "  grad_norm " + Fmt("%.3f", l.grad_norm()) + "  " +
             Fmt("%.0f", l.tokens_per_second()) + " tokens/s";
    }
    case v1::JobEvent::kEval:
      return t + "eval step " + std::to_string(ev.eval().step()) + "  eval_loss " +
             Fmt("%.4f", ev.eval().eval_loss()) +
             (ev.eval().has_eval_accuracy() ? "  eval_accuracy " + Fmt("%.4f", ev.eval().eval_accuracy())
                                            : std::string());
    case v1::JobEvent::kCheckpoint:
      return t + "checkpoint step " + std::to_string(ev.checkpoint().step()) + " -> " + ev.checkpoint().dir();
    case v1::JobEvent::kSample:
      return t + "sample step " + std::to_string(ev.sample().step()) + ": " + SampleText(ev.sample());
    case v1::JobEvent::kMessage:
      return t + ev.message();
    case v1::JobEvent::kTokenize:
      return t + TokenizeText(ev.tokenize());
    case v1::JobEvent::kPlan:
      return t + "plan micro_batch " + std::to_string(ev.plan().micro_batch()) + " x " +
             std::to_string(ev.plan().gradient_accumulation_steps()) + ", " + HumanBytes(ev.plan().bytes().total()) +
             (ev.plan().reason().empty() ? "" : " (" + ev.plan().reason() + ")");
    default:
      return t + "(unknown event)";
  }
}

void Progress::Update(const v1::StepEvent& s) {
  step = s.step();
  max_steps = s.max_steps();
  loss = s.loss();
  if (s.step_seconds() > 0) {
    seconds_per_step = seconds_per_step == 0 ? s.step_seconds() : 0.8 * seconds_per_step + 0.2 * s.step_seconds();
    tokens_per_second = static_cast<double>(s.tokens()) / seconds_per_step;
  }
}

std::string Progress::Line(int width) const {
  const double frac = max_steps > 0 ? static_cast<double>(step) / static_cast<double>(max_steps) : 0;
  const int filled = static_cast<int>(frac * width);
  std::string bar;
  bar.reserve(static_cast<size_t>(width) + 2);
  bar.push_back('[');
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '-');
  bar.push_back(']');
  const double eta = seconds_per_step * static_cast<double>(max_steps - step);
  return bar + "  " + std::to_string(step) + "/" + std::to_string(max_steps) + "  " + Fmt("%3.0f%%", frac * 100) +
         "  loss " + Fmt("%.4f", loss) + "  " + Fmt("%.0f", tokens_per_second) + " tok/s  ETA " + HumanDuration(eta);
}

}  // namespace traind::trainctl
