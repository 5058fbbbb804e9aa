// Admission: the checks a job passes before it is queued (parse, input files, memory plan against
// the device budget), and the conversions between the engine's structs and the traind/v1 messages.
// Pure functions over the engine's public API; thread-safe.
#pragma once

#include <string>

#include "traind/engine/job_spec.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"
#include "traind/engine/trainer.h"
#include "traind/v1/job.pb.h"

namespace traind::worker {

struct Admitted {
  engine::JobSpec spec;
  std::string spec_json;  // canonical (engine JobSpecToJson): what the job-runner runs
  engine::MemoryPlan plan;
};

// Parses `text` (YAML or JSON; relative paths against `base_dir`), checks the input files and
// plans memory on `device`. Returns the engine's status on failure: INVALID_ARGUMENT with the field
// path, NOT_FOUND / FAILED_PRECONDITION for missing inputs, FAILED_PRECONDITION when the plan does
// not fit the budget (the message carries the breakdown and what would make it fit).
Result<Admitted> Admit(const std::string& text, const std::string& base_dir,
                       const engine::DeviceOptions& device);

// Only the plan (for EstimateJob): parse + plan, without touching input files. A job that does
// not fit is no error here: its plan has fits false and the advice (engine::EstimateJobWithAdvice).
Result<engine::MemoryPlan> Estimate(const std::string& text, const std::string& base_dir,
                                    const engine::DeviceOptions& device);

// Converts a JobSpec message to the spec document (JSON text) that ParseJobSpec reads: every set
// field becomes its YAML key; per_device_train_batch_size_auto becomes "auto".
std::string SpecMessageToText(const v1::JobSpec& spec);

// Data parallel (`distributed:`): the world size (0 for a plain run, world_size 1 included) and
// this job's rank (-1 for a plain run).
int64_t DistributedWorld(const engine::JobSpec& spec);
int64_t DistributedRank(const engine::JobSpec& spec);
// UNIMPLEMENTED for a world larger than one on simt, and on a cuda device (or auto) when this
// build has no NCCL (comm::NcclBuilt()); cpu (Gloo) always passes.
Status CheckDistributedDevice(const engine::JobSpec& spec, const std::string& device);

v1::Plan PlanToProto(const engine::MemoryPlan& plan);
v1::RunSummary SummaryToProto(const engine::RunSummary& summary);

}  // namespace traind::worker
