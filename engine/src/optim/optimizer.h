// Optimizer: the one interface the step runner, checkpoints, the planner and the trainer use, for
// every optimizer over a model's flat parameter buffer (training.optim: adamw, adafactor,
// adamw_8bit, sgd). Gradient norm and clipping stay shared (the step runner computes the global
// norm; an optimizer receives the combined multiplier clip_coefficient / loss_scale).
//
// Two ways to issue a step:
// - from device scalars (AdamW, 8-bit AdamW): FillNextStep writes the optimizer's per-step values
//   (bias corrections) into the host StepScalars the runner then copies to the device; IssueStep
//   issues the update reading lr, the multiplier and the fp16 skip from device memory, so the
//   optimizer step is captured in the CUDA graph; CountStep counts it once it was applied.
// - host-driven (SGD, Adafactor): the runner reads the step's gradient norm back, and calls Step
//   with the learning rate and the multiplier (not at all when an fp16 step overflowed).
// State lives in the DeviceArena under kOptimizer; SaveState/LoadState give it as named tensors
// ("<hf_name>.<state>") with versioned "format" and "step" metadata (checkpoints).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/arena.h"
#include "backend/step_scalars.h"
#include "core/master_weights.h"
#include "core/param_info.h"
#include "core/safetensors.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;  // the training.optim value
  // Steps applied so far (fp16-skipped steps not counted).
  virtual int64_t step() const = 0;

  virtual bool issues_from_device_scalars() const = 0;
  virtual void FillNextStep(StepScalars* s) const = 0;
  virtual void IssueStep(float* params, const float* grads, const StepScalars* device_scalars) = 0;
  virtual void CountStep() = 0;
  // One step at `lr` with gradient grad_scale * grads; counts it.
  virtual void Step(float* params, const float* grads, double lr, float grad_scale) = 0;

  // Updates that start while backward still runs (the offloaded AdamW). The step runner uses them
  // only where the order allows: the step's multiplier known before backward (no clipping, no
  // fp16 skip), one process, no LoRA, no graph replay, a backend whose ops have finished when the
  // backward's hook runs (cpu). BeginStep(params, grads, lr, grad_scale) before the last
  // micro-batch's backward; GradientsFinalFrom(offset) each time every gradient at flat offsets
  // >= offset is final (no later backward op reads those parameters, so the optimizer may update
  // them now); then Step with the same values finishes the rest. Errors stick in status().
  virtual bool updates_during_backward() const { return false; }
  virtual void BeginStep(float* params, const float* grads, double lr, float grad_scale) {
    (void)params, (void)grads, (void)lr, (void)grad_scale;
  }
  virtual void GradientsFinalFrom(int64_t offset) { (void)offset; }
  // Elements of the last step updated during its backward (GradientsFinalFrom).
  virtual int64_t updated_during_backward() const { return 0; }

  // The first error the optimizer hit outside the device (its offload store: a full disk, a
  // damaged chunk), sticky; Ok for in-memory optimizers. Checked after Step and SaveState.
  virtual Status status() const { return Status::Ok(); }

  virtual SafetensorsFile SaveState() const = 0;
  // SaveState() written to `path` (a checkpoint's optimizer.safetensors). Optimizers whose state
  // is not in memory (offload) stream it instead of assembling it; the bytes are the same.
  virtual Status WriteState(const std::string& path) const {
    const SafetensorsFile state = SaveState();
    TRAIND_RETURN_IF_ERROR(status());
    return WriteSafetensors(path, state);
  }
  // The same state as a stream (names, dtypes and shapes up front, each tensor's bytes on demand
  // in name order; the optimizer must outlive it): what ZeRO-1 gathers from each rank's shard
  // without holding it whole. Default: SaveState() kept in memory behind the stream; the
  // offloaded optimizers read their store a chunk or a group at a time instead.
  virtual Result<SafetensorsStream> StateStream() const;
  // DATA_LOSS naming the tensor or the metadata that does not match this optimizer and model.
  virtual Status LoadState(const SafetensorsFile& file) = 0;
  // LoadState of the file at `path` (a checkpoint's optimizer.safetensors). Optimizers whose
  // state is not in memory (offload) stream it into their store instead of reading it whole.
  virtual Status ReadState(const std::string& path) {
    TRAIND_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
    return LoadState(file);
  }

  // ZeRO-1 (optim/sharded_optimizer.h): the rank updates and keeps the state of its shard of the
  // flat buffer only, and reads only its range of the gradients (the caller reduce-scatters them:
  // shard_ranges() gives every rank's range, in rank order). After each step every rank calls
  // GatherParams (a collective) so that each holds the whole update; SaveState / WriteState gather
  // every rank's state, so the ranks that do not write call ContributeState at the same point.
  // Nothing for an unsharded optimizer (shard_ranges() empty).
  virtual bool sharded() const { return false; }
  virtual std::vector<std::pair<int64_t, int64_t>> shard_ranges() const { return {}; }
  virtual Status GatherParams(float* params) {
    (void)params;
    return Status::Ok();
  }
  virtual Status ContributeState() const { return Status::Ok(); }

  // The offloaded AdamW with the master weights in its store (OffloadOptions::master_weights):
  // where the model's weights come in and go out; null for every other optimizer.
  virtual MasterWeightsStore* master_weights_store() { return nullptr; }
};

// The optimizers as rows (docs/engine.md, "A new optimizer"): everything that differs between
// them. FindOptimizer is the one parser of training.optim; everything after reads the row or
// switches over its kind (no default case: a new kind fails the build until every switch has it).
enum class OptimKind { kAdamW, kAdafactor, kAdamW8bit, kSgd };
inline constexpr int kNumOptimKinds = 4;

struct OptimizerRow {
  OptimKind kind;
  const char* name;  // training.optim
  // training.optim_args keys it takes (JOBSPEC.md; HF / torch names) and their checks beyond
  // their types: INVALID_ARGUMENT "training.optim_args.<key>: ..." for a bad combination.
  std::vector<std::string> args;
  Status (*check_args)(const OptimArgs& a);
  // MakeOptimizer / OptimizerPlanBytes of this optimizer (see below).
  Result<std::unique_ptr<Optimizer>> (*create)(const TrainingSpec& t,
                                               const std::vector<ParamInfo>& params,
                                               int64_t num_params, DeviceArena* arena,
                                               const std::vector<bool>& quantized);
  int64_t (*plan_bytes)(const TrainingSpec& t, const std::vector<ParamInfo>& params,
                        int64_t num_params, const std::vector<bool>& quantized);
  // ZeRO-1's cut of the flat buffer into rank shards (optim/sharded_optimizer.h): elementwise
  // (the same state bytes per element), whole tensors balanced by state floats (a factored second
  // moment), or balanced by state bytes with cuts on 8-bit blocks.
  enum class Zero1 { kElementwise, kWholeTensors, kQuantizedBlocks };
  Zero1 zero1;
  // 8-bit moments for the tensors of at least AdamW8bitOptions::min_8bit_size elements.
  bool quantized_8bit;
  // training.offload: the chunked AdamW that updates during backward (OffloadedAdamW), or the
  // generic offload of groups of whole tensors, each its own instance of this optimizer.
  enum class Offload { kChunkedAdamW, kGroups };
  Offload offload;
  // The optimizers with less state the planner's advice suggests for a job of this one that
  // does not fit (train/planner.cc).
  std::vector<OptimKind> leaner = {};
};

// Every row, in OptimKind order.
const std::vector<OptimizerRow>& Optimizers();
// The row named `name`, or null (the caller names the known ones: OptimizerNames()).
const OptimizerRow* FindOptimizer(std::string_view name);
// The row of a parsed spec's training.optim (the job spec refused any other name); an unknown
// name (a TrainingSpec built by hand) aborts naming it.
const OptimizerRow& OptimizerOf(const TrainingSpec& training);
// "adamw, adafactor, adamw_8bit, sgd": for messages.
std::string OptimizerNames();

// The optimizer `training.optim` names, with its options from `training` (adam_*, weight_decay,
// optim_args), over `params` (views into buffers of `num_params` floats). INVALID_ARGUMENT for
// options it rejects; RESOURCE_EXHAUSTED when its state does not fit the arena.
// `quantized` (adamw_8bit only; ZeRO-1's slices): AdamW8bitOptions::quantized.
Result<std::unique_ptr<Optimizer>> MakeOptimizer(const TrainingSpec& training,
                                                 const std::vector<ParamInfo>& params,
                                                 int64_t num_params, DeviceArena* arena,
                                                 const std::vector<bool>& quantized = {});

// The bytes MakeOptimizer allocates (exactly) for `params` in a flat buffer of `num_params`.
int64_t OptimizerPlanBytes(const TrainingSpec& training, const std::vector<ParamInfo>& params,
                           int64_t num_params, const std::vector<bool>& quantized = {});

}  // namespace traind::engine
