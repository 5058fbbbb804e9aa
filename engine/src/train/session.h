// A training session: everything RunJob sets up before its first step, built in named stages
// (validate the run, open the device and plan memory, load the data, build the model and the
// optimizer, restore the newest checkpoint or initialise), then driven by the step loop
// (step_loop.h) and finished by RunJob (final outputs and summary).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "data/example_data.h"
#include "data/token_data.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/sampler.h"
#include "traind/engine/communicator.h"
#include "train/metered_communicator.h"
#include "traind/engine/trainer.h"

namespace traind::engine {

// The session's parts, each what one concern owns. The set-up stages (session.cc) write them;
// afterwards the request, the device plan, the data and the data-parallel world are read-only
// (TrainingSession's const accessors), and only the device objects and the progress change.

// What the run was asked for.
struct RunRequest {
  JobSpec spec;
  const RunOptions* options = nullptr;      // not owned
  const RunCallbacks* callbacks = nullptr;  // not owned

  void Message(const std::string& line) const;  // RunCallbacks::on_message
  bool Cancelled() const;                       // RunOptions::cancel
  bool Preempted() const;                       // RunOptions::preempt
};

// The device and the plan: the device's name and capabilities, the model and the batch shape.
struct DevicePlan {
  std::string device;  // resolved: "cpu", "cuda:0", "simt" (for messages; policy asks capabilities)
  DeviceCapabilities capabilities;  // the backend's: what policy asks instead of the name
  ModelConfig config;
  MemoryPlan plan;
  LrScheduleType schedule = LrScheduleType::kConstant;
  int64_t B = 0, T = 0, accum = 1;  // micro-batch, sequence length, accumulation steps
};

// The training and validation data.
struct TrainingData {
  TokenStream train_tokens;  // views over one mapping (token_stream.h); shared with the loader
  TokenStream validation_tokens;
  // Encoder families (bert) and instruction data: examples with attention masks instead of the
  // token streams above (example_data.h); null for the causal families' text.
  std::unique_ptr<ExampleData> examples;
};

// The objects on the device, in construction order (destroyed in reverse: the arena outlives what
// it holds).
struct DeviceObjects {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<OptimizerStateStore> owned_store;  // opened for training.offload (else null)
  OptimizerStateStore* store = nullptr;              // owned_store or RunOptions' store
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;      // training.optim
  std::unique_ptr<TrainingSampler> sampler;  // training.sample_every (else null)
};

// Data parallel (RunOptions::communicator, or one opened for the spec's distributed: block).
// Without one: world 1, rank 0, comm null, and nothing differs from a run alone.
struct DataParallel {
  std::unique_ptr<Communicator> owned_comm;
  // Every collective of the run goes through it (comm points at it): traind_comm_* figures.
  std::unique_ptr<MeteredCommunicator> metered_comm;
  Communicator* comm = nullptr;  // null when world == 1
  int world = 1, rank = 0;
  bool writes_outputs() const { return rank == 0; }  // rank 0 alone writes output_dir
};

// Where the run stands: what the step loop advances.
struct Progress {
  TrainerState state;      // restored on resume
  int64_t first_step = 0;  // state.global_step when this process started
  int64_t windows_per_epoch = 0;  // set by the step loop's batch loader (encoders: examples)
  // The last evaluation's accuracy (model.head sequence_classification), for the summary.
  std::optional<double> last_eval_accuracy;
  std::chrono::steady_clock::time_point start;  // the training loop's start (train_runtime)
};

class TrainingSession {
 public:
  // Fixed after set-up.
  const RunRequest& request() const { return request_; }
  const JobSpec& spec() const { return request_.spec; }
  const DevicePlan& device_plan() const { return device_plan_; }
  const TrainingData& data() const { return data_; }
  const DataParallel& parallel() const { return parallel_; }
  // Changed by training: the model's weights, the optimizer's state, the sampler; the progress.
  DeviceObjects& objects() { return objects_; }
  const DeviceObjects& objects() const { return objects_; }
  Progress& progress() { return progress_; }
  const Progress& progress() const { return progress_; }

  void Message(const std::string& line) const { request_.Message(line); }
  bool writes_outputs() const { return parallel_.writes_outputs(); }

 private:
  friend Result<std::unique_ptr<TrainingSession>> SetUpSession(const JobSpec& spec,
                                                               const RunOptions& options,
                                                               const RunCallbacks& callbacks);
  // In this order: destroyed in reverse (the communicator before the optimizer that uses it, the
  // device objects before the data the loader maps).
  RunRequest request_;
  DevicePlan device_plan_;
  TrainingData data_;
  DeviceObjects objects_;
  DataParallel parallel_;
  Progress progress_;
};

// Runs the set-up stages in order; the first failing stage's error is returned.
Result<std::unique_ptr<TrainingSession>> SetUpSession(const JobSpec& spec, const RunOptions& options,
                                                      const RunCallbacks& callbacks);

}  // namespace traind::engine
