// JSON views of jobs and events for the web page (server/http/web_server.cc): built from the same
// v1.Job records and v1.JobEvent log that the gRPC service returns, plus figures derived from the
// newest events (throughput, MFU, ETA), so the page and trainctl read one source of truth.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "v1_json.h"
#include "traind/v1/job_service.pb.h"

namespace traind::server::http {

// Figures derived from a window of a job's newest events.
struct JobStats {
  double tokens_per_second = 0;   // newest logging window (SUCCEEDED: the run's summary)
  double seconds_per_step = 0;    // mean step time over the newest step events
  double mfu = 0;                 // mean model FLOP/s of those steps over `peak_flops`
  double eta_seconds = -1;        // RUNNING: (max_steps - step) x seconds_per_step; else -1
  int64_t memory_peak_bytes = 0;  // newest allocator high-water mark reported by a step
};
JobStats ComputeStats(const v1::Job& job, const std::vector<v1::JobEvent>& recent, double peak_flops);

// Plans and events have trainctl's JSON shapes (proto/v1_json.h): one rendering for both.
using v1::EventJson;
using v1::PlanJson;

// One row of the job list: id name owner state step max_steps priority attempts times, last
// loss, error, output_dir and the stats.
nlohmann::json JobRowJson(const v1::Job& job, const JobStats& stats);
// The row plus the spec (as submitted and canonical), the plan, the summary and the output paths.
nlohmann::json JobDetailJson(const v1::Job& job, const JobStats& stats);

}  // namespace traind::server::http
