// `run JOB.yaml`: train a job spec in this process, without the daemon (development and scripts).
// Shared by `traind run` and `traind-job-runner run`. Returns the process exit code
// (0 succeeded, 1 the job failed or was cancelled, 2 usage or invalid spec).
#pragma once

namespace traind::server {

int RunCommandMain(int argc, char** argv);  // argv[0] is "run"

}  // namespace traind::server
