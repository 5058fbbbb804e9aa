// traind-run: runs one job spec with the engine in this process (no daemon), printing the plan,
// one line per logging window and the output folder (RunJobFileWithConsole, the same runner as
// `traind run`). For development and debugging.
//   traind-run JOB.yaml [--resume] [--threads N] [--device cpu|auto|cuda:N|simt]
//              [--memory-budget BYTES]
#include <string>

#include <CLI/CLI.hpp>

#include "traind/engine/devices.h"
#include "traind/engine/local_run.h"

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
  return RunJobFileWithConsole(job_path, options);
}
