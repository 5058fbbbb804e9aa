// The step loop (step_loop.h): the evaluation pass, then the loop's parts (its options made once,
// the training batches, the step report, the logging window, the preemption handshake) and the
// loop over them: StepRunner steps, the fp16 loss scaler, evaluation, checkpoints and samples.
#include "train/step_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/environment.h"
#include "optim/loss_scaler.h"
#include "train/log_history.h"
#include "train/sampler.h"
#include "train/step_runner.h"

namespace traind::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

namespace {

// Evaluate for the encoder families: the validation examples in order, B per pass (the last
// pass padded with empty rows: mask 0, no target). The loss is the mean over every target
// (masked_lm: masked positions; classification: labelled examples); with classification also
// the accuracy over the labelled examples.
Result<double> EvaluateExamples(const TrainingSession& s, std::optional<double>* accuracy) {
  const DevicePlan& dp = s.device_plan();
  const DataParallel& p = s.parallel();
  Backend& backend = *s.objects().backend;
  Model& model = *s.objects().model;
  const ExampleData& data = *s.data().examples;
  const ExampleSet& set = data.validation;
  const int64_t B = dp.B, T = dp.T;
  const int64_t n = set.size();
  if (n <= 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T)),
      mask(static_cast<size_t>(B * T * set.MaskWords()));
  std::vector<int64_t> rows(static_cast<size_t>(B)), epochs(static_cast<size_t>(B), kEvalMaskEpoch);
  // Sums over this rank's passes: loss x targets, targets, correct predictions.
  double sums[3] = {0.0, 0.0, 0.0};
  int64_t pass = -1;
  for (int64_t first = 0; first < n; first += B) {
    if (++pass % p.world != p.rank) continue;
    if (s.request().Cancelled()) return Status::Cancelled("job cancelled during evaluation");
    for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = first + b < n ? first + b : -1;
    FillExampleBatch(data, set, rows.data(), epochs.data(), B, inputs.data(), targets.data(),
                     mask.data());
    int64_t valid = 0;
    for (int32_t t : targets) valid += t != -1 ? 1 : 0;
    if (valid == 0) continue;  // nothing to score (e.g. no masked position in the pass)
    backend.CopyHostToDevice(model.inputs(), inputs.data(), inputs.size() * sizeof(int32_t));
    backend.CopyHostToDevice(model.targets(), targets.data(), targets.size() * sizeof(int32_t));
    if (model.attention_mask() != nullptr) {  // encoders' mask; decoders' doc_start, positions
      backend.CopyHostToDevice(model.attention_mask(), mask.data(),
                                   mask.size() * sizeof(int32_t));
    }
    // Forward's loss is the mean over the pass's targets.
    sums[0] += model.Forward(/*for_backward=*/false, 1.0f) * static_cast<double>(valid);
    sums[1] += static_cast<double>(valid);
    if (data.classification) sums[2] += static_cast<double>(model.CorrectPredictions());
  }
  if (p.comm != nullptr) {  // every rank's sums (doubles as two f32 lanes), added in rank order
    std::vector<double> all(static_cast<size_t>(3 * p.world));
    TRAIND_RETURN_IF_ERROR(p.comm->AllGather(sums, all.data(), 6, CommDType::kF32));
    sums[0] = sums[1] = sums[2] = 0.0;
    for (int r = 0; r < p.world; ++r) {
      for (int i = 0; i < 3; ++i) sums[i] += all[static_cast<size_t>(3 * r + i)];
    }
  }
  if (sums[1] <= 0) return std::numeric_limits<double>::quiet_NaN();
  if (data.classification && accuracy != nullptr) *accuracy = sums[2] / sums[1];
  return sums[0] / sums[1];
}

}  // namespace

Result<double> Evaluate(const TrainingSession& s, std::optional<double>* accuracy) {
  if (s.data().examples != nullptr) return EvaluateExamples(s, accuracy);
  const DevicePlan& dp = s.device_plan();
  const DataParallel& p = s.parallel();
  Backend& backend = *s.objects().backend;
  Model& model = *s.objects().model;
  const TokenStream& tokens = s.data().validation_tokens;
  const int64_t B = dp.B, T = dp.T;
  const int64_t n = tokens.size();
  const int64_t windows = n > 0 ? (n - 1) / T : 0;
  if (windows <= 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  double weighted = 0.0;
  // Data parallel: sharded by pass (rank r runs passes r, r + W, ...), the weighted sums gathered.
  int64_t pass = -1;
  for (int64_t first = 0; first < windows; first += B) {
    if (++pass % p.world != p.rank) continue;
    if (s.request().Cancelled()) return Status::Cancelled("job cancelled during evaluation");
    const int64_t count = std::min(B, windows - first);
    for (int64_t b = 0; b < B; ++b) {
      int32_t* in = inputs.data() + b * T;
      int32_t* tg = targets.data() + b * T;
      if (b < count) {
        tokens.CopyWindow((first + b) * T, T, in);
        tokens.CopyWindow((first + b) * T + 1, T, tg);
      } else {
        std::fill(in, in + T, 0);
        std::fill(tg, tg + T, -1);
      }
    }
    backend.CopyHostToDevice(model.inputs(), inputs.data(), inputs.size() * sizeof(int32_t));
    backend.CopyHostToDevice(model.targets(), targets.data(), targets.size() * sizeof(int32_t));
    // Forward's loss is the mean over the pass's real positions (count * T of them).
    weighted += model.Forward(/*for_backward=*/false, 1.0f) * static_cast<double>(count);
  }
  if (p.comm != nullptr) {  // every rank's sum (a double as two f32 lanes), added in rank order
    std::vector<double> sums(static_cast<size_t>(p.world));
    TRAIND_RETURN_IF_ERROR(p.comm->AllGather(&weighted, sums.data(), 2, CommDType::kF32));
    weighted = 0.0;
    for (double v : sums) weighted += v;
  }
  return weighted / static_cast<double>(windows);
}

// ---- The step loop's parts. RunStepLoop at the bottom reads like llm.c's train loop: options
// made once, then per step: the preemption check, one optimizer step, its report, the logging
// window, and evaluation / checkpoint / sample at their intervals. ----

namespace {

// Everything the loop decides before its first step, from the spec, the session's shape, the
// device's capabilities and the environment (core/environment.h), made in one place
// (MakeLoopOptions): no part below reads the spec's training block, an environment variable or a
// device name again.
struct LoopOptions {
  StepRunner::Options step;  // what the step runner is made with
  int64_t max_steps = 0;
  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0, sample_every = 0;
  bool fp16 = false;
  // The learning rate of step k: learning_rate * LrLambda(schedule, warmup_steps, max_steps, k).
  double learning_rate = 0.0;
  LrScheduleType schedule = LrScheduleType::kConstant;
  int64_t warmup_steps = 0;
  // Data parallel: the step's numbers are the world's (W ranks x B x accum sequences). Tokens per
  // step: B x T per micro-batch, padding included for the encoders (their examples are padded to
  // T; samples/s counts examples).
  int64_t step_samples = 0, step_tokens = 0;
  double step_flops = 0.0;
  int64_t layers = 0;  // the model's (the step report's expert_layers)
};

// TRAIND_DIST_BUCKET_MB in bytes: a number of MiB from 0 to 1048576 (0 = one collective after
// backward), 4 MiB when unset; a bad value is named through `note` and the default used.
int64_t DistBucketBytes(const std::optional<std::string>& mb,
                        const std::function<void(const std::string&)>& note) {
  double bucket_mb = 4.0;
  if (mb.has_value()) {
    const char* text = mb->c_str();
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end != text && *end == 0 && v >= 0 && v <= 1048576) {
      bucket_mb = v;
    } else {
      note("TRAIND_DIST_BUCKET_MB='" + *mb +
           "' is not a size in MiB (a number from 0 to 1048576); using 4");
    }
  }
  return static_cast<int64_t>(bucket_mb * 1048576.0);
}

LoopOptions MakeLoopOptions(const TrainingSession& s, const EngineEnvironment& env) {
  const TrainingSpec& t = s.spec().training;
  const DevicePlan& dp = s.device_plan();
  const DataParallel& p = s.parallel();
  LoopOptions o;
  o.max_steps = t.max_steps;
  o.logging_steps = t.logging_steps;
  o.eval_steps = t.eval_steps;
  o.save_steps = t.save_steps;
  o.sample_every = t.sample_every;
  o.fp16 = t.fp16;
  o.learning_rate = t.learning_rate;
  o.schedule = dp.schedule;
  o.warmup_steps = t.warmup_steps;
  o.step_samples = dp.B * dp.accum * p.world;
  o.step_tokens = dp.B * dp.T * dp.accum * p.world;
  o.step_flops = Model::TrainingFlops(dp.config, dp.B, dp.T) * static_cast<double>(dp.accum * p.world);
  o.layers = dp.config.num_layers();

  StepRunner::Options& r = o.step;
  r.accumulation_steps = dp.accum;
  r.fp16 = t.fp16;
  r.max_grad_norm = t.max_grad_norm;
  r.dropout_seed = static_cast<uint64_t>(t.seed);
  r.first_step = s.progress().state.global_step;
  r.communicator = p.comm;
  // Instruction data: the loss over the step's loss-carrying tokens (HF's num_items_in_batch).
  const ExampleData* examples = s.data().examples.get();
  r.normalize_over_step = examples != nullptr && examples->train.token_labelled();
  // Data parallel (Gloo on cpu, NCCL on cuda:N; a device data parallel cannot reduce is refused
  // at start): the gradient all-reduce (ZeRO-1: reduce-scatter) in buckets of
  // TRAIND_DIST_BUCKET_MB, overlapped with backward.
  if (p.comm != nullptr && dp.capabilities.data_parallel()) {
    r.overlap_bucket_bytes =
        DistBucketBytes(env.dist_bucket_mb, [&s](const std::string& line) { s.Message(line); });
  }
  // TRAIND_CUDA_GRAPHS=0 turns capture off without a rebuild (docs/simt.md).
  r.use_graphs = s.request().options->device.cuda_graphs && !env.cuda_graphs_off;
  // The offloaded update may start during backward where the order allows (no clipping), on a
  // device whose ops have finished when backward's per-block hook runs.
  r.update_during_backward = dp.capabilities.update_overlaps_backward();
  return o;
}

// The training batches: one of two loaders (token windows for the causal families' text, examples
// for the encoders and instruction data), walked in the one-process order; data parallel: rank r
// keeps every W-th micro-batch from the r-th (micro-batch k*W + r of the step), so the position
// is the world's. Cancellation is checked before each micro-batch.
class TrainBatches {
 public:
  // Reads the run's request (cancellation), its batch shape, its data and world, and the state's
  // loader position (where a resume continues) and step (for the cancellation message).
  TrainBatches(const RunRequest& r, const DevicePlan& dp, const TrainingData& data,
               const DataParallel& p, const TrainerState& state)
      : r_(r), p_(p), state_(state), B_(dp.B), T_(dp.T) {
    const uint64_t seed = static_cast<uint64_t>(r.spec.training.seed);
    if (data.examples != nullptr) {
      examples_.emplace(data.examples.get(), B_, r.spec.data.shuffle, seed, state.loader);
      per_epoch_ = examples_->examples_per_epoch();
    } else {
      windows_.emplace(data.train_tokens, B_, T_, r.spec.data.shuffle, seed, state.loader);
      per_epoch_ = windows_->windows_per_epoch();
    }
    if (p.world > 1) {
      skipped_in_.resize(static_cast<size_t>(B_ * T_));
      skipped_tg_.resize(static_cast<size_t>(B_ * T_));
      skipped_mask_.resize(static_cast<size_t>(2 * B_ * T_));  // up to ExampleSet::MaskWords()
    }
  }

  int64_t per_epoch() const { return per_epoch_; }
  LoaderPosition position() const {
    return examples_.has_value() ? examples_->position() : windows_->position();
  }

  // One optimizer step of `runner` over the next accum micro-batches.
  Result<StepRunner::Outcome> Step(StepRunner* runner, double lr, float loss_scale,
                                   double* wait) {
    if (examples_.has_value()) {
      return runner->Run(StepRunner::NextMaskedBatch(
                             [this](int32_t* in, int32_t* tg, int32_t* mask, double* w) {
                               return NextExamples(in, tg, mask, w);
                             }),
                         lr, loss_scale, wait);
    }
    return runner->Run(StepRunner::NextBatch([this](int32_t* in, int32_t* tg, double* w) {
                         return NextWindows(in, tg, w);
                       }),
                       lr, loss_scale, wait);
  }

 private:
  Status CheckCancelled() const {
    if (!r_.Cancelled()) return Status::Ok();
    return Status::Cancelled("job cancelled at step " + std::to_string(state_.global_step + 1));
  }
  Status NextWindows(int32_t* in, int32_t* tg, double* wait) {
    TRAIND_RETURN_IF_ERROR(CheckCancelled());
    for (int64_t r = 0; r < p_.world; ++r) {
      const bool mine = r == p_.rank;
      *wait += windows_->Next(mine ? in : skipped_in_.data(), mine ? tg : skipped_tg_.data());
    }
    return Status::Ok();
  }
  // The same walk over examples, with their attention masks.
  Status NextExamples(int32_t* in, int32_t* tg, int32_t* mask, double* wait) {
    TRAIND_RETURN_IF_ERROR(CheckCancelled());
    if (mask == nullptr) {  // a model without a mask input (not expected for an encoder)
      ones_.resize(static_cast<size_t>(2 * B_ * T_));
      mask = ones_.data();
    }
    for (int64_t r = 0; r < p_.world; ++r) {
      const bool mine = r == p_.rank;
      *wait += examples_->Next(mine ? in : skipped_in_.data(), mine ? tg : skipped_tg_.data(),
                               mine ? mask : skipped_mask_.data());
    }
    return Status::Ok();
  }

  const RunRequest& r_;
  const DataParallel& p_;
  const TrainerState& state_;
  const int64_t B_, T_;
  std::optional<BatchLoader> windows_;
  std::optional<ExampleLoader> examples_;
  int64_t per_epoch_ = 0;
  std::vector<int32_t> skipped_in_, skipped_tg_, skipped_mask_, ones_;
};

// What one step measured, for its report and the logging window.
struct StepResult {
  StepRunner::Outcome outcome;
  double lr = 0.0;
  bool skipped = false;  // fp16: the loss scaler skipped the update (the step still counts)
  double seconds = 0.0, wait = 0.0;
};

// The counters a step report takes differences of, read before the step.
struct StepCounters {
  OptimizerStateStoreStats io;
  CommStats comm;
};

StepCounters ReadCounters(OptimizerStateStore* store, const MeteredCommunicator* comm) {
  return {store != nullptr ? store->Stats() : OptimizerStateStoreStats{},
          comm != nullptr ? comm->stats() : CommStats{}};
}

// The offload store's part of a step report: its traffic since `before`.
void AddOffloadFigures(StepReport* r, const OptimizerStateStore& store,
                       const OptimizerStateStoreStats& before, int64_t updated_during_backward) {
  const OptimizerStateStoreStats io = store.Stats();
  r->offload_read_bytes = static_cast<int64_t>(io.read_bytes - before.read_bytes);
  r->offload_written_bytes = static_cast<int64_t>(io.written_bytes - before.written_bytes);
  r->offload_io_seconds = io.io_wait_seconds - before.io_wait_seconds;
  r->offload_background_io_seconds = io.background_io_seconds - before.background_io_seconds;
  r->offload_store_bytes = static_cast<int64_t>(io.store_bytes);
  r->offload_updated_during_backward = updated_during_backward;
}

// The collectives' part of a step report: their traffic since `before`; the time not hidden is
// the collectives' time minus what the gradient buckets overlapped.
void AddCommFigures(StepReport* r, const CommStats& comm, const CommStats& before,
                    double hidden_seconds) {
  r->comm_hidden_seconds = hidden_seconds;
  r->comm_seconds = std::max(0.0, comm.seconds - before.seconds - hidden_seconds);
  r->comm_bytes = comm.bytes_sent - before.bytes_sent;
  auto op = [&](CommOp o) {
    const int i = static_cast<int>(o);
    return comm.bytes_by_op[i] - before.bytes_by_op[i];
  };
  r->comm_all_reduce_bytes = op(CommOp::kAllReduce);
  r->comm_reduce_scatter_bytes = op(CommOp::kReduceScatter);
  r->comm_all_gather_bytes = op(CommOp::kAllGather);
  r->comm_broadcast_bytes = op(CommOp::kBroadcast);
}

// The step report (RunCallbacks::on_step) of the step just finished (`step_number`): the one place
// it is built, from the step's figures, the arena's memory, the store's and the collectives'
// traffic and the model's expert routing.
StepReport BuildStepReport(int64_t step_number, const LoopOptions& o, const StepResult& step,
                           const StepCounters& before, const DeviceObjects& d,
                           const MeteredCommunicator* comm) {
  StepReport r;
  r.step = step_number;
  r.max_steps = o.max_steps;
  r.loss = step.outcome.loss;
  r.learning_rate = step.lr;
  r.grad_norm = step.outcome.grad_norm;
  r.skipped = step.skipped;
  r.step_seconds = step.seconds;
  r.dataloader_wait_seconds = step.wait;
  r.tokens = o.step_tokens;
  r.samples = o.step_samples;
  r.memory_used_bytes = d.arena->used_bytes();
  r.memory_peak_bytes = d.arena->peak_bytes();
  r.model_flops = o.step_flops;
  if (d.store != nullptr) {
    AddOffloadFigures(&r, *d.store, before.io, step.outcome.updated_during_backward);
  }
  if (comm != nullptr) {
    AddCommFigures(&r, comm->stats(), before.comm, step.outcome.comm_hidden_seconds);
  }
  r.expert_tokens = d.model->TakeExpertTokens();  // taken: the next step counts afresh
  if (!r.expert_tokens.empty()) r.expert_layers = o.layers;
  return r;
}

// The open logging window: the losses and norms of its steps (in TrainerState, so a resume
// continues it) and its throughput (this process's steps only; not checkpointed). Closed every
// logging_steps and at the last step: one log_history entry and one LogReport.
class LogWindow {
 public:
  LogWindow(TrainerState* state, LogHistory* history, const LoopOptions& o, int64_t T)
      : state_(state), history_(history), fp16_(o.fp16), T_(T), step_tokens_(o.step_tokens) {}

  void Add(const StepResult& step) {
    state_->window_loss_sum += step.outcome.loss;
    state_->window_steps += 1;
    last_lr_ = step.lr;
    // A skipped step's norm is not finite: the logs keep the last.
    if (!step.skipped) last_norm_ = step.outcome.grad_norm;
    if (fp16_) state_->window_skipped += step.skipped ? 1 : 0;
    seconds_ += step.seconds;
    tokens_ += step_tokens_;
  }

  bool open() const { return state_->window_steps > 0; }

  void Close(const LossScaler& scaler, const std::function<void(const LogReport&)>& on_log) {
    const double loss = state_->window_loss_sum / static_cast<double>(state_->window_steps);
    std::optional<LogHistory::LossScaleWindow> fp16;
    if (fp16_) fp16 = LogHistory::LossScaleWindow{state_->window_skipped, scaler.scale()};
    history_->AddTrainWindow(state_->global_step, loss, last_lr_, last_norm_, fp16);
    state_->window_skipped = 0;
    if (on_log) {
      LogReport r;
      r.step = state_->global_step;
      r.loss = loss;
      r.learning_rate = last_lr_;
      r.grad_norm = last_norm_;
      r.tokens_per_second = seconds_ > 0 ? tokens_ / seconds_ : 0.0;
      r.samples_per_second = seconds_ > 0 ? tokens_ / T_ / seconds_ : 0.0;
      on_log(r);
    }
    state_->window_loss_sum = 0.0;
    state_->window_steps = 0;
    seconds_ = 0.0;
    tokens_ = 0;
  }

 private:
  TrainerState* state_;
  LogHistory* history_;
  const bool fp16_;
  const int64_t T_, step_tokens_;
  double last_lr_ = 0.0, last_norm_ = 0.0;
  double seconds_ = 0.0;
  int64_t tokens_ = 0;
};

// Whether this step boundary is where the run stops for preemption. ZeRO-1: the checkpoint
// gathers every rank's optimizer state, so the world stops at the same boundary: one rank's
// preemption is every rank's (one float all-reduced per step).
Result<bool> PreemptionHandshake(const RunRequest& r, const Optimizer& optimizer,
                                 Communicator* comm) {
  bool preempted = r.Preempted();
  if (optimizer.sharded()) {
    float flag = preempted ? 1.0f : 0.0f;
    TRAIND_RETURN_IF_ERROR(comm->AllReduceSum(&flag, 1, CommDType::kF32));
    preempted = flag > 0.0f;
  }
  return preempted;
}

// The first step's note on CUDA graphs: captured and replayed, or why not.
void NoteGraphs(const RunRequest& r, const std::string& device, const Optimizer& optimizer,
                const StepRunner& runner) {
  if (runner.replaying()) {
    r.Message(device + ": training step captured as CUDA graphs (one per upload slot" +
              (optimizer.issues_from_device_scalars()
                   ? std::string(" and one for the optimizer), replayed every step")
                   : std::string("; " + optimizer.name() +
                                 " steps from the host between them), replayed every step")));
  } else if (!runner.capture_error().ok()) {
    r.Message(device + ": CUDA graph capture failed (" + runner.capture_error().ToString() +
              "); running the steps op by op");
  }
}

// Whether step `step` is a multiple of a positive `every`.
bool Every(int64_t step, int64_t every) { return every > 0 && step % every == 0; }

// The loop itself and its named steps, over the parts above.
class StepLoop {
 public:
  StepLoop(TrainingSession* s, const LoopOptions& o, double* last_eval)
      : session_(*s), o_(o), r_(s->request()), p_(s->parallel()), d_(s->objects()),
        progress_(s->progress()), state_(progress_.state),
        batches_(r_, s->device_plan(), s->data(), p_, state_), last_eval_(last_eval),
        saved_step_(progress_.first_step) {
    progress_.windows_per_epoch = batches_.per_epoch();
    history_.emplace(&state_.log_history, o.step_samples, progress_.windows_per_epoch);
    window_.emplace(&state_, &*history_, o, s->device_plan().T);
    // fp16: dynamic loss scaling, restored from the checkpoint on resume (a fresh scaler when the
    // checkpoint has none); skipped steps still count as steps.
    if (o.fp16 && state_.loss_scaler.has_value()) scaler_.Restore(*state_.loss_scaler);
    *last_eval = std::numeric_limits<double>::quiet_NaN();
  }

  Status Run() {
    TRAIND_ASSIGN_OR_RETURN(runner_, StepRunner::Create(o_.step, d_.model.get(),
                                                        d_.optimizer.get(), d_.arena.get()));
    if (runner_->updates_during_backward()) {
      r_.Message("training.offload: max_grad_norm 0, so each block's parameters update while "
                 "backward goes on below it (the embeddings after it)");
    }
    while (state_.global_step < o_.max_steps) {
      // Preemption lands on a step boundary: the last finished step is made durable, then the
      // run stops resumable (every report of that step has gone out, so nothing logged is lost).
      TRAIND_ASSIGN_OR_RETURN(bool preempted, PreemptionHandshake(r_, *d_.optimizer, p_.comm));
      if (preempted) return StopPreempted();
      TRAIND_ASSIGN_OR_RETURN(StepResult step, TrainStep());
      window_->Add(step);
      const int64_t k = state_.global_step;
      if (r_.callbacks->on_step) {
        r_.callbacks->on_step(BuildStepReport(k, o_, step, before_, d_, p_.metered_comm.get()));
      }
      const bool last = k == o_.max_steps;
      if (Every(k, o_.logging_steps) || (last && window_->open())) {
        window_->Close(scaler_, r_.callbacks->on_log);
      }
      if (Every(k, o_.eval_steps) || last) TRAIND_RETURN_IF_ERROR(EvalNow());
      if (Every(k, o_.save_steps) || last) TRAIND_RETURN_IF_ERROR(SaveNow());
      if (Every(k, o_.sample_every) && p_.writes_outputs()) {
        TRAIND_RETURN_IF_ERROR(SampleNow(r_, d_.sampler.get(), k));
      }
    }
    if (progress_.first_step == o_.max_steps) {
      // Resumed from the final checkpoint: nothing left to train; report its evaluation again.
      TRAIND_ASSIGN_OR_RETURN(*last_eval_, Evaluate(session_, &progress_.last_eval_accuracy));
    }
    return Status::Ok();
  }

 private:
  // One optimizer step at the schedule's learning rate; advances global_step and the loader's
  // position.
  Result<StepResult> TrainStep() {
    const Clock::time_point start = Clock::now();
    StepResult step;
    const float loss_scale = o_.fp16 ? scaler_.scale() : 1.0f;
    step.lr = o_.learning_rate *
              LrLambda(o_.schedule, o_.warmup_steps, o_.max_steps, state_.global_step);
    before_ = ReadCounters(d_.store, p_.metered_comm.get());
    TRAIND_ASSIGN_OR_RETURN(step.outcome,
                            batches_.Step(runner_.get(), step.lr, loss_scale, &step.wait));
    if (state_.global_step == progress_.first_step) {
      NoteGraphs(r_, session_.device_plan().device, *d_.optimizer, *runner_);
    }
    step.skipped = o_.fp16 && scaler_.Update(step.outcome.skipped);
    state_.global_step += 1;
    state_.loader = batches_.position();
    state_.train_loss_sum += step.outcome.loss;
    if (o_.fp16) state_.loss_scaler = scaler_.state();
    step.seconds = Seconds(start, Clock::now());
    return step;
  }

  // Evaluation: the validation loss (and accuracy) into the history and RunCallbacks::on_eval.
  Status EvalNow() {
    std::optional<double> accuracy;
    TRAIND_ASSIGN_OR_RETURN(double loss, Evaluate(session_, &accuracy));
    *last_eval_ = loss;
    progress_.last_eval_accuracy = accuracy;
    if (std::isnan(loss)) return Status::Ok();
    history_->AddEval(state_.global_step, loss, accuracy);
    if (r_.callbacks->on_eval) {
      r_.callbacks->on_eval(EvalReport{state_.global_step, loss, accuracy});
    }
    return Status::Ok();
  }

  // A checkpoint of the step just finished. Data parallel: rank 0 writes the world's (identical)
  // state; ZeRO-1: rank 0 gathers every rank's shard of the optimizer state.
  Status SaveNow() {
    if (!p_.writes_outputs()) {
      TRAIND_RETURN_IF_ERROR(d_.optimizer->ContributeState());
      saved_step_ = state_.global_step;
      return Status::Ok();
    }
    TRAIND_ASSIGN_OR_RETURN(std::string dir,
                            SaveCheckpoint(r_.spec.output_dir, r_.spec, d_.model.get(),
                                           *d_.optimizer, state_, progress_.windows_per_epoch));
    saved_step_ = state_.global_step;
    if (r_.callbacks->on_checkpoint) r_.callbacks->on_checkpoint(state_.global_step, dir);
    return Status::Ok();
  }

  // Preempted at a step boundary: the step just finished made durable (unless its checkpoint
  // was just written), then ABORTED, resumable.
  Status StopPreempted() {
    const int64_t step = state_.global_step;
    if (step == 0) return Status::Aborted("preempted before the first step; nothing to save");
    if (saved_step_ != step) TRAIND_RETURN_IF_ERROR(SaveNow());
    if (!p_.writes_outputs()) {
      return Status::Aborted("preempted at step " + std::to_string(step) + " on rank " +
                             std::to_string(p_.rank) + " (rank 0 writes the checkpoints)");
    }
    return Status::Aborted("preempted at step " + std::to_string(step) + "; checkpoint-" +
                           std::to_string(step) + " written");
  }

  const TrainingSession& session_;  // read-only: for Evaluate and the device's name
  const LoopOptions& o_;
  const RunRequest& r_;
  const DataParallel& p_;
  DeviceObjects& d_;
  Progress& progress_;
  TrainerState& state_;
  TrainBatches batches_;
  double* last_eval_;
  std::optional<LogHistory> history_;
  std::optional<LogWindow> window_;
  LossScaler scaler_;
  std::unique_ptr<StepRunner> runner_;
  StepCounters before_;
  int64_t saved_step_;  // the newest step with a checkpoint (the resumed one, or none: fresh run)
};

}  // namespace

Status RunStepLoop(TrainingSession* s, double* last_eval) {
  const LoopOptions options = MakeLoopOptions(*s, ReadEngineEnvironment());
  StepLoop loop(s, options, last_eval);
  return loop.Run();
}

}  // namespace traind::engine
