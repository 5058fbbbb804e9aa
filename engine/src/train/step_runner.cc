// StepRunner: see step_runner.h.
#include "train/step_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/dropout_rng.h"
#include "optim/adamw.h"  // AccumulateGradSquares: the global gradient norm, shared by all optimizers

namespace traind::engine {
namespace {

// A slot's payload: inputs (B*T int32), targets (B*T int32), then two floats: the micro-batch's
// cross-entropy gradient scale and its loss weight, then the micro-batch's LoRA dropout key (a
// uint64, 8-byte aligned: B*T*8 + 8 bytes precede it); for a model with an attention mask, the
// mask (B*T*mask_words int32) after the key.
size_t SlotBytes(int64_t tokens, int64_t mask_words = 0) {
  return static_cast<size_t>(tokens) * static_cast<size_t>(8 + 4 * mask_words) +
         2 * sizeof(float) + sizeof(uint64_t);
}
size_t KeyOffset(int64_t tokens) { return static_cast<size_t>(tokens) * 8 + 2 * sizeof(float); }
size_t MaskOffset(int64_t tokens) { return KeyOffset(tokens) + sizeof(uint64_t); }

}  // namespace

int64_t StepRunner::PlanBytes(int64_t B, int64_t T, int64_t mask_words) {
  return 2 * static_cast<int64_t>(SlotBytes(B * T, mask_words)) +
         static_cast<int64_t>(sizeof(StepScalars));
}

int64_t StepRunner::MaskWords(Model* model) {
  if (model->attention_mask() == nullptr) return 0;
  return model->options().example_rows && !model->config().encoder() ? 2 : 1;
}

StepRunner::StepRunner(const Options& options, Model* model, Optimizer* optimizer,
                       DeviceArena* arena)
    : options_(options),
      model_(model),
      optimizer_(optimizer),
      arena_(arena),
      backend_(arena->backend()),
      tokens_(model->options().micro_batch * model->options().seq_len),
      mask_(MaskWords(model)) {}

StepRunner::~StepRunner() {
  backend_->Synchronize();  // no upload or step may still use the buffers
  upload_.reset();
  for (unsigned char* s : slots_) {
    if (s != nullptr) arena_->Release(s);
  }
  if (scalars_ != nullptr) arena_->Release(scalars_);
}

Result<std::unique_ptr<StepRunner>> StepRunner::Create(const Options& options, Model* model,
                                                       Optimizer* optimizer,
                                                       DeviceArena* arena) {
  if (options.accumulation_steps < 1) {
    return Status::InvalidArgument("training.gradient_accumulation_steps: must be >= 1, got " +
                                   std::to_string(options.accumulation_steps));
  }
  std::unique_ptr<StepRunner> r(new StepRunner(options, model, optimizer, arena));
  // mixtral reads its routing back mid-step: nothing to capture.
  if (!model->capturable()) r->options_.use_graphs = false;
  if (options.communicator != nullptr) {
    r->world_ = options.communicator->world_size();
    r->rank_ = options.communicator->rank();
    r->options_.use_graphs = false;  // the all-reduce runs between the micro-batches and the step
  }
  if (optimizer->sharded()) {
    if (r->world_ <= 1) {
      return Status::InvalidArgument("a sharded (zero_stage 1) optimizer needs the communicator");
    }
    r->shards_ = optimizer->shard_ranges();
    if (static_cast<int>(r->shards_.size()) != r->world_) {
      return Status::Internal("zero_stage 1: the optimizer has " +
                              std::to_string(r->shards_.size()) + " shards for a world of " +
                              std::to_string(r->world_));
    }
    // This rank's range of each parameter: the gradients the norm reads (the rest holds partial
    // sums after the reduce-scatter).
    const auto [b, e] = r->shards_[static_cast<size_t>(r->rank_)];
    for (const ParamInfo& p : model->trainable_params()) {
      const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
      if (lo >= hi) continue;
      ParamInfo q = p;
      q.offset = lo;
      q.numel = hi - lo;
      q.shape = {hi - lo};
      r->shard_params_.push_back(std::move(q));
    }
  }
  if (r->world_ > 1 && options.overlap_bucket_bytes > 0) {
    r->overlap_ = std::make_unique<OverlappedAllReduce>(
        options.communicator, model->trainable_params(), model->num_trainable(),
        options.overlap_bucket_bytes, r->shards_);
    // The buckets wait for the backward that produced them (an event on cuda, nothing on cpu).
    TRAIND_RETURN_IF_ERROR(r->overlap_->UseMarkers(r->backend_));
  }
  if (options.update_during_backward && optimizer->updates_during_backward() && r->world_ == 1 &&
      !model->lora() && !options.fp16 && !(options.max_grad_norm > 0.0)) {
    r->final_from_ = FinalFromOffsets(model->trainable_params(), model->config().num_layers());
  }
  r->micro_index_ = static_cast<uint64_t>(options.first_step) *
                    static_cast<uint64_t>(options.accumulation_steps);
  const size_t bytes = SlotBytes(r->tokens_, r->mask_);
  for (int i = 0; i < 2; ++i) {
    TRAIND_ASSIGN_OR_RETURN(void* p, arena->Allocate(MemoryCategory::kActivations,
                                                     static_cast<int64_t>(bytes),
                                                     "micro-batch upload slot " + std::to_string(i)));
    r->slots_[i] = static_cast<unsigned char*>(p);
  }
  TRAIND_ASSIGN_OR_RETURN(void* s, arena->Allocate(MemoryCategory::kActivations,
                                                   sizeof(StepScalars), "step scalars"));
  r->scalars_ = static_cast<StepScalars*>(s);
  TRAIND_ASSIGN_OR_RETURN(r->upload_, r->backend_->MakeBatchUpload(bytes));
  model->ZeroGrad();
  return r;
}

Status StepRunner::Stage(int slot, const NextMaskedBatch& next_batch, float loss_scale,
                         double* wait) {
  TRAIND_ASSIGN_OR_RETURN(void* host, upload_->HostSlot(slot));
  auto* inputs = static_cast<int32_t*>(host);
  int32_t* targets = inputs + tokens_;
  int32_t* mask = mask_ ? reinterpret_cast<int32_t*>(static_cast<unsigned char*>(host) +
                                                     MaskOffset(tokens_))
                        : nullptr;
  TRAIND_RETURN_IF_ERROR(next_batch(inputs, targets, mask, wait));
  int64_t valid = 0;
  for (int64_t i = 0; i < tokens_; ++i) valid += targets[i] != -1 ? 1 : 0;
  // As the host-side loss: d(mean over micro-batches of the mean loss)/dlogits, times the scale.
  const float micro_scale =
      1.0f / static_cast<float>(options_.accumulation_steps * static_cast<int64_t>(world_));
  const float grad_scale = micro_scale * loss_scale;
  float scalars[2] = {valid > 0 ? grad_scale / static_cast<float>(valid) : 0.0f,
                      valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f};
  if (step_targets_ >= 0.0) {
    // Over the step: every token's loss / the world's count of targets (the loss weight makes
    // Run's loss_sum / (accum * world) that same ratio).
    const double n = step_targets_;
    scalars[0] = n > 0 ? static_cast<float>(static_cast<double>(loss_scale) / n) : 0.0f;
    scalars[1] = n > 0 ? static_cast<float>(static_cast<double>(options_.accumulation_steps) *
                                            static_cast<double>(world_) / n)
                       : 0.0f;
  }
  std::memcpy(targets + tokens_, scalars, sizeof(scalars));
  // The micro-batch's index in the one-process run (this rank's own index in a world of one).
  uint64_t index = micro_index_++;
  if (world_ > 1) {
    const uint64_t accum = static_cast<uint64_t>(options_.accumulation_steps);
    const uint64_t w = static_cast<uint64_t>(world_);
    index = (index / accum) * accum * w + (index % accum) * w + static_cast<uint64_t>(rank_);
  }
  const uint64_t key = DropoutMicroBatchKey(options_.dropout_seed, index);
  std::memcpy(static_cast<unsigned char*>(host) + KeyOffset(tokens_), &key, sizeof(key));
  return upload_->Upload(slot, slots_[slot], SlotBytes(tokens_, mask_));
}

void StepRunner::IssueMicroBatch(int slot) {
  const auto* inputs = reinterpret_cast<const int32_t*>(slots_[slot]);
  const int32_t* targets = inputs + tokens_;
  const auto* scalars = reinterpret_cast<const float*>(targets + tokens_);
  const size_t bytes = static_cast<size_t>(tokens_) * sizeof(int32_t);
  backend_->CopyDeviceToDevice(model_->inputs(), inputs, bytes);
  backend_->CopyDeviceToDevice(model_->targets(), targets, bytes);
  if (uint64_t* key = model_->dropout_key(); key != nullptr) {
    backend_->CopyDeviceToDevice(key, slots_[slot] + KeyOffset(tokens_), sizeof(uint64_t));
  }
  if (mask_) {
    backend_->CopyDeviceToDevice(model_->attention_mask(), slots_[slot] + MaskOffset(tokens_),
                                 bytes * static_cast<size_t>(mask_));
  }
  model_->ForwardOnDevice(&scalars[0], &scalars[1], &scalars_->loss_sum);
  model_->Backward();
}

Status StepRunner::ShardedGradSquares() {
  AccumulateGradSquares(backend_, model_->grad_data(), shard_params_, &scalars_->grad_sq);
  backend_->CopyDeviceToHost(&grad_sq_host_, &scalars_->grad_sq, sizeof(grad_sq_host_));
  backend_->Synchronize();
  TRAIND_RETURN_IF_ERROR(backend_->status());
  // Every rank's sum (a double: two f32 lanes of raw bytes, so an inf or NaN travels as it is),
  // added in rank order: the same bits on every rank.
  static_assert(sizeof(grad_sq_host_) == 2 * sizeof(float));
  std::vector<double> sums(static_cast<size_t>(world_));
  TRAIND_RETURN_IF_ERROR(
      options_.communicator->AllGather(&grad_sq_host_, sums.data(), 2, CommDType::kF32));
  grad_sq_host_ = 0.0;
  for (double v : sums) grad_sq_host_ += v;
  backend_->CopyHostToDevice(&scalars_->grad_sq, &grad_sq_host_, sizeof(grad_sq_host_));
  return Status::Ok();
}

void StepRunner::IssueOptimizer() {
  AccumulateGradSquares(backend_, model_->grad_data(), model_->trainable_params(), &scalars_->grad_sq);
  optimizer_->IssueStep(model_->trainable_data(), model_->grad_data(), scalars_);
  if (!model_->lora()) model_->ParamsChanged();  // 16-bit weights follow the update (LoRA: frozen)
  model_->ZeroGrad();       // ready for the next step's accumulation
}

Status StepRunner::GatherUpdate() {
  backend_->Synchronize();
  TRAIND_RETURN_IF_ERROR(backend_->status());
  TRAIND_RETURN_IF_ERROR(optimizer_->GatherParams(model_->trainable_data()));
  if (!model_->lora()) model_->ParamsChanged();
  model_->ZeroGrad();
  return Status::Ok();
}

Status StepRunner::HostDrivenOptimizer(double lr, StepScalars* host) {
  if (optimizer_->sharded()) {
    TRAIND_RETURN_IF_ERROR(ShardedGradSquares());
  } else {
    AccumulateGradSquares(backend_, model_->grad_data(), model_->trainable_params(),
                          &scalars_->grad_sq);
  }
  backend_->CopyDeviceToHost(host, scalars_, sizeof(*host));
  backend_->Synchronize();
  TRAIND_RETURN_IF_ERROR(backend_->status());
  if (!(host->skip_nonfinite != 0 && !std::isfinite(host->grad_sq))) {
    const float multiplier = StepGradMultiplier(host->grad_sq, host->loss_scale, host->max_grad_norm);
    optimizer_->Step(model_->trainable_data(), model_->grad_data(), lr, multiplier);
    TRAIND_RETURN_IF_ERROR(optimizer_->status());
    if (!model_->lora() && !optimizer_->sharded()) model_->ParamsChanged();
  }
  if (optimizer_->sharded()) return GatherUpdate();  // every rank, skipped step or not
  model_->ZeroGrad();
  return Status::Ok();
}

std::vector<int64_t> StepRunner::FinalFromOffsets(const std::vector<ParamInfo>& params, int64_t num_layers) {
  const int64_t L = num_layers;
  int64_t blocks_end = -1;  // the end of the last block parameter
  for (const ParamInfo& p : params) {
    const int64_t b = BlockOfParam(p.hf_name);
    if (b >= L) return {};
    if (b >= 0) blocks_end = std::max(blocks_end, p.offset + p.numel);
  }
  if (L <= 0 || blocks_end < 0) return {};
  // Each parameter's "final after block" key: its block; L for the tail past every block (final
  // before the blocks' backward); -1 for the rest (final at the end).
  std::vector<int64_t> key(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t b = BlockOfParam(params[i].hf_name);
    key[i] = b >= 0 ? b : (params[i].offset >= blocks_end ? L : -1);
  }
  std::vector<int64_t> from(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    int64_t lo = std::numeric_limits<int64_t>::max(), below_end = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (key[i] >= l) {
        lo = std::min(lo, params[i].offset);
      } else {
        below_end = std::max(below_end, params[i].offset + params[i].numel);
      }
    }
    if (below_end > lo) return {};  // a parameter final later lies inside the final suffix
    from[static_cast<size_t>(l)] = lo;
  }
  return from;
}

Status StepRunner::Capture() {
  for (int slot = 0; slot < 2; ++slot) {
    TRAIND_RETURN_IF_ERROR(backend_->BeginCapture());
    IssueMicroBatch(slot);
    TRAIND_ASSIGN_OR_RETURN(micro_graph_[slot], backend_->EndCapture());
  }
  if (!optimizer_->issues_from_device_scalars()) {  // the optimizer step runs from the host
    captured_ = true;
    return backend_->status();
  }
  TRAIND_RETURN_IF_ERROR(backend_->BeginCapture());
  IssueOptimizer();
  TRAIND_ASSIGN_OR_RETURN(optimizer_graph_, backend_->EndCapture());
  TRAIND_RETURN_IF_ERROR(backend_->status());
  captured_ = true;
  return Status::Ok();
}

Result<StepRunner::Outcome> StepRunner::Run(const NextBatch& next_batch, double lr,
                                            float loss_scale, double* wait) {
  const int64_t tokens = tokens_;
  return Run(
      NextMaskedBatch([&next_batch, tokens, this](int32_t* in, int32_t* tg, int32_t* mask,
                                                  double* w) {
        if (mask != nullptr && mask_ == 2) {  // one sequence a row: doc_start 0, position t
          const int64_t T = model_->options().seq_len;
          std::fill(mask, mask + tokens, 0);
          for (int64_t n = 0; n < tokens; ++n) mask[tokens + n] = static_cast<int32_t>(n % T);
        } else if (mask != nullptr) {
          std::fill(mask, mask + tokens, 1);
        }
        return next_batch(in, tg, w);
      }),
      lr, loss_scale, wait);
}

Status StepRunner::ReadStep(const NextMaskedBatch& next_batch, double* wait) {
  const int64_t accum = options_.accumulation_steps;
  const size_t per = static_cast<size_t>(tokens_ * (2 + std::max<int64_t>(mask_, 1)));
  step_batches_.resize(per * static_cast<size_t>(accum));
  double count = 0.0;
  for (int64_t a = 0; a < accum; ++a) {
    int32_t* in = step_batches_.data() + per * static_cast<size_t>(a);
    int32_t* tg = in + tokens_;
    int32_t* mask = tg + tokens_;
    TRAIND_RETURN_IF_ERROR(next_batch(in, tg, mask, wait));
    for (int64_t i = 0; i < tokens_; ++i) count += tg[i] != -1 ? 1.0 : 0.0;
  }
  if (options_.communicator != nullptr && world_ > 1) {
    // Every rank's count (a double as two f32 lanes), added in rank order.
    std::vector<double> counts(static_cast<size_t>(world_));
    TRAIND_RETURN_IF_ERROR(
        options_.communicator->AllGather(&count, counts.data(), 2, CommDType::kF32));
    count = 0.0;
    for (double v : counts) count += v;
  }
  step_targets_ = count;
  return Status::Ok();
}

// long function: one step's issue order (stage, micro-batches, reduce, update, read back, capture)
Result<StepRunner::Outcome> StepRunner::Run(const NextMaskedBatch& next_batch_in, double lr,
                                            float loss_scale, double* wait) {
  // normalize_over_step: the step's micro-batches are read (and their targets counted) first,
  // then staged from memory.
  int64_t replayed = 0;
  const NextMaskedBatch from_memory = [this, &replayed](int32_t* in, int32_t* tg, int32_t* mask,
                                                        double*) -> Status {
    const int64_t words = std::max<int64_t>(mask_, 1);
    const size_t per = static_cast<size_t>(tokens_ * (2 + words));
    const int32_t* src = step_batches_.data() + per * static_cast<size_t>(replayed++);
    std::copy(src, src + tokens_, in);
    std::copy(src + tokens_, src + 2 * tokens_, tg);
    if (mask != nullptr) std::copy(src + 2 * tokens_, src + (2 + words) * tokens_, mask);
    return Status::Ok();
  };
  if (options_.normalize_over_step) TRAIND_RETURN_IF_ERROR(ReadStep(next_batch_in, wait));
  const NextMaskedBatch& next_batch = options_.normalize_over_step ? from_memory : next_batch_in;
  StepScalars host;
  host.lr = static_cast<float>(lr);
  host.loss_scale = loss_scale;
  host.max_grad_norm = static_cast<float>(options_.max_grad_norm);
  host.skip_nonfinite = options_.fp16 ? 1 : 0;
  optimizer_->FillNextStep(&host);
  // Nothing of the previous step is in flight (its end read the scalars back).
  backend_->CopyHostToDevice(scalars_, &host, sizeof(host));

  const int64_t accum = options_.accumulation_steps;
  int slot = next_slot_;
  int64_t updated_early = 0;
  TRAIND_RETURN_IF_ERROR(Stage(slot, next_batch, loss_scale, wait));
  for (int64_t a = 0; a < accum; ++a) {
    // The last micro-batch's backward finishes each block's gradients: reduce them meanwhile.
    const bool overlapped = overlap_ != nullptr && a + 1 == accum;
    if (overlapped) {
      overlap_->Arm(model_->grad_data());
      model_->SetOnBlockGradients([this](int64_t layer) { overlap_->BlockDone(layer); });
    }
    // ... or the optimizer updates them meanwhile (the multiplier is 1 / loss_scale: no clipping).
    const bool early = updates_during_backward() && a + 1 == accum && !captured_;
    if (early) {
      optimizer_->BeginStep(model_->trainable_data(), model_->grad_data(), lr,
                            StepGradMultiplier(0.0, host.loss_scale, host.max_grad_norm));
      model_->SetOnBlockGradients(
          [this](int64_t layer) { optimizer_->GradientsFinalFrom(final_from_[static_cast<size_t>(layer)]); });
    }
    if (captured_) {
      TRAIND_RETURN_IF_ERROR(backend_->Replay(micro_graph_[slot]));
    } else {
      IssueMicroBatch(slot);
    }
    if (overlapped || early) model_->SetOnBlockGradients(nullptr);
    if (early) updated_early = optimizer_->updated_during_backward();
    TRAIND_RETURN_IF_ERROR(upload_->Consumed(slot));
    slot = 1 - slot;
    // The next micro-batch loads and uploads while this one computes.
    if (a + 1 < accum) TRAIND_RETURN_IF_ERROR(Stage(slot, next_batch, loss_scale, wait));
  }
  next_slot_ = slot;
  double comm_hidden = 0.0;
  if (overlap_ != nullptr) {
    backend_->Synchronize();
    TRAIND_RETURN_IF_ERROR(backend_->status());
    double comm_seconds = 0.0, waited = 0.0;
    TRAIND_RETURN_IF_ERROR(overlap_->Finish(&comm_seconds, &waited));
    comm_hidden = std::max(0.0, comm_seconds - waited);
  } else if (options_.communicator != nullptr && world_ > 1) {
    // Every rank's gradients summed (each micro-batch already carries 1/(accum * world)): an
    // all-reduce, or (ZeRO-1) a reduce-scatter that leaves each rank its own range's sums.
    backend_->Synchronize();
    TRAIND_RETURN_IF_ERROR(backend_->status());
    TRAIND_RETURN_IF_ERROR(OverlappedAllReduce::ReducePiece(
        options_.communicator, model_->grad_data(), {0, model_->num_trainable()}, shards_));
  }
  if (captured_ && optimizer_graph_ >= 0) {
    TRAIND_RETURN_IF_ERROR(backend_->Replay(optimizer_graph_));
  } else if (optimizer_->issues_from_device_scalars() && optimizer_->sharded()) {
    TRAIND_RETURN_IF_ERROR(ShardedGradSquares());
    optimizer_->IssueStep(model_->trainable_data(), model_->grad_data(), scalars_);
    TRAIND_RETURN_IF_ERROR(GatherUpdate());
  } else if (optimizer_->issues_from_device_scalars()) {
    IssueOptimizer();
  } else {
    TRAIND_RETURN_IF_ERROR(HostDrivenOptimizer(lr, &host));
  }
  backend_->CopyDeviceToHost(&host, scalars_, sizeof(host));
  backend_->Synchronize();
  TRAIND_RETURN_IF_ERROR(backend_->status());

  Outcome out;
  out.comm_hidden_seconds = comm_hidden;
  out.updated_during_backward = updated_early;
  out.loss = host.loss_sum / static_cast<double>(accum);
  if (options_.communicator != nullptr && world_ > 1) {
    // Every rank's loss sum (a double: two f32 lanes of raw bytes), added in rank order, so every
    // rank holds the same bits.
    static_assert(sizeof(host.loss_sum) == 2 * sizeof(float));
    std::vector<double> sums(static_cast<size_t>(world_));
    TRAIND_RETURN_IF_ERROR(
        options_.communicator->AllGather(&host.loss_sum, sums.data(), 2, CommDType::kF32));
    double total = 0.0;
    for (double v : sums) total += v;
    out.loss = total / static_cast<double>(accum * world_);
  }
  out.skipped = options_.fp16 && !std::isfinite(host.grad_sq);
  out.grad_norm = out.skipped ? std::numeric_limits<double>::infinity()
                              : std::sqrt(host.grad_sq) / static_cast<double>(loss_scale);
  if (!out.skipped && optimizer_->issues_from_device_scalars()) optimizer_->CountStep();
  if (options_.use_graphs && !captured_ && capture_error_.ok() && backend_->SupportsGraphs()) {
    const Status captured = Capture();
    if (!captured.ok()) {
      TRAIND_RETURN_IF_ERROR(backend_->status());  // an op failed: the backend is unusable
      capture_error_ = captured;                     // the capture alone failed: run op by op
    }
  }
  return out;
}

}  // namespace traind::engine
