// What the daemon knows of its device, learned without loading any device library into traind:
// traind never runs kernels (DESIGN.md "Processes"), and the CUDA libraries must stay out of its
// address space (cuBLASLt's static TLS leaves no room on the small stacks of the metrics server's
// threads). The probe runs `traind-job-runner query-device DEVICE` and reads one JSON line.
#pragma once

#include <string>

#include "traind/engine/devices.h"
#include "traind/engine/status.h"

namespace traind::server {

// The job-runner binary beside traind (`traind-job-runner`), or traind itself when it is absent
// (then only the CPU is available).
std::string JobRunnerPath();
// traind-cpu-runner beside this binary (the runner without the GPU backends); "" when it is not
// there.
std::string CpuRunnerPath();

// Resolves and describes `device` through the job runner. FAILED_PRECONDITION / INVALID_ARGUMENT
// with the runner's reason when the device cannot be used.
Result<engine::DeviceInfo> ProbeDevice(const std::string& device);

// The runner side: prints DeviceInfo of `device` as one JSON line; exit 0, or 2 with
// {"error": "..."} when it cannot be used.
int QueryDeviceMain(const std::string& device);

}  // namespace traind::server
