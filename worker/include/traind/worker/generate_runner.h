// Generation in a job-runner process: traind never loads device libraries itself, so a Generate
// RPC starts `traind-job-runner generate` (the same binary as the job runner), hands it the request
// on stdin and reads one result from stdout. The child runs engine::Generate on traind's device.
#pragma once

#include <string>

#include "traind/engine/devices.h"
#include "traind/engine/generate.h"
#include "traind/engine/status.h"
#include "traind/v1/job_service.pb.h"

namespace traind::worker {

// Starts `runner_path generate`, passes `request` and the device settings, waits for the result
// (the child dies with traind; at most `timeout_seconds`, then it is killed and UNAVAILABLE).
// The engine's errors come back with their codes; a child that dies without a result is INTERNAL
// naming how it ended. Child's stderr goes to `log_path` when not empty (appended).
Result<v1::GenerateResponse> RunGenerate(const std::string& runner_path,
                                         const engine::DeviceOptions& device,
                                         const v1::GenerateRequest& request,
                                         double timeout_seconds, const std::string& log_path);

// The child's main (`traind-job-runner generate`): 0 when a result was written, 2 when the request
// could not be read.
int GenerateRunnerMain();

// The request's options with the documented defaults for unset fields.
engine::GenerateOptions GenerateOptionsOf(const v1::GenerateRequest& request);

}  // namespace traind::worker
