// traind-job-runner: the process that owns the device for one job attempt. traind starts it with
// `job-runner` (spec on stdin, events on stdout: worker/job_runner.h) and probes the device with
// `query-device DEVICE`; `run JOB.yaml` trains in this process like `traind run`. It is a binary
// of its own so that the CUDA libraries are loaded here and never into the daemon. Built twice:
// traind-cpu-runner is the same without the GPU backends (no cuBLASLt to load at its start),
// what traind starts for jobs when its device is the CPU.
#include <cstdio>
#include <string>

#include "device_probe.h"
#include "run_command.h"
#include "traind/engine/devices.h"
#include "traind/worker/generate_runner.h"
#include "traind/worker/job_runner.h"

int main(int argc, char** argv) {
#if !defined(TRAIND_CPU_RUNNER)
  traind::engine::RegisterGpuBackends();  // cuda:N and simt, when this build has them
#endif
  const std::string cmd = argc >= 2 ? argv[1] : "";
  if (cmd == "job-runner") return traind::worker::JobRunnerMain();
  if (cmd == "generate") return traind::worker::GenerateRunnerMain();
  if (cmd == "query-device" && argc == 3) return traind::server::QueryDeviceMain(argv[2]);
  if (cmd == "run") return traind::server::RunCommandMain(argc - 1, argv + 1);
  std::fprintf(stderr,
               "usage: traind-job-runner job-runner | generate | query-device DEVICE | "
               "run JOB.yaml [flags]\n"
               "(started by traind; use `traind run` to train a spec by hand)\n");
  return 2;
}
