// StepRunner: one optimizer step of a training run, issued on the device without reading anything
// back to the host until the step ends. The trainer's only step path, on every backend.
//
// - Data: micro-batches go through the backend's BatchUpload (double-buffered; pinned host slots
//   and a copy stream on CUDA): micro-batch a+1 is loaded straight into the other host slot and
//   its copy issued while micro-batch a computes. Each slot's payload carries the micro-batch's
//   loss scalars too (its 1/valid-targets factors), so nothing else is copied per micro-batch.
// - Scalars: the step's learning rate, bias corrections, loss scale and clip threshold are one
//   StepScalars copy before the step; the loss and the gradients' sum of squares accumulate in it
//   on the device; AdamW derives its clip factor there (Backend::AdamWFromScalars); one read at
//   the end of the step returns loss, norm and whether an fp16 overflow skipped the update.
// - Graphs: on backends with graph support the first step runs directly (sizing scratch buffers),
//   then three graphs are captured: the micro-batch (copy into the model, forward, backward) for
//   each upload slot, and the optimizer (grad norm, AdamW, 16-bit weight refresh, zeroed
//   gradients). Every later step replays them: accumulation_steps + 1 launches per step.
// - Host-driven optimizers (Optimizer::issues_from_device_scalars() false: SGD, Adafactor): the
//   step reads the gradient norm back after the micro-batches and calls Optimizer::Step with the
//   clip / loss-scale multiplier (no update when an fp16 step overflowed); only the micro-batch
//   graphs are captured.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/arena.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "train/overlapped_allreduce.h"
#include "traind/engine/communicator.h"
#include "traind/engine/status.h"

namespace traind::engine {

class StepRunner {
 public:
  struct Options {
    int64_t accumulation_steps = 1;
    bool fp16 = false;           // gradients carry a loss scale; an overflow skips the update
    double max_grad_norm = 0.0;  // <= 0: no clipping
    bool use_graphs = true;      // capture and replay where the backend supports graphs
    // LoRA dropout: micro-batch a of step s (counting from first_step, the step this runner
    // starts at) draws its masks from DropoutMicroBatchKey(dropout_seed, s * accumulation_steps
    // + a), carried in its upload slot into Model::dropout_key(); so a resumed run draws the
    // masks of the uninterrupted one, and graph replays a fresh key per micro-batch.
    uint64_t dropout_seed = 0;
    int64_t first_step = 0;
    // Data parallel (JOBSPEC.md "Batching semantics"): this rank's micro-batch a of a step is
    // micro-batch a * world + rank of one process accumulating accumulation_steps * world (its
    // gradient scale and dropout key are that one's); after the micro-batches the gradients are
    // summed over the world (so the step's gradient is the mean over every rank's micro-batches)
    // before the norm, clipping and the optimizer step, and the loss is the mean over the world.
    // With a sharded (ZeRO-1) optimizer the sum is a reduce-scatter over its shard_ranges(): each
    // rank receives its own range's sums, and the norm is added up from every rank's range.
    // Null (world of one): nothing of this happens. Graphs are not captured with a communicator.
    Communicator* communicator = nullptr;
    // Data parallel: > 0 reduces the gradients in buckets of about this many bytes while the last
    // micro-batch's backward runs (OverlappedAllReduce: each bucket's collective, on a
    // communication thread, waits for a backend marker recorded after the bucket's backward, so
    // asynchronous backends work too); 0: one all-reduce of the whole buffer after backward.
    int64_t overlap_bucket_bytes = 0;
    // Let an optimizer that can (Optimizer::updates_during_backward: the offloaded AdamW) update
    // the parameters of the blocks whose gradients are final while the last micro-batch's
    // backward goes on below them, where the order allows: no clipping (max_grad_norm <= 0), no
    // fp16, one process, no LoRA, a trainable layout of [embeddings][block 0]..[block L-1][final
    // norm, lm head], no graph replay. For backends whose ops have finished when the backward's
    // hook runs (cpu): on an asynchronous one the update would wait for the device mid-backward.
    bool update_during_backward = false;
    // Instruction data (JOBSPEC.md "Instruction data"): the step's loss is the sum of its token
    // losses over every micro-batch (and rank) divided by the count of targets (HF's
    // num_items_in_batch), not the mean of the micro-batches' means: Run reads the step's
    // micro-batches first, counts their targets (all-reduced over the world) and gives each
    // micro-batch the gradient scale loss_scale / count.
    bool normalize_over_step = false;
  };
  struct Outcome {
    double loss = 0.0;       // mean over the micro-batches (every rank's) of their mean loss
    double grad_norm = 0.0;  // unscaled global norm; +inf when skipped
    bool skipped = false;    // fp16: non-finite gradients, no update applied
    // Data parallel with overlap: seconds of the gradient all-reduce that ran while backward
    // computed (its time inside collectives minus the time the step waited for it).
    double comm_hidden_seconds = 0.0;
    // Options::update_during_backward: elements the optimizer updated during backward.
    int64_t updated_during_backward = 0;
  };
  // Fills one micro-batch (B*T inputs and targets, host memory) and adds the seconds it waited for
  // data to *wait; a non-OK status (e.g. CANCELLED) ends the step with it.
  using NextBatch = std::function<Status(int32_t* inputs, int32_t* targets, double* wait)>;
  // The same with the attention mask (B*T, 1 = real token, 0 = padding) of an encoder model
  // (Model::attention_mask() non-null), or the doc_start and positions (2*B*T) of a decoder with
  // ModelOptions::example_rows: its upload slot carries the mask too. With a NextBatch an
  // encoder's mask is all ones, a decoder's rows one sequence each; with a model without a mask
  // the mask is ignored.
  using NextMaskedBatch =
      std::function<Status(int32_t* inputs, int32_t* targets, int32_t* mask, double* wait)>;

  // The device bytes Create() allocates for a model with micro-batch B and sequence length T
  // (`mask_words`: the int32 per token of the model's attention mask, 0 without one; each upload
  // slot holds B*T*mask_words more int32).
  static int64_t PlanBytes(int64_t B, int64_t T, int64_t mask_words = 0);
  // MaskWords of a model: 0, 1 or 2 (Model::attention_mask()).
  static int64_t MaskWords(Model* model);
  // `model`, `optimizer` and `arena` (and its backend) must outlive the runner. Zeroes the
  // model's gradients. RESOURCE_EXHAUSTED when the buffers do not fit.
  static Result<std::unique_ptr<StepRunner>> Create(const Options& options, Model* model,
                                                    Optimizer* optimizer, DeviceArena* arena);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // One optimizer step at learning rate `lr` with fp16 loss scale `loss_scale` (1 otherwise).
  // Counts the optimizer's step unless it was skipped. A failing backend op or graph call ends it
  // with that error; after an error the model and optimizer state are unspecified.
  Result<Outcome> Run(const NextBatch& next_batch, double lr, float loss_scale, double* wait);
  Result<Outcome> Run(const NextMaskedBatch& next_batch, double lr, float loss_scale,
                      double* wait);

  // True once the step is replayed from graphs.
  bool replaying() const { return captured_; }
  // Options::update_during_backward is in effect (the conditions hold).
  bool updates_during_backward() const { return !final_from_.empty(); }
  // After block l's backward every gradient at flat offsets >= FinalFrom(layout, L)[l] is final:
  // block parameters are final after their block's backward, the final norm and an untied lm
  // head (after every block) before any block's, the rest (embeddings) only at the end. Empty
  // when the trainable layout is not in that order (or has no blocks).
  static std::vector<int64_t> FinalFromOffsets(const std::vector<ParamInfo>& params, int64_t num_layers);
  // Why graph capture failed (OK when it did not). A failed capture is not fatal when the backend
  // is still healthy: the steps keep running op by op.
  const Status& capture_error() const { return capture_error_; }

 private:
  StepRunner(const Options& options, Model* model, Optimizer* optimizer, DeviceArena* arena);
  // Loads micro-batch into host slot `slot` and issues its upload.
  Status Stage(int slot, const NextMaskedBatch& next_batch, float loss_scale, double* wait);
  // Options::normalize_over_step: reads the step's micro-batches into step_batches_ and sets
  // step_targets_ (the world's count of targets).
  Status ReadStep(const NextMaskedBatch& next_batch, double* wait);
  void IssueMicroBatch(int slot);
  // Unsharded optimizers: the norm over the whole buffer, the update, the 16-bit weights, zeroed
  // gradients (what the optimizer graph captures).
  void IssueOptimizer();
  // ZeRO-1: the global sum of squares from the shards into the device scalars: this rank's range
  // only (the rest of the buffer holds partial sums after the reduce-scatter), one double per rank
  // all-gathered and added in rank order, so every rank holds the same bits (an inf or NaN on any
  // rank makes it non-finite everywhere: the fp16 skip is the world's). Synchronizes.
  Status ShardedGradSquares();
  // Host-driven optimizers: reads the norm back, steps from the host (see the header comment).
  Status HostDrivenOptimizer(double lr, StepScalars* host);
  // ZeRO-1 (a sharded optimizer updated only this rank's range): waits for the device, gathers
  // every rank's updated range, then what IssueOptimizer does after the update.
  Status GatherUpdate();
  Status Capture();

  Options options_;
  Model* model_;
  Optimizer* optimizer_;
  DeviceArena* arena_;
  Backend* backend_;
  int64_t tokens_ = 0;  // B*T
  // The model's attention mask in int32 per token, which the slots carry: 0 (none), 1 (the
  // encoders' padding mask), 2 (decoders with ModelOptions::example_rows: doc_start, positions).
  int64_t mask_ = 0;
  std::unique_ptr<BatchUpload> upload_;
  unsigned char* slots_[2] = {nullptr, nullptr};  // device: inputs, targets, scalars, key[, mask]
  StepScalars* scalars_ = nullptr;                 // device
  int next_slot_ = 0;
  uint64_t micro_index_ = 0;  // this rank's index of the next micro-batch staged
  int world_ = 1, rank_ = 0;  // options_.communicator's, else a world of one
  bool captured_ = false;
  Status capture_error_;
  std::vector<int64_t> final_from_;  // FinalFromOffsets when updates run during backward
  std::unique_ptr<OverlappedAllReduce> overlap_;  // options_.overlap_bucket_bytes > 0, world > 1
  // ZeRO-1 (a sharded optimizer): every rank's range, and this rank's range of each parameter.
  std::vector<OverlappedAllReduce::Range> shards_;
  std::vector<ParamInfo> shard_params_;
  double grad_sq_host_ = 0.0;  // ShardedGradSquares' host copy
  std::vector<int32_t> step_batches_;  // normalize_over_step: accum x (inputs, targets, mask)
  double step_targets_ = -1.0;          // < 0: each micro-batch's own mean (stream data)
  int micro_graph_[2] = {-1, -1};
  int optimizer_graph_ = -1;
};

}  // namespace traind::engine
