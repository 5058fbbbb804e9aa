// The step loop (step_loop.h): StepRunner steps, the fp16 loss scaler, reports, logging windows
// (LogHistory), evaluation and checkpoints.
#include "train/step_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// The open logging window's throughput (this process's steps only; not checkpointed).
struct WindowTiming {
  double seconds = 0.0;
  int64_t tokens = 0;
};

}  // namespace

namespace {

// Evaluate for the encoder families: the validation examples in order, B per pass (the last
// pass padded with empty rows: mask 0, no target). The loss is the mean over every target
// (masked_lm: masked positions; classification: labelled examples); with classification also
// the accuracy over the labelled examples.
Result<double> EvaluateExamples(TrainingSession* s, std::optional<double>* accuracy) {
  const ExampleData& data = *s->examples;
  const ExampleSet& set = data.validation;
  const int64_t B = s->B, T = s->T;
  const int64_t n = set.size();
  if (n <= 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T)),
      mask(static_cast<size_t>(B * T));
  std::vector<int64_t> rows(static_cast<size_t>(B)), epochs(static_cast<size_t>(B), kEvalMaskEpoch);
  // Sums over this rank's passes: loss x targets, targets, correct predictions.
  double sums[3] = {0.0, 0.0, 0.0};
  int64_t pass = -1;
  for (int64_t first = 0; first < n; first += B) {
    if (++pass % s->world != s->rank) continue;
    if (s->Cancelled()) return Status::Cancelled("job cancelled during evaluation");
    for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = first + b < n ? first + b : -1;
    FillExampleBatch(data, set, rows.data(), epochs.data(), B, inputs.data(), targets.data(),
                     mask.data());
    int64_t valid = 0;
    for (int32_t t : targets) valid += t != -1 ? 1 : 0;
    if (valid == 0) continue;  // nothing to score (e.g. no masked position in the pass)
    s->backend->CopyHostToDevice(s->model->inputs(), inputs.data(), inputs.size() * sizeof(int32_t));
    s->backend->CopyHostToDevice(s->model->targets(), targets.data(), targets.size() * sizeof(int32_t));
    if (s->model->attention_mask() != nullptr) {  // causal instruction data: none
      s->backend->CopyHostToDevice(s->model->attention_mask(), mask.data(),
                                   mask.size() * sizeof(int32_t));
    }
    // Forward's loss is the mean over the pass's targets.
    sums[0] += s->model->Forward(/*for_backward=*/false, 1.0f) * static_cast<double>(valid);
    sums[1] += static_cast<double>(valid);
    if (data.classification) sums[2] += static_cast<double>(s->model->CorrectPredictions());
  }
  if (s->comm != nullptr) {  // every rank's sums (doubles as two f32 lanes), added in rank order
    std::vector<double> all(static_cast<size_t>(3 * s->world));
    TRAIND_RETURN_IF_ERROR(s->comm->AllGather(sums, all.data(), 6, CommDType::kF32));
    sums[0] = sums[1] = sums[2] = 0.0;
    for (int r = 0; r < s->world; ++r) {
      for (int i = 0; i < 3; ++i) sums[i] += all[static_cast<size_t>(3 * r + i)];
    }
  }
  if (sums[1] <= 0) return std::numeric_limits<double>::quiet_NaN();
  if (data.classification && accuracy != nullptr) *accuracy = sums[2] / sums[1];
  return sums[0] / sums[1];
}

}  // namespace

Result<double> Evaluate(TrainingSession* s, std::optional<double>* accuracy) {
  if (s->examples != nullptr) return EvaluateExamples(s, accuracy);
  const TokenStream& tokens = s->validation_tokens;
  const int64_t B = s->B, T = s->T;
  const int64_t n = tokens.size();
  const int64_t windows = n > 0 ? (n - 1) / T : 0;
  if (windows <= 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  double weighted = 0.0;
  // Data parallel: sharded by pass (rank r runs passes r, r + W, ...), the weighted sums gathered.
  int64_t pass = -1;
  for (int64_t first = 0; first < windows; first += B) {
    if (++pass % s->world != s->rank) continue;
    if (s->Cancelled()) return Status::Cancelled("job cancelled during evaluation");
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
    s->backend->CopyHostToDevice(s->model->inputs(), inputs.data(), inputs.size() * sizeof(int32_t));
    s->backend->CopyHostToDevice(s->model->targets(), targets.data(), targets.size() * sizeof(int32_t));
    // Forward's loss is the mean over the pass's real positions (count * T of them).
    weighted += s->model->Forward(/*for_backward=*/false, 1.0f) * static_cast<double>(count);
  }
  if (s->comm != nullptr) {  // every rank's sum (a double as two f32 lanes), added in rank order
    std::vector<double> sums(static_cast<size_t>(s->world));
    TRAIND_RETURN_IF_ERROR(s->comm->AllGather(&weighted, sums.data(), 2, CommDType::kF32));
    weighted = 0.0;
    for (double v : sums) weighted += v;
  }
  return weighted / static_cast<double>(windows);
}

Status RunStepLoop(TrainingSession* s, double* last_eval) {
  const TrainingSpec& t = s->spec.training;
  const RunCallbacks& callbacks = *s->callbacks;
  TrainerState& state = s->state;
  const int64_t B = s->B, T = s->T, accum = s->accum;
  // The causal families read token windows, the encoders examples (one of the two loaders).
  std::optional<BatchLoader> windows;
  std::optional<ExampleLoader> examples;
  if (s->examples != nullptr) {
    examples.emplace(s->examples.get(), B, s->spec.data.shuffle, static_cast<uint64_t>(t.seed),
                     state.loader);
    s->windows_per_epoch = examples->examples_per_epoch();
  } else {
    windows.emplace(s->train_tokens, B, T, s->spec.data.shuffle, static_cast<uint64_t>(t.seed),
                    state.loader);
    s->windows_per_epoch = windows->windows_per_epoch();
  }
  auto loader_position = [&]() {
    return examples.has_value() ? examples->position() : windows->position();
  };
  // Data parallel: the step's numbers are the world's (W ranks x B x accum sequences).
  const int64_t world = s->world;
  LogHistory history(&state.log_history, B * accum * world, s->windows_per_epoch);
  const double step_flops =
      Model::TrainingFlops(s->config, B, T) * static_cast<double>(accum * world);
  // Tokens per step: B x T per micro-batch, padding included for the encoders (their examples are
  // padded to T; samples/s counts examples).
  const int64_t step_tokens = B * T * accum * world;
  *last_eval = std::numeric_limits<double>::quiet_NaN();

  auto run_eval = [&]() -> Status {
    std::optional<double> accuracy;
    TRAIND_ASSIGN_OR_RETURN(double loss, Evaluate(s, &accuracy));
    *last_eval = loss;
    s->last_eval_accuracy = accuracy;
    if (std::isnan(loss)) return Status::Ok();
    history.AddEval(state.global_step, loss, accuracy);
    if (callbacks.on_eval) callbacks.on_eval(EvalReport{state.global_step, loss, accuracy});
    return Status::Ok();
  };
  // The newest step with a checkpoint in output_dir (the resumed one, or none for a fresh run).
  int64_t saved_step = s->first_step;
  auto save = [&]() -> Status {
    if (!s->writes_outputs()) {  // data parallel: rank 0 writes the world's (identical) state
      // ZeRO-1: rank 0 gathers every rank's shard of the optimizer state.
      TRAIND_RETURN_IF_ERROR(s->optimizer->ContributeState());
      saved_step = state.global_step;
      return Status::Ok();
    }
    TRAIND_ASSIGN_OR_RETURN(std::string dir,
                            SaveCheckpoint(s->spec.output_dir, s->spec, s->model.get(), *s->optimizer,
                                           state, s->windows_per_epoch));
    saved_step = state.global_step;
    if (callbacks.on_checkpoint) callbacks.on_checkpoint(state.global_step, dir);
    return Status::Ok();
  };

  WindowTiming window;
  double last_lr = 0.0, last_norm = 0.0;
  // fp16: dynamic loss scaling, restored from the checkpoint on resume (a fresh scaler when the
  // checkpoint has none); skipped steps still count as steps.
  LossScaler scaler;
  if (t.fp16 && state.loss_scaler.has_value()) scaler.Restore(*state.loss_scaler);
  StepRunner::Options step_options;
  step_options.accumulation_steps = accum;
  step_options.fp16 = t.fp16;
  step_options.max_grad_norm = t.max_grad_norm;
  step_options.dropout_seed = static_cast<uint64_t>(t.seed);
  step_options.first_step = state.global_step;
  step_options.communicator = s->comm;
  // Instruction data: the loss over the step's loss-carrying tokens (HF's num_items_in_batch).
  step_options.normalize_over_step = s->examples != nullptr && s->examples->train.token_labelled();
  // Data parallel on cpu (Gloo) and cuda:N (NCCL): the gradient all-reduce (ZeRO-1:
  // reduce-scatter) in buckets of TRAIND_DIST_BUCKET_MB (default 4; 0 = one collective after
  // backward), overlapped with backward. simt runs no data parallel (refused at start).
  if (s->comm != nullptr && (s->device == "cpu" || s->device.rfind("cuda:", 0) == 0)) {
    double bucket_mb = 4.0;
    if (const char* mb = std::getenv("TRAIND_DIST_BUCKET_MB"); mb != nullptr && *mb != 0) {
      char* end = nullptr;
      const double v = std::strtod(mb, &end);
      if (end != mb && *end == 0 && v >= 0 && v <= 1048576) {
        bucket_mb = v;
      } else {
        s->Message(std::string("TRAIND_DIST_BUCKET_MB='") + mb +
                   "' is not a size in MiB (a number from 0 to 1048576); using 4");
      }
    }
    step_options.overlap_bucket_bytes = static_cast<int64_t>(bucket_mb * 1048576.0);
  }
  // TRAIND_CUDA_GRAPHS=0 turns capture off without a rebuild (the escape hatch for a device where
  // capture misbehaves; docs/simt.md).
  const char* graphs_env = std::getenv("TRAIND_CUDA_GRAPHS");
  step_options.use_graphs =
      s->options->device.cuda_graphs && !(graphs_env != nullptr && std::string(graphs_env) == "0");
  // The offloaded update may start during backward where the order allows (no clipping); on cpu,
  // whose ops have finished when backward's per-block hook runs.
  step_options.update_during_backward = s->device == "cpu";
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner,
                          StepRunner::Create(step_options, s->model.get(), s->optimizer.get(),
                                             s->arena.get()));
  if (runner->updates_during_backward()) {
    s->Message("training.offload: max_grad_norm 0, so each block's parameters update while backward "
               "goes on below it (the embeddings after it)");
  }
  // Each micro-batch of a step comes from the loader; cancellation is checked before each. Data
  // parallel: the loader walks the one-process order and rank r keeps every W-th micro-batch from
  // the r-th (micro-batch k*W + r of the step), so its position is the world's.
  std::vector<int32_t> skipped_in, skipped_tg, skipped_mask;
  if (world > 1) {
    skipped_in.resize(static_cast<size_t>(B * T));
    skipped_tg.resize(static_cast<size_t>(B * T));
    skipped_mask.resize(static_cast<size_t>(B * T));
  }
  auto next_batch = [&](int32_t* in, int32_t* tg, double* wait) -> Status {
    if (s->Cancelled()) {
      return Status::Cancelled("job cancelled at step " + std::to_string(state.global_step + 1));
    }
    for (int64_t r = 0; r < world; ++r) {
      const bool mine = r == s->rank;
      *wait += windows->Next(mine ? in : skipped_in.data(), mine ? tg : skipped_tg.data());
    }
    return Status::Ok();
  };
  // Encoders: the same walk over examples, with their attention masks.
  std::vector<int32_t> ones;
  auto next_examples = [&](int32_t* in, int32_t* tg, int32_t* mask, double* wait) -> Status {
    if (s->Cancelled()) {
      return Status::Cancelled("job cancelled at step " + std::to_string(state.global_step + 1));
    }
    if (mask == nullptr) {  // a model without a mask input (not expected for an encoder)
      ones.resize(static_cast<size_t>(B * T));
      mask = ones.data();
    }
    for (int64_t r = 0; r < world; ++r) {
      const bool mine = r == s->rank;
      *wait += examples->Next(mine ? in : skipped_in.data(), mine ? tg : skipped_tg.data(),
                              mine ? mask : skipped_mask.data());
    }
    return Status::Ok();
  };
  while (state.global_step < t.max_steps) {
    // Preemption lands on a step boundary: the last finished step is made durable, then the run
    // stops resumable (every report of that step has gone out, so nothing logged is lost).
    bool preempted = s->Preempted();
    if (s->optimizer->sharded()) {
      // ZeRO-1: the checkpoint gathers every rank's optimizer state, so the world stops at the
      // same boundary: one rank's preemption is every rank's (one float per step).
      float flag = preempted ? 1.0f : 0.0f;
      TRAIND_RETURN_IF_ERROR(s->comm->AllReduceSum(&flag, 1, CommDType::kF32));
      preempted = flag > 0.0f;
    }
    if (preempted) {
      const int64_t step = state.global_step;
      if (step == 0) return Status::Aborted("preempted before the first step; nothing to save");
      if (saved_step != step) TRAIND_RETURN_IF_ERROR(save());
      if (!s->writes_outputs()) {
        return Status::Aborted("preempted at step " + std::to_string(step) + " on rank " +
                               std::to_string(s->rank) + " (rank 0 writes the checkpoints)");
      }
      return Status::Aborted("preempted at step " + std::to_string(step) + "; checkpoint-" +
                             std::to_string(step) + " written");
    }
    const Clock::time_point step_start = Clock::now();
    double wait = 0.0;
    const float loss_scale = t.fp16 ? scaler.scale() : 1.0f;
    const double lr =
        t.learning_rate * LrLambda(s->schedule, t.warmup_steps, t.max_steps, state.global_step);
    const OptimizerStateStoreStats io_before = s->store ? s->store->Stats() : OptimizerStateStoreStats{};
    const CommStats comm_before = s->metered_comm ? s->metered_comm->stats() : CommStats{};
    TRAIND_ASSIGN_OR_RETURN(StepRunner::Outcome outcome,
                            examples.has_value()
                                ? runner->Run(StepRunner::NextMaskedBatch(next_examples), lr,
                                              loss_scale, &wait)
                                : runner->Run(StepRunner::NextBatch(next_batch), lr, loss_scale,
                                              &wait));
    if (state.global_step == s->first_step) {
      if (runner->replaying()) {
        s->Message(s->device + ": training step captured as CUDA graphs (one per upload slot" +
                   (s->optimizer->issues_from_device_scalars()
                        ? std::string(" and one for the optimizer), replayed every step")
                        : std::string("; " + s->optimizer->name() +
                                      " steps from the host between them), replayed every step")));
      } else if (!runner->capture_error().ok()) {
        s->Message(s->device + ": CUDA graph capture failed (" + runner->capture_error().ToString() +
                   "); running the steps op by op");
      }
    }
    const bool skipped = t.fp16 && scaler.Update(outcome.skipped);
    state.global_step += 1;
    state.loader = loader_position();
    state.train_loss_sum += outcome.loss;
    state.window_loss_sum += outcome.loss;
    state.window_steps += 1;
    last_lr = lr;
    if (!skipped) last_norm = outcome.grad_norm;  // a skipped step's norm is not finite: logs keep the last
    if (t.fp16) {
      state.window_skipped += skipped ? 1 : 0;
      state.loss_scaler = scaler.state();
    }
    const double step_seconds = Seconds(step_start, Clock::now());
    window.seconds += step_seconds;
    window.tokens += step_tokens;

    if (callbacks.on_step) {
      StepReport r;
      r.step = state.global_step;
      r.max_steps = t.max_steps;
      r.loss = outcome.loss;
      r.learning_rate = lr;
      r.grad_norm = outcome.grad_norm;
      r.skipped = skipped;
      r.step_seconds = step_seconds;
      r.dataloader_wait_seconds = wait;
      r.tokens = step_tokens;
      r.samples = B * accum * world;
      r.memory_used_bytes = s->arena->used_bytes();
      r.memory_peak_bytes = s->arena->peak_bytes();
      r.model_flops = step_flops;
      if (s->store != nullptr) {
        const OptimizerStateStoreStats io = s->store->Stats();
        r.offload_read_bytes = static_cast<int64_t>(io.read_bytes - io_before.read_bytes);
        r.offload_written_bytes = static_cast<int64_t>(io.written_bytes - io_before.written_bytes);
        r.offload_io_seconds = io.io_wait_seconds - io_before.io_wait_seconds;
        r.offload_background_io_seconds = io.background_io_seconds - io_before.background_io_seconds;
        r.offload_store_bytes = static_cast<int64_t>(io.store_bytes);
        r.offload_updated_during_backward = outcome.updated_during_backward;
      }
      if (s->metered_comm != nullptr) {
        const CommStats& comm = s->metered_comm->stats();
        // Not hidden: the collectives' time minus what the gradient buckets overlapped.
        r.comm_hidden_seconds = outcome.comm_hidden_seconds;
        r.comm_seconds = std::max(0.0, comm.seconds - comm_before.seconds - outcome.comm_hidden_seconds);
        r.comm_bytes = comm.bytes_sent - comm_before.bytes_sent;
        auto op = [&](CommOp o) {
          const int i = static_cast<int>(o);
          return comm.bytes_by_op[i] - comm_before.bytes_by_op[i];
        };
        r.comm_all_reduce_bytes = op(CommOp::kAllReduce);
        r.comm_reduce_scatter_bytes = op(CommOp::kReduceScatter);
        r.comm_all_gather_bytes = op(CommOp::kAllGather);
        r.comm_broadcast_bytes = op(CommOp::kBroadcast);
      }
      r.expert_tokens = s->model->TakeExpertTokens();
      if (!r.expert_tokens.empty()) r.expert_layers = s->config.num_layers();
      callbacks.on_step(r);
    }
    const bool last = state.global_step == t.max_steps;
    if ((t.logging_steps > 0 && state.global_step % t.logging_steps == 0) ||
        (last && state.window_steps > 0)) {
      const double window_loss = state.window_loss_sum / static_cast<double>(state.window_steps);
      std::optional<LogHistory::LossScaleWindow> fp16;
      if (t.fp16) fp16 = LogHistory::LossScaleWindow{state.window_skipped, scaler.scale()};
      history.AddTrainWindow(state.global_step, window_loss, last_lr, last_norm, fp16);
      state.window_skipped = 0;
      if (callbacks.on_log) {
        LogReport r;
        r.step = state.global_step;
        r.loss = window_loss;
        r.learning_rate = last_lr;
        r.grad_norm = last_norm;
        r.tokens_per_second = window.seconds > 0 ? window.tokens / window.seconds : 0.0;
        r.samples_per_second = window.seconds > 0 ? window.tokens / T / window.seconds : 0.0;
        callbacks.on_log(r);
      }
      state.window_loss_sum = 0.0;
      state.window_steps = 0;
      window = WindowTiming{};
    }
    if ((t.eval_steps > 0 && state.global_step % t.eval_steps == 0) || last) {
      TRAIND_RETURN_IF_ERROR(run_eval());
    }
    if ((t.save_steps > 0 && state.global_step % t.save_steps == 0) || last) {
      TRAIND_RETURN_IF_ERROR(save());
    }
    if (t.sample_every > 0 && state.global_step % t.sample_every == 0 && s->writes_outputs()) {
      TRAIND_RETURN_IF_ERROR(SampleNow(s, state.global_step));
    }
  }
  if (s->first_step == t.max_steps) {
    // Resumed from the final checkpoint: nothing left to train; report its evaluation again.
    TRAIND_ASSIGN_OR_RETURN(*last_eval, Evaluate(s, &s->last_eval_accuracy));
  }
  return Status::Ok();
}

}  // namespace traind::engine
