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

struct TrainingSession {
  // What the run was asked for.
  JobSpec spec;
  // The last evaluation's accuracy (model.head sequence_classification), for the summary.
  std::optional<double> last_eval_accuracy;
  const RunOptions* options = nullptr;      // not owned
  const RunCallbacks* callbacks = nullptr;  // not owned
  std::chrono::steady_clock::time_point start;

  // Device and plan.
  std::string device;  // resolved: "cpu", "cuda:0", "simt"
  DeviceCapabilities capabilities;  // the backend's: what policy asks instead of the name
  ModelConfig config;
  MemoryPlan plan;
  LrScheduleType schedule = LrScheduleType::kConstant;
  int64_t B = 0, T = 0, accum = 1;  // micro-batch, sequence length, accumulation steps

  // Data.
  TokenStream train_tokens;       // views over one mapping (token_stream.h); shared with the loader
  TokenStream validation_tokens;
  int64_t windows_per_epoch = 0;  // set by the step loop's batch loader (encoders: examples)
  // Encoder families (bert): examples with attention masks instead of the token streams above
  // (example_data.h); null for the causal families.
  std::unique_ptr<ExampleData> examples;

  // Device objects, in construction order (destroyed in reverse: the arena outlives what it holds).
  std::unique_ptr<Backend> backend;
  std::unique_ptr<OptimizerStateStore> owned_store;  // opened for training.offload (else null)
  OptimizerStateStore* store = nullptr;              // owned_store or RunOptions' store
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;  // training.optim
  std::unique_ptr<TrainingSampler> sampler;  // training.sample_every (else null)

  // Data parallel (RunOptions::communicator, or one opened for the spec's distributed: block).
  // Without one: world 1, rank 0, comm null, and nothing below differs from a run alone.
  std::unique_ptr<Communicator> owned_comm;
  // Every collective of the run goes through it (comm points at it): traind_comm_* figures.
  std::unique_ptr<MeteredCommunicator> metered_comm;
  Communicator* comm = nullptr;  // null when world == 1
  int world = 1, rank = 0;
  bool writes_outputs() const { return rank == 0; }  // rank 0 alone writes output_dir

  // Where the run stands (restored on resume).
  TrainerState state;
  int64_t first_step = 0;  // state.global_step when this process started

  void Message(const std::string& line) const;
  bool Cancelled() const;
  bool Preempted() const;
};

// Runs the set-up stages in order; the first failing stage's error is returned.
Result<std::unique_ptr<TrainingSession>> SetUpSession(const JobSpec& spec, const RunOptions& options,
                                                      const RunCallbacks& callbacks);

}  // namespace traind::engine
