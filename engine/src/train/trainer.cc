// RunJob: the training loop (micro-batches, accumulation, clipping, AdamW, schedule), evaluation,
// logging windows, checkpoints and resume, and the final HF-layout outputs.
#include "traind/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <vector>

#include "backend/device_registry.h"
#include "backend/arena.h"
#include "data/token_data.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/planner.h"
#include "core/safetensors.h"
#include "train/step_runner.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool IsCancelled(const RunOptions& o) {
  return o.cancel != nullptr && o.cancel->load(std::memory_order_relaxed);
}

void CopyBatch(Backend* backend, Model* model, const std::vector<int32_t>& inputs,
               const std::vector<int32_t>& targets) {
  backend->CopyHostToDevice(model->inputs(), inputs.data(), inputs.size() * sizeof(int32_t));
  backend->CopyHostToDevice(model->targets(), targets.data(), targets.size() * sizeof(int32_t));
}

// Mean loss over every validation window (stride T, in order), B windows per forward pass; the
// last partial pass is padded with ignored targets (-1). NaN when there is no window.
// CANCELLED when cancellation is asked between passes.
Result<double> Evaluate(Backend* backend, Model* model, const std::vector<int32_t>& tokens,
                        int64_t B, int64_t T, const RunOptions& options) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t windows = n > 0 ? (n - 1) / T : 0;
  if (windows <= 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  double weighted = 0.0;
  for (int64_t first = 0; first < windows; first += B) {
    if (IsCancelled(options)) return Status::Cancelled("job cancelled during evaluation");
    const int64_t count = std::min(B, windows - first);
    for (int64_t b = 0; b < B; ++b) {
      int32_t* in = inputs.data() + b * T;
      int32_t* tg = targets.data() + b * T;
      if (b < count) {
        const int32_t* w = tokens.data() + (first + b) * T;
        std::copy(w, w + T, in);
        std::copy(w + 1, w + T + 1, tg);
      } else {
        std::fill(in, in + T, 0);
        std::fill(tg, tg + T, -1);
      }
    }
    CopyBatch(backend, model, inputs, targets);
    // Forward's loss is the mean over the pass's real positions (count * T of them).
    weighted += model->Forward(/*for_backward=*/false, 1.0f) * static_cast<double>(count);
  }
  return weighted / static_cast<double>(windows);
}

// Writes output_dir's final config.json, model.safetensors and trainer_state.json.
Status WriteFinalOutputs(const JobSpec& spec, Model* model, const TrainerState& state,
                         int64_t windows_per_epoch, const nlohmann::json& final_entry) {
  const fs::path out(spec.output_dir);
  TRAIND_RETURN_IF_ERROR(
      WriteFileAtomic((out / kConfigFile).string(), WriteHfConfigJson(model->config())));
  TRAIND_RETURN_IF_ERROR(WriteSafetensors((out / kModelFile).string(), model->ExportHf()));
  return WriteFileAtomic((out / kTrainerStateFile).string(),
                         TrainerStateJson(spec, state, windows_per_epoch, &final_entry));
}

}  // namespace

Result<RunSummary> RunJob(const JobSpec& spec, const RunOptions& options,
                          const RunCallbacks& callbacks) {
  const Clock::time_point run_start = Clock::now();
  const TrainingSpec& t = spec.training;
  auto message = [&](const std::string& line) {
    if (callbacks.on_message) callbacks.on_message(line);
  };
  if (t.fp16 && t.bf16) return Status::InvalidArgument("training.bf16: fp16 and bf16 are both true; choose one");
  if (t.optim != "adamw") return Status::Unimplemented("training.optim: " + t.optim + " is not supported yet");
  if (t.offload != "none") return Status::Unimplemented("training.offload: " + t.offload + " is not supported yet");
  TRAIND_ASSIGN_OR_RETURN(LrScheduleType schedule, ParseLrScheduleType(t.lr_scheduler_type));
  TRAIND_ASSIGN_OR_RETURN(OpenedDevice device, OpenDevice(options.device, t.tf32, message));
  TRAIND_RETURN_IF_ERROR(ValidateJobInputs(spec));
  TRAIND_ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(spec));
  TRAIND_ASSIGN_OR_RETURN(MemoryPlan plan, PlanJob(spec, config, device.budget_bytes,
                                                    device.device.rfind("cuda:", 0) == 0));
  if (callbacks.on_plan) callbacks.on_plan(plan);
  if (t.tf32 && device.device.rfind("cuda:", 0) != 0) {
    message("training.tf32 has no effect on the " + device.device + " backend");
  }

  TRAIND_ASSIGN_OR_RETURN(TokenData data, LoadTokenData(spec.data));
  if (data.vocab_size_needed > config.vocab_size) {
    return Status::InvalidArgument("data.train_file: holds token id " +
                                   std::to_string(data.vocab_size_needed - 1) +
                                   ", beyond the model's vocab_size " +
                                   std::to_string(config.vocab_size));
  }
  auto train_tokens = std::make_shared<const std::vector<int32_t>>(std::move(data.train));

  std::unique_ptr<Backend> backend = std::move(device.backend);
  DeviceArena arena(backend.get(), plan.budget_bytes);
  const int64_t B = plan.micro_batch;
  const int64_t T = spec.data.seq_len;
  const int64_t accum = plan.gradient_accumulation_steps;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          Model::Create(config, JobModelOptions(spec, B, plan.gradient_checkpointing),
                                        &arena));
  AdamWOptions adam;
  adam.beta1 = t.adam_beta1;
  adam.beta2 = t.adam_beta2;
  adam.eps = t.adam_epsilon;
  adam.weight_decay = t.weight_decay;
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<AdamWOptimizer> optimizer,
                          AdamWOptimizer::Create(model->params(), model->num_params(), adam, &arena));

  std::error_code ec;
  fs::create_directories(spec.output_dir, ec);
  if (ec) return Status::FailedPrecondition("output_dir " + spec.output_dir + ": " + ec.message());

  // Initial state: the newest checkpoint on resume, else the init (random or init_from).
  TrainerState state;
  state.micro_batch = B;
  state.gradient_accumulation_steps = accum;
  const int64_t resume_step = options.resume ? FindLatestCheckpoint(spec.output_dir) : -1;
  if (resume_step >= 0) {
    const std::string dir = CheckpointDir(spec.output_dir, resume_step);
    TRAIND_RETURN_IF_ERROR(LoadCheckpoint(dir, model.get(), optimizer.get(), &state));
    if (state.micro_batch != B || state.gradient_accumulation_steps != accum) {
      return Status::FailedPrecondition(
          "checkpoint " + dir + " was trained with micro-batch " + std::to_string(state.micro_batch) +
          " x " + std::to_string(state.gradient_accumulation_steps) + " accumulation, this run plans " +
          std::to_string(B) + " x " + std::to_string(accum) +
          ": set per_device_train_batch_size and gradient_accumulation_steps to match");
    }
    if (state.global_step > t.max_steps) {
      return Status::FailedPrecondition("checkpoint " + dir + " is past training.max_steps " +
                                        std::to_string(t.max_steps));
    }
    message("resuming from " + dir);
  } else {
    if (options.resume) message("no checkpoint in " + spec.output_dir + ": starting a fresh run");
    TRAIND_RETURN_IF_ERROR(RemoveCheckpoints(spec.output_dir));
    if (spec.model.init_from.has_value()) {
      TRAIND_ASSIGN_OR_RETURN(SafetensorsFile weights, ReadHfWeights(*spec.model.init_from));
      TRAIND_RETURN_IF_ERROR(model->LoadHf(weights));
    } else {
      model->InitRandom(static_cast<uint64_t>(t.seed));
    }
  }

  BatchLoader loader(train_tokens, B, T, spec.data.shuffle, static_cast<uint64_t>(t.seed),
                     state.loader);
  const int64_t wpe = loader.windows_per_epoch();
  const double step_flops = Model::TrainingFlops(config, B, T) * static_cast<double>(accum);
  const int64_t step_tokens = B * T * accum;
  const int64_t first_step = state.global_step;

  double last_eval = std::numeric_limits<double>::quiet_NaN();
  auto run_eval = [&]() -> Status {
    TRAIND_ASSIGN_OR_RETURN(double loss, Evaluate(backend.get(), model.get(), data.validation, B, T, options));
    last_eval = loss;
    if (std::isnan(loss)) return Status::Ok();
    state.log_history.push_back({{"epoch", static_cast<double>(state.global_step * B * accum) / wpe},
                                 {"eval_loss", loss},
                                 {"step", state.global_step}});
    if (callbacks.on_eval) callbacks.on_eval(EvalReport{state.global_step, loss});
    return Status::Ok();
  };
  auto save = [&]() -> Status {
    TRAIND_ASSIGN_OR_RETURN(std::string dir, SaveCheckpoint(spec.output_dir, spec, model.get(),
                                                            *optimizer, state, wpe));
    if (callbacks.on_checkpoint) callbacks.on_checkpoint(state.global_step, dir);
    return Status::Ok();
  };

  // The open logging window's throughput (this process's steps only).
  double window_seconds = 0.0;
  int64_t window_tokens = 0;
  double last_lr = 0.0, last_norm = 0.0;
  // fp16: dynamic loss scaling, restored from the checkpoint on resume (a fresh scaler when the
  // checkpoint has none); skipped steps still count as steps.
  LossScaler scaler;
  if (t.fp16 && state.loss_scaler.has_value()) scaler.Restore(*state.loss_scaler);
  StepRunner::Options step_options;
  step_options.accumulation_steps = accum;
  step_options.fp16 = t.fp16;
  step_options.max_grad_norm = t.max_grad_norm;
  // TRAIND_CUDA_GRAPHS=0 turns capture off without a rebuild (the escape hatch for a device where
  // capture misbehaves; docs/simt.md).
  const char* graphs_env = std::getenv("TRAIND_CUDA_GRAPHS");
  step_options.use_graphs =
      options.device.cuda_graphs && !(graphs_env != nullptr && std::string(graphs_env) == "0");
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner,
                          StepRunner::Create(step_options, model.get(), optimizer.get(), &arena));
  // Each micro-batch of a step comes from the loader; cancellation is checked before each.
  auto next_batch = [&](int32_t* in, int32_t* tg, double* wait) -> Status {
    if (IsCancelled(options)) {
      return Status::Cancelled("job cancelled at step " + std::to_string(state.global_step + 1));
    }
    *wait += loader.Next(in, tg);
    return Status::Ok();
  };
  while (state.global_step < t.max_steps) {
    const Clock::time_point step_start = Clock::now();
    double wait = 0.0;
    const float loss_scale = t.fp16 ? scaler.scale() : 1.0f;
    const double lr = t.learning_rate * LrLambda(schedule, t.warmup_steps, t.max_steps, state.global_step);
    TRAIND_ASSIGN_OR_RETURN(StepRunner::Outcome outcome,
                            runner->Run(next_batch, lr, loss_scale, &wait));
    if (state.global_step == first_step) {
      if (runner->replaying()) {
        message(device.device + ": training step captured as CUDA graphs (one per upload slot and "
                "one for the optimizer), replayed every step");
      } else if (!runner->capture_error().ok()) {
        message(device.device + ": CUDA graph capture failed (" +
                runner->capture_error().ToString() + "); running the steps op by op");
      }
    }
    const bool skipped = t.fp16 && scaler.Update(outcome.skipped);
    const double norm = outcome.grad_norm;
    const double loss = outcome.loss;
    state.global_step += 1;
    state.loader = loader.position();
    state.train_loss_sum += loss;
    state.window_loss_sum += loss;
    state.window_steps += 1;
    last_lr = lr;
    if (!skipped) last_norm = norm;  // a skipped step's norm is not finite: logs keep the last one
    if (t.fp16) {
      state.window_skipped += skipped ? 1 : 0;
      state.loss_scaler = scaler.state();
    }
    const double step_seconds = Seconds(step_start, Clock::now());
    window_seconds += step_seconds;
    window_tokens += step_tokens;

    if (callbacks.on_step) {
      StepReport r;
      r.step = state.global_step;
      r.max_steps = t.max_steps;
      r.loss = loss;
      r.learning_rate = lr;
      r.grad_norm = norm;
      r.skipped = skipped;
      r.step_seconds = step_seconds;
      r.dataloader_wait_seconds = wait;
      r.tokens = step_tokens;
      r.samples = B * accum;
      r.memory_used_bytes = arena.used_bytes();
      r.memory_peak_bytes = arena.peak_bytes();
      r.model_flops = step_flops;
      callbacks.on_step(r);
    }
    const bool last = state.global_step == t.max_steps;
    if ((t.logging_steps > 0 && state.global_step % t.logging_steps == 0) ||
        (last && state.window_steps > 0)) {
      const double window_loss = state.window_loss_sum / static_cast<double>(state.window_steps);
      state.log_history.push_back({{"epoch", static_cast<double>(state.global_step * B * accum) / wpe},
                                   {"grad_norm", last_norm},
                                   {"learning_rate", last_lr},
                                   {"loss", window_loss},
                                   {"step", state.global_step}});
      if (t.fp16) {  // skipped steps in this window and the scale after it
        state.log_history.back()["skipped"] = state.window_skipped;
        state.log_history.back()["loss_scale"] = scaler.scale();
      }
      state.window_skipped = 0;
      if (callbacks.on_log) {
        LogReport r;
        r.step = state.global_step;
        r.loss = window_loss;
        r.learning_rate = last_lr;
        r.grad_norm = last_norm;
        r.tokens_per_second = window_seconds > 0 ? window_tokens / window_seconds : 0.0;
        r.samples_per_second = window_seconds > 0 ? window_tokens / T / window_seconds : 0.0;
        callbacks.on_log(r);
      }
      state.window_loss_sum = 0.0;
      state.window_steps = 0;
      window_seconds = 0.0;
      window_tokens = 0;
    }
    if ((t.eval_steps > 0 && state.global_step % t.eval_steps == 0) || last) {
      TRAIND_RETURN_IF_ERROR(run_eval());
    }
    if ((t.save_steps > 0 && state.global_step % t.save_steps == 0) || last) {
      TRAIND_RETURN_IF_ERROR(save());
    }
  }
  if (first_step == t.max_steps) {
    // Resumed from the final checkpoint: nothing left to train; report its evaluation again.
    TRAIND_ASSIGN_OR_RETURN(last_eval, Evaluate(backend.get(), model.get(), data.validation, B, T, options));
  }

  RunSummary summary;
  summary.global_step = state.global_step;
  summary.train_loss = state.global_step > 0 ? state.train_loss_sum / state.global_step : 0.0;
  summary.eval_loss = last_eval;
  summary.train_runtime = Seconds(run_start, Clock::now());
  const double steps_run = static_cast<double>(state.global_step - first_step);
  summary.train_samples_per_second =
      summary.train_runtime > 0 ? steps_run * B * accum / summary.train_runtime : 0.0;
  summary.train_tokens_per_second =
      summary.train_runtime > 0 ? steps_run * step_tokens / summary.train_runtime : 0.0;
  summary.peak_memory_bytes = arena.peak_bytes();
  summary.plan = plan;
  summary.output_dir = spec.output_dir;

  const nlohmann::json final_entry = {
      {"epoch", static_cast<double>(state.global_step * B * accum) / wpe},
      {"step", state.global_step},
      {"total_flos", step_flops * static_cast<double>(state.global_step)},
      {"train_loss", summary.train_loss},
      {"train_runtime", summary.train_runtime},
      {"train_samples_per_second", summary.train_samples_per_second},
      {"train_tokens_per_second", summary.train_tokens_per_second}};
  TRAIND_RETURN_IF_ERROR(WriteFinalOutputs(spec, model.get(), state, wpe, final_entry));
  return summary;
}

}  // namespace traind::engine
