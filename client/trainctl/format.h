// trainctl's renderings of jobs, plans and events: the JSON shapes of CLI.md (`status -o json`,
// `estimate -o json`) and the text for people (aligned tables, event lines, the progress bar).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "v1_json.h"
#include "traind/v1/job_service.pb.h"

namespace traind::trainctl {

// The plan and event objects are shared with traind's web page (proto/v1_json.h).
using v1::EventJson;
using v1::PlanJson;
// CLI.md's status object: id name state step max_steps error output_dir metrics{} plan{}, plus
// owner, priority, attempts, created/started/finished times.
nlohmann::json JobJson(const v1::Job& job);

std::string StatusText(const v1::Job& job);      // `status` in text: aligned key/value lines
std::string ListText(const std::vector<v1::Job>& jobs);  // `list` in text: an aligned table
// `estimate`: whether the job fits (a daemon without the field said so by answering at all);
// `-o json`: {"plan":{..},"reason":..,"fits":..,"levers":[{"change":..,"bytes":..,"fits":..}]};
// text: the table by category, the plan's choices, then for a job that does not fit the advice,
// one lever a line with its bytes.
bool EstimateFits(const v1::EstimateJobResponse& r);
nlohmann::json EstimateJson(const v1::EstimateJobResponse& r);
std::string EstimateText(const v1::EstimateJobResponse& r);
std::string EventText(const v1::JobEvent& ev);   // one line per event, no newline

// "12.5 MiB"
std::string HumanBytes(int64_t bytes);
// "1:02:03" / "4:05"
std::string HumanDuration(double seconds);

// The progress line for `logs -f` / `submit --follow` on a terminal:
// "[########------------]  40/100  40%  loss 2.3456  1234 tok/s  ETA 0:42".
struct Progress {
  int64_t step = 0, max_steps = 0;
  double loss = 0, tokens_per_second = 0, seconds_per_step = 0;  // EMA of step times
  void Update(const v1::StepEvent& s);
  std::string Line(int width = 20) const;
};

}  // namespace traind::trainctl
