// Running one job spec file in this process with progress on the console: the one in-process job
// runner behind `traind run JOB.yaml` (worker/) and the engine's development tool `traind-run`.
#pragma once

#include <functional>
#include <string>

#include "traind/engine/trainer.h"

namespace traind::engine {

// Reads, parses (relative paths against the working directory, as trainctl does), validates and
// plans the spec at `spec_path`, then runs it with `options` (its `preempt` and `cancel` are
// replaced: the first SIGINT or SIGTERM preempts, writing a checkpoint at the next step boundary
// and saying to run again with --resume; a second one cancels at once). Prints to stdout: "plan:
// ..." once, "step S/N  loss ..." per logging window, "step S  eval_loss ..." per evaluation,
// "checkpoint DIR", "note: ..." for the engine's notes, and at the end "done: N steps, ..."
// followed by "output: DIR". Errors go to stderr as one line. Returns 0 on success, 1 when the run
// fails, is cancelled or preempted, 2 when the spec cannot be read, is invalid or does not fit the
// device.
//
// `restart` (data parallel, `traind run --max-restarts`): called when an attempt fails (not when
// it is preempted or cancelled); OK runs another attempt, resumed from output_dir's newest
// checkpoint as with --resume (the same spec, callbacks and options), after printing "attempt N
// failed: ...; restarting" to stderr; any other status ends the run with it. Null: one attempt.
int RunJobFileWithConsole(const std::string& spec_path, RunOptions options,
                          const std::function<Status(const Status& failure)>& restart = nullptr);

}  // namespace traind::engine
