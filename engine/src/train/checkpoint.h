// Trainer checkpoints and trainer_state.json: what RunJob writes to output_dir/checkpoint-<step>/
// and reads back on resume (layout and fields: docs/checkpoint-format.md, "Trainer checkpoints").
// A checkpoint is written into checkpoint-<step>.tmp/ and renamed into place when complete, so a
// folder named checkpoint-<step> is always whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/token_data.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/loss_scaler.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

// Everything besides weights and optimizer state that a resumed run needs to continue exactly.
struct TrainerState {
  int64_t global_step = 0;        // optimizer steps done (= the lr scheduler's step)
  LoaderPosition loader;          // the next training batch
  nlohmann::json log_history = nlohmann::json::array();
  double window_loss_sum = 0.0;   // the open logging window: sum of its step losses
  int64_t window_steps = 0;       // and how many steps it holds
  double train_loss_sum = 0.0;    // sum of every step's loss so far (for RunSummary::train_loss)
  int64_t micro_batch = 0;        // must match on resume (the batches depend on it)
  int64_t gradient_accumulation_steps = 0;
  // fp16 only: the dynamic loss scaler, and the skipped steps of the open logging window. Absent
  // in bf16/fp32 runs and in checkpoints written before these fields existed (a fresh scaler).
  std::optional<LossScalerState> loss_scaler;
  int64_t window_skipped = 0;
};

// Names inside a checkpoint folder.
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerExtraFile = "trainer_extra.json";
// LoRA (training.peft): HF PEFT's files, in output_dir and in checkpoints instead of the model.
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterModelFile = "adapter_model.safetensors";

// PEFT's adapter_config.json for a LoRA job (LoraConfig's keys; fan_in_fan_out true for gpt2's
// Conv1D; base_model_name_or_path = model.init_from, null for a seeded base).
std::string AdapterConfigJson(const JobSpec& spec, const Model& model);

// The folder of the checkpoint at `step`: output_dir/checkpoint-<step>.
std::string CheckpointDir(const std::string& output_dir, int64_t step);

// The HF-style trainer_state.json text (indent 2, keys sorted) for `state`. `windows_per_epoch`
// gives the "epoch" field; `final_entry`, when not null, is appended to log_history (the end-of-
// training summary HF writes into the final trainer_state.json only).
std::string TrainerStateJson(const JobSpec& spec, const TrainerState& state,
                             int64_t windows_per_epoch, const nlohmann::json* final_entry);

// Writes checkpoint-<step>/ for the current model, optimizer and state (step = state.global_step)
// atomically: into checkpoint-<step>.tmp/, fsynced, then renamed (an existing checkpoint-<step>
// is replaced). Returns the folder. RESOURCE_EXHAUSTED / INTERNAL on I/O errors.
Result<std::string> SaveCheckpoint(const std::string& output_dir, const JobSpec& spec,
                                   Model* model, const Optimizer& optimizer,
                                   const TrainerState& state, int64_t windows_per_epoch);

// The step of the newest complete checkpoint-<step>/ in output_dir (all five files present), or
// -1 when there is none. Temporary folders are never picked.
int64_t FindLatestCheckpoint(const std::string& output_dir);

// Loads weights, optimizer state and trainer state from checkpoint folder `dir` (LoRA: only the
// adapters; the frozen base must already be in place from init_from or the seed). DATA_LOSS naming
// the file for missing or corrupt parts; INVALID_ARGUMENT when the checkpoint's model does not
// match `model`.
Status LoadCheckpoint(const std::string& dir, Model* model, Optimizer* optimizer,
                      TrainerState* state);

// Removes every checkpoint-*/ folder (complete or temporary) under output_dir: a fresh run must
// not leave an earlier run's checkpoints for a later resume to pick.
Status RemoveCheckpoints(const std::string& output_dir);

}  // namespace traind::engine
