// Job state names of the CLI contract.
#include "job_state.h"

namespace traind::v1 {

const char* JobStateName(JobState s) {
  switch (s) {
    case JOB_STATE_QUEUED: return "QUEUED";
    case JOB_STATE_RUNNING: return "RUNNING";
    case JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case JOB_STATE_FAILED: return "FAILED";
    case JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}

bool IsTerminal(JobState s) {
  return s == JOB_STATE_SUCCEEDED || s == JOB_STATE_FAILED || s == JOB_STATE_CANCELLED;
}

}  // namespace traind::v1
