// ZeRO stage 1 (distributed.zero_stage: 1): the optimizer state sharded over the ranks of a
// data-parallel run. Rank r owns a contiguous range [begin_r, end_r) of the model's flat
// trainable buffer and keeps the state of that range only, through an ordinary optimizer
// (MakeOptimizer) over the range's slices of the parameters (1-D views named as the parameters).
// The ranges split inside tensors: AdamW and SGD are elementwise (ranges balanced by element
// count: [N r / W, N (r+1) / W)); 8-bit AdamW is blockwise inside its 8-bit tensors, so there a
// range starts on one of the tensor's 256-element quantization blocks and a slice keeps its whole
// tensor's 8-bit / fp32 choice (ranges balanced by state bytes). A step: the caller has
// reduce-scattered the gradients over the ranks (this rank's range holds the sum, the rest of the
// buffer partial sums, never read here) and put the global sum of squares (every rank's range's,
// added) in the step scalars; IssueStep / Step update the rank's range; GatherParams then brings
// every rank's updated range to every rank.
//
// Checkpoints hold the same optimizer.safetensors as an unsharded run ("<hf_name>.<state>" with
// the parameter's shape, the inner optimizer's format and step): SaveState / WriteState gather
// every rank's state (each full tensor is its slices in rank order), streamed from each rank's
// StateStream in bounded frames, so every other rank must call ContributeState at the same point. LoadState takes
// a full state file (written by any world size, sharded or not) and keeps the rank's slice of each
// tensor (elements, or 8-bit AdamW's absmax blocks). Adafactor factors its second moment per
// matrix: its ranges hold whole tensors (balanced by state floats, cut at tensor boundaries).
//
// With training.offload (a store given to Create) the inner optimizer is the offloaded one
// (offloaded_optimizer.h) over the same slices: each rank keeps only its shard's state, in its
// own store, and only a window of it in device memory (8-bit AdamW's groups keep each slice's
// 8-bit / fp32 choice, as in memory).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"
#include "traind/engine/communicator.h"
#include "traind/engine/optimizer_state_store.h"

namespace traind::engine {

// OK when training.optim can be sharded (adamw, adamw_8bit, sgd, adafactor); INVALID_ARGUMENT
// naming the field otherwise.
Status CheckZeroOneOptimizer(const TrainingSpec& training);

// Every rank's range [first, second) of a flat buffer of `num_params` elements holding `params`
// in a world of `world` (see the header comment); contiguous, covering [0, num_params).
std::vector<std::pair<int64_t, int64_t>> ZeroOneShards(const TrainingSpec& training,
                                                       const std::vector<ParamInfo>& params,
                                                       int64_t num_params, int world);

// The optimizer bytes (OptimizerPlanBytes) of the largest rank's shard: what each rank plans.
int64_t ZeroOnePlanBytes(const TrainingSpec& training, const std::vector<ParamInfo>& params,
                         int64_t num_params, int world);

// ZeRO-1 with training.offload: over the ranks, the largest device window of the rank's offloaded
// optimizer (OffloadedOptimizerDeviceBytes of its slices) and the largest shard's state in its
// store (OptimizerPlanBytes of its slices).
struct ZeroOneOffloadBytes {
  int64_t window = 0;
  int64_t state = 0;
};
ZeroOneOffloadBytes ZeroOneOffloadPlanBytes(const TrainingSpec& training,
                                            const std::vector<ParamInfo>& params,
                                            int64_t num_params, int world);

class ShardedOptimizer final : public Optimizer {
 public:
  // The optimizer training.optim names over this rank's shard of `params` (views into a flat
  // buffer of `num_params` floats), its state allocated from `arena`. `comm` (world > 1) must
  // outlive the optimizer. INVALID_ARGUMENT for an optimizer that cannot be sharded or a buffer
  // too small for every rank to own a range; the inner optimizer's errors otherwise. `store`
  // (training.offload; not owned, must outlive the optimizer): the shard's state lives there.
  static Result<std::unique_ptr<ShardedOptimizer>> Create(const TrainingSpec& training,
                                                          const std::vector<ParamInfo>& params,
                                                          int64_t num_params, Communicator* comm,
                                                          DeviceArena* arena,
                                                          OptimizerStateStore* store = nullptr);

  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  // The optimizer state bytes of this rank's shard (where it is kept: the arena, or the store).
  int64_t shard_state_bytes() const { return shard_state_bytes_; }

  std::string name() const override { return inner_->name(); }
  int64_t step() const override { return inner_->step(); }
  bool issues_from_device_scalars() const override { return inner_->issues_from_device_scalars(); }
  void FillNextStep(StepScalars* s) const override { inner_->FillNextStep(s); }
  // The update of the rank's range only (`params` and `grads` are the whole flat buffers).
  void IssueStep(float* params, const float* grads, const StepScalars* device_scalars) override;
  void CountStep() override { inner_->CountStep(); }
  void Step(float* params, const float* grads, double lr, float grad_scale) override;
  Status status() const override;

  bool sharded() const override { return true; }
  std::vector<std::pair<int64_t, int64_t>> shard_ranges() const override { return ranges_; }
  // Every rank's range from its owner, in place: one all-gather with a count per rank
  // (Communicator::AllGatherInPlace; device memory the backend has finished writing). A
  // collective: every rank calls it after every step.
  Status GatherParams(float* params) override;
  // The unsharded state (the collective half on every rank: see ContributeState), gathered as a
  // stream (StateGather in the .cc): each rank's shard comes out of its optimizer's StateStream
  // (with offload: the store, a chunk or a group at a time) and crosses to the writer in bounded
  // frames, so no rank holds a shard's state in host memory, let alone every rank's. WriteState
  // streams it to the file; SaveState collects it (tests, small states).
  SafetensorsFile SaveState() const override;
  Status WriteState(const std::string& path) const override;
  Status ContributeState() const override;
  // The rank's slice of a full state file. DATA_LOSS naming the tensor that does not match.
  Status LoadState(const SafetensorsFile& file) override;
  // LoadState of the file at `path`, read by ranges: only the rank's slice of each tensor
  // (SafetensorsReader::ReadRange), never the whole file. In memory: the slices, then the inner
  // LoadState. With training.offload: the slices are streamed (bounded pieces) into a shard file
  // beside `path` ("<path>.rank<R>.tmp", removed after) that the offloaded optimizer's own
  // ReadState streams into its store, so no more than a piece and one group are in RAM at once.
  Status ReadState(const std::string& path) override;

 private:
  ShardedOptimizer(std::vector<ParamInfo> params, Communicator* comm)
      : params_(std::move(params)), comm_(comm) {}
  class StateGather;

  std::vector<ParamInfo> params_;  // the whole model's
  std::vector<ParamInfo> local_;   // the slices in this rank's range (offsets from begin_)
  std::vector<size_t> local_of_;   // local_[i] is a slice of params_[local_of_[i]]
  bool blockwise_ = false;         // adamw_8bit: "<name>.*_absmax" tensors hold one per block
  bool offloaded_ = false;         // inner_ is the offloaded optimizer (training.offload)
  Communicator* comm_;
  int64_t num_params_ = 0;
  int64_t begin_ = 0, end_ = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // every rank's
  int64_t shard_state_bytes_ = 0;
  std::unique_ptr<Optimizer> inner_;
  mutable Status gather_status_;  // the first failed collective of SaveState (const)
};

}  // namespace traind::engine
