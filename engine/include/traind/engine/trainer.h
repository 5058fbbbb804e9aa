// The engine's entry points for whoever runs jobs (worker/'s job runner, `traind run`, tests):
// plan a job, and run it to the end with progress reported through callbacks.
// Thread safety: RunJob blocks the calling thread; callbacks are called on that thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "traind/engine/devices.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/optimizer_state_store.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"
#include "traind/engine/tokenizer.h"  // TokenizeReport

namespace traind::engine {

// What the daemon side provides, through narrow interfaces the engine defines (each in its own
// header) and never the concrete type: the optimizer-state store (offload/: host RAM or RocksDB),
// the communicator (data parallel: Gloo, NCCL), and the tokenizers (data/; tokenizer.h, included).
class OptimizerStateStore;  // traind/engine/optimizer_state_store.h
class Communicator;         // traind/engine/communicator.h

// Plans memory for `spec` on the device: resolves per_device_train_batch_size "auto" (the largest
// micro-batch that fits, rounded down to a multiple of 8), accumulation for effective_batch_size,
// and gradient checkpointing when needed. FAILED_PRECONDITION when even the smallest configuration
// does not fit, with the breakdown and what would make it fit.
Result<MemoryPlan> EstimateJob(const JobSpec& spec, const DeviceOptions& device);
// As EstimateJob (for `trainctl estimate`), but a job that does not fit is no error: the plan of
// the smallest configuration tried (the given micro-batch, or micro-batch 1 with gradient
// checkpointing for "auto") with fits false, each change that would make it fit with its bytes in
// levers and the advice in reason. Errors as EstimateJob's otherwise (device, model config).
Result<MemoryPlan> EstimateJobWithAdvice(const JobSpec& spec, const DeviceOptions& device);

// What one optimizer step reports.
struct StepReport {
  int64_t step = 0;            // 1-based optimizer step just finished
  int64_t max_steps = 0;
  double loss = 0;             // mean training loss of this step's micro-batches
  double learning_rate = 0;    // the rate used for this step
  double grad_norm = 0;        // global L2 norm before clipping
  double step_seconds = 0;     // wall time of the step
  double dataloader_wait_seconds = 0;  // of that, waiting for data
  int64_t tokens = 0;          // tokens trained in this step
  int64_t samples = 0;         // sequences trained in this step
  bool skipped = false;        // fp16 overflow: update skipped
  int64_t memory_used_bytes = 0;
  int64_t memory_peak_bytes = 0;
  double model_flops = 0;      // model FLOPs of this step (6 * params * tokens + attention)
  // training.offload: this step's optimizer-state I/O (0 without offload) and the store's size.
  int64_t offload_read_bytes = 0;
  int64_t offload_written_bytes = 0;
  double offload_io_seconds = 0;      // time the step waited on the store (I/O not hidden)
  // Seconds the store's own threads spent in I/O during the step (read-ahead, write-behind, a
  // commit behind compute; thread-seconds, so more than the step when threads overlap): beside
  // offload_io_seconds, how much of the I/O the step did not wait for.
  double offload_background_io_seconds = 0;
  int64_t offload_store_bytes = 0;    // bytes the store holds now (disk, or RAM for cpu)
  // Parameters the offloaded update changed while the step's backward still ran (no clipping:
  // max_grad_norm 0, cpu; the rest after backward).
  int64_t offload_updated_during_backward = 0;
  // Data parallel: this rank's time inside collectives during the step that compute did not hide
  // (the step waited for it), the time of the gradient all-reduce that ran while backward
  // computed (bucketed overlap, cpu), and the bytes the collectives sent from this rank
  // (ring-algorithm volume at the buffers' element size); 0 for a run alone.
  double comm_seconds = 0;
  double comm_hidden_seconds = 0;
  int64_t comm_bytes = 0;
  // comm_bytes by collective (they add up to it): the gradients' all-reduce (zero_stage 0) or
  // reduce-scatter (zero_stage 1), ZeRO-1's weight gather (broadcasts), the scalars (all-gathers
  // of the loss and of the ZeRO-1 norm).
  int64_t comm_all_reduce_bytes = 0;
  int64_t comm_reduce_scatter_bytes = 0;
  int64_t comm_all_gather_bytes = 0;
  int64_t comm_broadcast_bytes = 0;
  // Mixture of experts (mixtral): tokens this step's training forwards routed to each expert,
  // layer-major (expert_layers x experts; a token counts once per chosen expert); empty for dense
  // models.
  int64_t expert_layers = 0;
  std::vector<int64_t> expert_tokens;
};

// What a `logging_steps` window reports (the log_history entry).
struct LogReport {
  int64_t step = 0;
  double loss = 0;  // mean over the window's steps
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double samples_per_second = 0;
};

// training.sample_every: text generated from the model at `step` (temperature 0.8, seeded from the
// job's seed and the step), the prompt being the first tokens of the training data. prompt/text
// are empty for format: tokens (no tokenizer; the ids tell).
struct SampleReport {
  int64_t step = 0;
  std::string prompt;
  std::string text;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;
};

struct EvalReport {
  int64_t step = 0;
  double eval_loss = 0;
  // model.head sequence_classification: labelled validation examples whose argmax is their label,
  // over all labelled validation examples.
  std::optional<double> eval_accuracy;
};

// Final numbers, in the names of the CLI contract's status "metrics".
struct RunSummary {
  int64_t global_step = 0;
  double train_loss = 0;  // mean training loss over the whole run (as HF's train_loss)
  double eval_loss = 0;   // final evaluation loss (NaN when validation_split is 0)
  std::optional<double> eval_accuracy;  // its accuracy (model.head sequence_classification)
  double train_runtime = 0;  // seconds
  double train_samples_per_second = 0;
  double train_tokens_per_second = 0;
  int64_t peak_memory_bytes = 0;  // the allocator's high-water mark
  MemoryPlan plan;
  std::string output_dir;
};

struct RunCallbacks {
  std::function<void(const MemoryPlan&)> on_plan;        // once, before the first step
  std::function<void(const StepReport&)> on_step;        // every optimizer step
  std::function<void(const LogReport&)> on_log;          // every logging_steps steps
  std::function<void(const EvalReport&)> on_eval;        // every eval_steps and at the end
  std::function<void(int64_t step, const std::string& dir)> on_checkpoint;  // after it is durable
  std::function<void(const std::string& line)> on_message;  // human-readable notes
  std::function<void(const TokenizeReport&)> on_tokenize;   // while the data is tokenized
  std::function<void(const SampleReport&)> on_sample;       // every training.sample_every steps
};

struct RunOptions {
  DeviceOptions device;
  // When true and output_dir holds checkpoint-<step>/ folders, continue from the newest complete
  // one (bit-identical to an uninterrupted run). When false, a fresh run.
  bool resume = false;
  // Checked between micro-batches; when it becomes true RunJob returns CANCELLED within one step.
  const std::atomic<bool>* cancel = nullptr;
  // Preemption (SIGTERM to the job runner): checked at each step boundary. When it becomes true,
  // RunJob writes a checkpoint of the step just finished (unless that step's was just written) and
  // returns ABORTED ("preempted at step N; checkpoint-N written"); a later run with resume = true
  // continues from it, bit-identical to an uninterrupted run. Before the first step: ABORTED, no
  // checkpoint (the resume starts from the newest one already there).
  const std::atomic<bool>* preempt = nullptr;

  // ---- injection points (not owned; each must outlive RunJob) ----
  // Where optimizer state lives with training.offload cpu/nvme. A store given here is used as is;
  // otherwise open_optimizer_state_store opens one for the spec (the job runner passes offload/'s
  // factories: host RAM for cpu, RocksDB on offload_dir for nvme). Neither: an offload spec is
  // rejected (FAILED_PRECONDITION).
  OptimizerStateStore* optimizer_state_store = nullptr;
  std::function<Result<std::unique_ptr<OptimizerStateStore>>(const TrainingSpec&)>
      open_optimizer_state_store;
  // The ranks of a data-parallel run (JOBSPEC.md "Batching semantics"). Null, or a world of one:
  // training alone, exactly as without it. A larger world (CPU backend only for now): rank r trains
  // the micro-batches k*W + r of the global step, gradients and the loss are all-reduced, every
  // rank takes the same optimizer step, evaluation is sharded by pass, rank 0 alone writes
  // output_dir. When null and the spec has a `distributed:` block, open_communicator opens one
  // (the job runner passes comm/'s Gloo factory; it returns null for a world of one).
  Communicator* communicator = nullptr;
  std::function<Result<std::unique_ptr<Communicator>>(const JobSpec&)> open_communicator;
  // Opens data.tokenizer. Null: the engine's own factory (byte; the HF formats as they land).
  const TokenizerFactory* tokenizers = nullptr;
};

// Runs the job to max_steps, writing output_dir as JOBSPEC.md says (checkpoints per save_steps,
// the final model, trainer_state.json). Returns the summary, or the first error (CANCELLED on
// cancel) after leaving every checkpoint already written intact.
Result<RunSummary> RunJob(const JobSpec& spec, const RunOptions& options,
                          const RunCallbacks& callbacks);

}  // namespace traind::engine
