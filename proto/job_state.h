// The job states of traind.v1 as the CLI contract names them ("QUEUED", ...), shared by traind and
// trainctl so both print exactly the same words.
#pragma once

#include "traind/v1/job.pb.h"

namespace traind::v1 {

// "QUEUED" | "RUNNING" | "SUCCEEDED" | "FAILED" | "CANCELLED" ("UNKNOWN" for anything else).
const char* JobStateName(JobState s);
// SUCCEEDED, FAILED or CANCELLED: the job will not change state again.
bool IsTerminal(JobState s);

}  // namespace traind::v1
