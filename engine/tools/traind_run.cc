// traind-run: runs one job spec with the engine in this process (no daemon), printing the plan,
// one line per logging window and the output folder. For development and debugging.
//   traind-run JOB.yaml [--resume] [--threads N] [--device cpu|auto|cuda:N|simt]
//              [--memory-budget BYTES]
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "traind/engine/devices.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace {

std::atomic<bool> g_cancel{false};

void OnSignal(int) { g_cancel.store(true); }

}  // namespace

int main(int argc, char** argv) {
  using namespace traind::engine;
  CLI::App app{"traind-run: train one job spec in this process (development tool)"};
  std::string job_path;
  RunOptions options;
  int64_t budget = 0;
  app.add_option("job", job_path, "job spec (YAML or JSON)")->required();
  app.add_flag("--resume", options.resume, "continue from the newest checkpoint in output_dir");
  app.add_option("--threads", options.device.threads, "CPU threads (0 = all cores)");
  app.add_option("--device", options.device.device,
                 "cpu | auto | cuda:N | simt (CUDA kernels under the CPU emulator; testing only)");
  app.add_option("--memory-budget", budget, "bytes the planner may use (0 = device capacity)");
  CLI11_PARSE(app, argc, argv);
  RegisterGpuBackends();
  options.device.memory_budget_bytes = budget;

  std::ifstream in(job_path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", job_path.c_str());
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string base = std::filesystem::current_path().string();  // as trainctl does
  traind::Result<JobSpec> spec = ParseJobSpec(text.str(), base);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 2;
  }

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  options.cancel = &g_cancel;
  RunCallbacks cb;
  cb.on_plan = [](const MemoryPlan& p) {
    std::printf("plan: micro_batch %lld x %lld accumulation, checkpointing %s, %.1f MiB (%s)\n",
                static_cast<long long>(p.micro_batch),
                static_cast<long long>(p.gradient_accumulation_steps),
                p.gradient_checkpointing ? "on" : "off", p.bytes.total() / 1048576.0,
                p.reason.c_str());
  };
  const int64_t max_steps = spec->training.max_steps;
  cb.on_log = [max_steps](const LogReport& r) {
    std::printf("step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s\n",
                static_cast<long long>(r.step), static_cast<long long>(max_steps), r.loss,
                r.learning_rate, r.grad_norm, r.tokens_per_second);
    std::fflush(stdout);
  };
  cb.on_eval = [](const EvalReport& r) {
    std::printf("step %lld  eval_loss %.4f\n", static_cast<long long>(r.step), r.eval_loss);
    std::fflush(stdout);
  };
  cb.on_checkpoint = [](int64_t step, const std::string& dir) {
    std::printf("checkpoint %s\n", dir.c_str());
  };
  cb.on_message = [](const std::string& line) { std::printf("note: %s\n", line.c_str()); };

  traind::Result<RunSummary> r = RunJob(*spec, options, cb);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("done: %lld steps, train_loss %.4f, eval_loss %.4f, %.0f tok/s, %.1fs, peak %.1f MiB "
              "(planned %.1f MiB)\noutput: %s\n",
              static_cast<long long>(r->global_step), r->train_loss, r->eval_loss,
              r->train_tokens_per_second, r->train_runtime, r->peak_memory_bytes / 1048576.0,
              r->plan.bytes.total() / 1048576.0, r->output_dir.c_str());
  return 0;
}
