// The two ways a job's kernels run: `traind job-runner` (the child process the Supervisor starts,
// one per attempt of a job) and `traind run JOB.yaml` (in-process, no daemon, for development).
#pragma once

#include <string>

#include "traind/engine/trainer.h"

namespace traind::worker {

// The job-runner child's main. Protocol (traind/v1/runner.proto): reads one length-delimited
// RunnerRequest from stdin, then writes length-delimited RunnerEvents to the original stdout, the
// last one `result`; anything the engine prints goes to stderr. SIGTERM (or SIGINT) preempts: the
// engine writes a checkpoint at the next step boundary and the result says `preempted` (resume
// continues from it). SIGUSR1 sets the engine's cancel flag, so the run ends CANCELLED within one
// step (the supervisor's cancel). Returns the process exit code:
// 0 when a result was written (whatever its status), 2 when the request could not be read.
int JobRunnerMain();

// `traind run`: admits and runs the spec file in this process, printing one progress line per
// logging window to stdout. Returns 0 on success, 1 when the run fails, 2 for an invalid spec.
// `max_restarts` > 0 (`--max-restarts`, data parallel): a rank whose attempt fails because the
// world broke (a peer gone, a collective timed out) rejoins the rendezvous's next round and
// resumes from output_dir's newest checkpoint with the others, at most that many times
// (comm::RestartableWorld; docs/distributed.md). 0: one attempt.
int RunLocal(const std::string& spec_path, const engine::DeviceOptions& device, bool resume,
             int max_restarts = 0);

}  // namespace traind::worker
