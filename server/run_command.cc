// `run JOB.yaml`: flags → DeviceOptions → worker::RunLocal.
#include "run_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "options.h"
#include "traind/worker/job_runner.h"

namespace traind::server {

int RunCommandMain(int argc, char** argv) {
  CLI::App app{"traind run: train a job spec in this process, without the daemon"};
  std::string spec, device = "auto", budget = "auto";
  bool resume = false;
  int threads = 0;
  int max_restarts = 0;
  app.add_option("spec", spec, "job spec (YAML)")->required();
  app.add_option("--device", device, "auto | cpu | cuda:N | simt (emulated CUDA, tests only)");
  app.add_option("--memory-budget", budget, "bytes or auto");
  app.add_option("--threads", threads, "CPU threads; 0 = all");
  app.add_flag("--resume", resume, "continue from output_dir's newest checkpoint");
  app.add_option("--max-restarts", max_restarts,
                 "data parallel: when a rank dies or hangs, every rank rejoins the rendezvous "
                 "and the world resumes from the newest checkpoint, at most N times; give every "
                 "rank the same N; needs --resume (a restarted process continues from the "
                 "checkpoint); 0 (default): a broken world ends the run")
      ->check(CLI::Range(0, 1000000));
  CLI11_PARSE(app, argc, argv);
  if (max_restarts > 0 && !resume) {
    std::fprintf(stderr,
                 "--max-restarts %d needs --resume: a rank restarted from scratch (the same command) "
                 "must continue from output_dir's newest checkpoint instead of refusing the "
                 "output_dir its world wrote; with --resume a first run with no checkpoint starts "
                 "fresh\n",
                 max_restarts);
    return 2;
  }
  auto bytes = ParseBytes(budget);
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().message().c_str());
    return 2;
  }
  engine::DeviceOptions d;
  d.device = device;
  d.memory_budget_bytes = *bytes;
  d.threads = threads;
  return worker::RunLocal(spec, d, resume, max_restarts);
}

}  // namespace traind::server
