// RunJobFileWithConsole (local_run.h): `traind run` and `traind-run`.
#include "traind/engine/local_run.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "traind/engine/job_spec.h"
#include "traind/engine/signal_thread.h"

namespace traind::engine {
namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_preempt{false};

// A sample on one console line: prompt and continuation quoted, newlines escaped (or the ids).
std::string SampleLine(const std::string& prompt, const std::string& text,
                       const std::vector<int32_t>& ids) {
  if (prompt.empty() && text.empty()) {
    std::string s = "ids";
    for (int32_t id : ids) {
      s.push_back(' ');
      s += std::to_string(id);
    }
    return s;
  }
  std::string s = "\"";
  for (const std::string* part : {&prompt, &text}) {
    for (char ch : *part) {
      if (ch == '\n') {
        s += "\\n";
      } else {
        s.push_back(ch);
      }
    }
  }
  s.push_back('"');
  return s;
}

// The first SIGINT/SIGTERM preempts (a checkpoint at the next step boundary, then exit); a second
// one cancels without waiting for it.
void OnSignal(int) {
  if (g_preempt.exchange(true)) g_cancel.store(true);
}

// The spec at `spec_path`, parsed (relative paths from the working directory, as trainctl does)
// and admitted as the daemon would: inputs there, the plan fits, output_dir free unless resuming.
// The error is printed; nullopt then.
std::optional<JobSpec> ReadAndAdmit(const std::string& spec_path, const RunOptions& options) {
  std::ifstream in(spec_path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", spec_path.c_str());
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string base = std::filesystem::current_path().string();
  Result<JobSpec> spec = ParseJobSpec(text.str(), base);
  Status admitted = spec.status();
  if (admitted.ok()) admitted = ValidateJobInputs(*spec);
  if (admitted.ok()) admitted = EstimateJob(*spec, options.device).status();
  if (admitted.ok() && !options.resume) admitted = CheckOutputDirFree(*spec);
  if (!admitted.ok()) {
    std::fprintf(stderr, "%s\n", admitted.ToString().c_str());
    return std::nullopt;
  }
  return std::move(spec).value();
}

// A tokenizing report on one console line.
void PrintTokenize(const TokenizeReport& t) {
  const double mib = static_cast<double>(t.bytes_done) / 1048576.0;
  if (t.cache_hit) {
    std::printf("tokens of %s from the cache (%lld tokens)\n", t.file.c_str(),
                static_cast<long long>(t.tokens));
  } else if (t.done) {
    std::printf("tokenized %s: %.1f MiB -> %lld tokens in %.2f s\n", t.file.c_str(), mib,
                static_cast<long long>(t.tokens), t.seconds);
  } else {
    std::printf("tokenizing %s: %.0f%% (%.1f of %.1f MiB)\n", t.file.c_str(),
                t.bytes_total > 0 ? 100.0 * static_cast<double>(t.bytes_done) /
                                        static_cast<double>(t.bytes_total) : 0.0,
                mib, static_cast<double>(t.bytes_total) / 1048576.0);
  }
  std::fflush(stdout);
}

// The console's callbacks: the plan, each logging window, evaluation, sample and checkpoint, the
// tokenizing progress and the notes, one line each.
RunCallbacks ConsoleCallbacks(int64_t max_steps) {
  RunCallbacks cb;
  cb.on_plan = [](const MemoryPlan& p) {
    std::printf("plan: micro_batch %lld x %lld accumulation, checkpointing %s, %.1f MiB (%s)\n",
                static_cast<long long>(p.micro_batch),
                static_cast<long long>(p.gradient_accumulation_steps),
                p.gradient_checkpointing ? "on" : "off", p.bytes.total() / 1048576.0,
                p.reason.c_str());
    std::fflush(stdout);
  };
  cb.on_log = [max_steps](const LogReport& r) {
    std::printf("step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s\n",
                static_cast<long long>(r.step), static_cast<long long>(max_steps), r.loss,
                r.learning_rate, r.grad_norm, r.tokens_per_second);
    std::fflush(stdout);
  };
  cb.on_eval = [](const EvalReport& r) {
    if (r.eval_accuracy.has_value()) {
      std::printf("step %lld  eval_loss %.4f  eval_accuracy %.4f\n", static_cast<long long>(r.step),
                  r.eval_loss, *r.eval_accuracy);
    } else {
      std::printf("step %lld  eval_loss %.4f\n", static_cast<long long>(r.step), r.eval_loss);
    }
    std::fflush(stdout);
  };
  cb.on_sample = [](const SampleReport& r) {
    std::printf("step %lld  sample: %s\n", static_cast<long long>(r.step),
                SampleLine(r.prompt, r.text, r.ids).c_str());
    std::fflush(stdout);
  };
  cb.on_checkpoint = [](int64_t, const std::string& dir) {
    std::printf("checkpoint %s\n", dir.c_str());
    std::fflush(stdout);
  };
  cb.on_tokenize = PrintTokenize;
  cb.on_message = [](const std::string& line) {
    std::printf("note: %s\n", line.c_str());
    std::fflush(stdout);
  };
  return cb;
}

// What the steps' reports add up to over the run: data parallel's collectives (this rank's) and
// what the offload store holds after the last step.
struct RunTotals {
  double comm_seconds = 0, comm_hidden = 0, step_seconds = 0;
  int64_t comm_bytes = 0, comm_steps = 0;
  int64_t by_op[4] = {0, 0, 0, 0};  // all-reduce, reduce-scatter, all-gather, broadcast
  int64_t store_bytes = -1;         // training.offload: -1 when no step reported it

  void Add(const StepReport& r) {
    store_bytes = r.offload_store_bytes;
    comm_seconds += r.comm_seconds;
    comm_hidden += r.comm_hidden_seconds;
    comm_bytes += r.comm_bytes;
    comm_steps += 1;
    by_op[0] += r.comm_all_reduce_bytes;
    by_op[1] += r.comm_reduce_scatter_bytes;
    by_op[2] += r.comm_all_gather_bytes;
    by_op[3] += r.comm_broadcast_bytes;
    step_seconds += r.step_seconds;
  }
};

// RunJob, and again from the newest checkpoint after each failure `restart` agrees to retry
// (never after a preemption or a cancellation).
Result<RunSummary> RunWithRestarts(const JobSpec& spec, RunOptions options, const RunCallbacks& cb,
                                   const std::function<Status(const Status& failure)>& restart) {
  Result<RunSummary> r = RunJob(spec, options, cb);
  for (int attempt = 1; !r.ok() && restart && r.status().code() != Status::Code::kAborted &&
                        r.status().code() != Status::Code::kCancelled;
       ++attempt) {
    const Status next = restart(r.status());
    if (!next.ok()) return next;
    std::fprintf(stderr, "attempt %d failed: %s; restarting from the newest checkpoint in %s\n",
                 attempt, r.status().ToString().c_str(), spec.output_dir.c_str());
    options.resume = true;
    r = RunJob(spec, options, cb);
  }
  return r;
}

// The closing lines: communication and offload totals, then the summary.
void PrintSummary(const JobSpec& spec, const RunTotals& t, const RunSummary& r) {
  if (t.comm_bytes > 0) {
    std::printf("communication: %.2f s in collectives not hidden by compute (%.1f%% of the steps' "
                "time), %.2f s hidden behind backward, %.1f MiB sent by this rank\n",
                t.comm_seconds, t.step_seconds > 0 ? 100.0 * t.comm_seconds / t.step_seconds : 0.0,
                t.comm_hidden, static_cast<double>(t.comm_bytes) / 1048576.0);
    std::printf("communication bytes sent by this rank in %lld steps: %lld (all-reduce %lld, "
                "reduce-scatter %lld, all-gather %lld, broadcast %lld)\n",
                static_cast<long long>(t.comm_steps), static_cast<long long>(t.comm_bytes),
                static_cast<long long>(t.by_op[0]), static_cast<long long>(t.by_op[1]),
                static_cast<long long>(t.by_op[2]), static_cast<long long>(t.by_op[3]));
  }
  if (spec.training.offload != "none" && t.store_bytes >= 0) {
    std::printf("offload: the store holds %lld bytes after the last step\n",
                static_cast<long long>(t.store_bytes));
  }
  std::printf("done: %lld steps, train_loss %.4f, eval_loss %.4f, %.0f tok/s, %.1fs, peak %.1f MiB "
              "(planned %.1f MiB)\noutput: %s\n",
              static_cast<long long>(r.global_step), r.train_loss, r.eval_loss,
              r.train_tokens_per_second, r.train_runtime, r.peak_memory_bytes / 1048576.0,
              r.plan.bytes.total() / 1048576.0, r.output_dir.c_str());
}

}  // namespace

int RunJobFileWithConsole(const std::string& spec_path, RunOptions options,
                          const std::function<Status(const Status& failure)>& restart) {
  const std::optional<JobSpec> spec = ReadAndAdmit(spec_path, options);
  if (!spec.has_value()) return 2;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  RouteSignalsToOwnThread({SIGINT, SIGTERM});
  options.cancel = &g_cancel;
  options.preempt = &g_preempt;
  RunCallbacks cb = ConsoleCallbacks(spec->training.max_steps);
  RunTotals totals;
  cb.on_step = [&totals](const StepReport& r) { totals.Add(r); };

  const Result<RunSummary> r = RunWithRestarts(*spec, options, cb, restart);
  if (!r.ok() && r.status().code() == Status::Code::kAborted) {
    std::fprintf(stderr, "interrupted: %s; run it again with --resume to continue\n",
                 r.status().message().c_str());
    return 1;
  }
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  PrintSummary(*spec, totals, *r);
  return 0;
}

}  // namespace traind::engine
