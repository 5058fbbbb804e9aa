// The set-up stages of a training session (session.h), each a function of its own.
#include "train/session.h"

#include <cstdio>
#include <filesystem>
#include <utility>

#include "backend/device_registry.h"
#include "data/instruction_data.h"
#include "train/planner.h"
#include "core/safetensors.h"
#include "traind/engine/communicator.h"
#include "optim/offloaded_optimizer.h"
#include "optim/sharded_optimizer.h"
#include "traind/engine/optimizer_state_store.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

// What the spec asks that this build or these RunOptions cannot do, before anything is opened.
Status ValidateRun(const RunRequest& r) {
  const TrainingSpec& t = r.spec.training;
  if (t.fp16 && t.bf16) {
    return Status::InvalidArgument("training.bf16: fp16 and bf16 are both true; choose one");
  }
  if (t.offload != "none" && r.options->optimizer_state_store == nullptr &&
      !r.options->open_optimizer_state_store) {
    return Status::FailedPrecondition("training.offload: " + t.offload +
                                      " needs an optimizer-state store, which the job runner opens; "
                                      "this caller gave none");
  }
  if (t.offload == "none" && r.options->optimizer_state_store != nullptr) {
    return Status::InvalidArgument(
        "an optimizer-state store was given but training.offload is none: set training.offload");
  }
  return Status::Ok();
}

// Data parallel: the communicator given in RunOptions, or one opened for the spec's
// distributed: block (the rendezvous with the other ranks happens here); the spec's world size
// and rank must be the communicator's.
Status OpenCommunicator(const RunRequest& r, DataParallel* p) {
  const std::optional<DistributedSpec>& d = r.spec.distributed;
  Communicator* comm = r.options->communicator;
  if (comm == nullptr && d.has_value() && !(d->world_size.has_value() && *d->world_size == 1)) {
    if (!r.options->open_communicator) {
      return Status::FailedPrecondition(
          "distributed: a data-parallel run needs a communicator, which `traind run` opens; this "
          "caller gave none (the daemon does not run distributed jobs yet)");
    }
    TRAIND_ASSIGN_OR_RETURN(p->owned_comm, r.options->open_communicator(r.spec));
    comm = p->owned_comm.get();
  }
  if (comm == nullptr || comm->world_size() <= 1) return Status::Ok();
  p->metered_comm = std::make_unique<MeteredCommunicator>(comm);
  p->comm = p->metered_comm.get();
  p->world = comm->world_size();
  p->rank = comm->rank();
  if (d.has_value() && d->world_size.has_value() && *d->world_size != p->world) {
    return Status::InvalidArgument("distributed.world_size: " + std::to_string(*d->world_size) +
                                   ", but the communicator's world has " + std::to_string(p->world) +
                                   " ranks");
  }
  if (d.has_value() && d->rank.has_value() && *d->rank != p->rank) {
    return Status::InvalidArgument("distributed.rank: " + std::to_string(*d->rank) +
                                   ", but the communicator says rank " + std::to_string(p->rank));
  }
  return Status::Ok();
}

// training.offload: the store this process's optimizer state lives in. Data parallel: every rank
// its own, opened for a TrainingSpec whose offload_dir (nvme) is the rank's directory
// <offload_dir>/rank-<r>, created here (ranks may share a machine and must never share a RocksDB;
// the store creates the rank's directory and checks that it is writable).
Status OpenStore(const RunRequest& r, const DataParallel& p, DeviceObjects* d) {
  TrainingSpec t = r.spec.training;
  d->store = r.options->optimizer_state_store;
  if (d->store != nullptr) {
    if (p.comm != nullptr) {
      return Status::InvalidArgument(
          "training.offload: an optimizer-state store was given for a data-parallel run; every "
          "rank opens its own (give open_optimizer_state_store instead)");
    }
    return Status::Ok();
  }
  if (p.comm != nullptr && t.offload == "nvme" && t.offload_dir.has_value()) {
    const std::string dir = *t.offload_dir;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      const fs::path parent = fs::path(dir).parent_path();
      if (!parent.empty() && !fs::is_directory(parent, ec)) {
        return Status::NotFound("training.offload_dir " + dir + ": its parent " + parent.string() +
                                " does not exist");
      }
      fs::create_directory(dir, ec);
      if (ec) {
        return Status::FailedPrecondition("training.offload_dir " + dir +
                                          ": cannot create it: " + ec.message());
      }
    }
    t.offload_dir = (fs::path(dir) / ("rank-" + std::to_string(p.rank))).string();
  }
  TRAIND_ASSIGN_OR_RETURN(d->owned_store, r.options->open_optimizer_state_store(t));
  d->store = d->owned_store.get();
  return Status::Ok();
}

// Every rank must train the same configuration: the same micro-batch and accumulation (the plan
// may resolve "auto" per device), the same parameters, the same starting step (a resume reads
// output_dir's checkpoint, which every rank must see: one machine or a shared file system).
Status CheckRanksAgree(const DevicePlan& dp, const DataParallel& p, const Model& model,
                       const TrainerState& state) {
  if (p.comm == nullptr) return Status::Ok();
  const int64_t mine[4] = {dp.B, dp.accum, model.num_trainable(), state.global_step};
  std::vector<int64_t> all(static_cast<size_t>(4 * p.world));
  // Raw bytes: each int64 travels as two f32 lanes (a gather only copies).
  TRAIND_RETURN_IF_ERROR(p.comm->AllGather(mine, all.data(), 8, CommDType::kF32));
  const char* what[4] = {"micro-batch (per_device_train_batch_size)", "gradient_accumulation_steps",
                         "trainable parameter count", "starting step (resumed checkpoint)"};
  for (int r = 0; r < p.world; ++r) {
    for (int i = 0; i < 4; ++i) {
      if (all[static_cast<size_t>(4 * r + i)] != mine[i]) {
        return Status::FailedPrecondition(
            "data parallel: rank " + std::to_string(r) + " has " + what[i] + " " +
            std::to_string(all[static_cast<size_t>(4 * r + i)]) + ", rank " +
            std::to_string(p.rank) + " has " + std::to_string(mine[i]) +
            (i == 3 ? ": every rank must see output_dir's checkpoints (one machine or a shared "
                      "file system)"
                    : ": every rank must train the same configuration"));
      }
    }
  }
  return Status::Ok();
}

// Opens the device, resolves the model config and plans memory (on_plan is called with it).
Status OpenDeviceAndPlan(const RunRequest& r, const DataParallel& p, DevicePlan* dp,
                         std::unique_ptr<Backend>* backend) {
  const TrainingSpec& t = r.spec.training;
  auto note = [&r](const std::string& line) { r.Message(line); };
  TRAIND_ASSIGN_OR_RETURN(dp->schedule, ParseLrScheduleType(t.lr_scheduler_type));
  TRAIND_ASSIGN_OR_RETURN(OpenedDevice device, OpenDevice(r.options->device, t.tf32, note));
  dp->device = device.device;
  *backend = std::move(device.backend);
  dp->capabilities = (*backend)->capabilities();
  TRAIND_RETURN_IF_ERROR(ValidateJobInputs(r.spec));
  TRAIND_ASSIGN_OR_RETURN(dp->config, ResolveModelConfig(r.spec));
  TRAIND_RETURN_IF_ERROR(CheckSupports(**backend, Model::RequiredOps(dp->config)));
  // Data parallel: the world the communicator has (the spec may leave it to WORLD_SIZE), so that
  // ZeRO-1 plans the rank's shard of the optimizer state.
  JobSpec planned = r.spec;
  if (p.comm != nullptr && planned.distributed.has_value()) {
    planned.distributed->world_size = p.world;
  }
  const DeviceCapabilities& caps = dp->capabilities;
  TRAIND_ASSIGN_OR_RETURN(dp->plan, PlanJob(planned, dp->config, device.budget_bytes,
                                           caps.tensor_cores, OffloadUpdatesOnHost(caps)));
  if (r.callbacks->on_plan) r.callbacks->on_plan(dp->plan);
  if (t.tf32 && !caps.tensor_cores) {
    r.Message("training.tf32 has no effect on the " + dp->device + " backend");
  }
  dp->B = dp->plan.micro_batch;
  dp->T = r.spec.data.seq_len;
  dp->accum = dp->plan.gradient_accumulation_steps;
  // A host communicator (Gloo) reduces host memory (the cpu backend), NCCL device memory of cuda:N.
  if (p.comm != nullptr && caps.has_own_memory && p.comm->name() != caps.device_collective) {
    return Status::Unimplemented("distributed: data parallel on " + dp->device + " with the " +
                                 p.comm->name() +
                                 " communicator is not supported (Gloo on cpu, NCCL on cuda:N)");
  }
  return Status::Ok();
}

// Tokenizes (or maps) the training and validation streams; every id must fit the model's vocab.
Status LoadData(const RunRequest& r, const ModelConfig& config, TrainingData* d) {
  TokenizeProgress progress;
  if (r.callbacks->on_tokenize) progress.report = r.callbacks->on_tokenize;
  if (r.spec.data.packing && config.encoder()) {
    return Status::InvalidArgument(
        "data.packing: true packs the causal families' instruction examples; model.arch " +
        std::string(ArchName(r.spec.model.config.arch)) + " reads one example a row");
  }
  if (config.encoder()) {  // bert: examples (example_data.h)
    TRAIND_ASSIGN_OR_RETURN(
        ExampleData examples,
        LoadExampleData(r.spec.data, config, static_cast<uint64_t>(r.spec.training.seed),
                        progress));
    if (examples.vocab_size_needed > config.vocab_size) {
      return Status::InvalidArgument(
          "data.train_file: holds token id " + std::to_string(examples.vocab_size_needed - 1) +
          " (with data.tokenizer " + r.spec.data.tokenizer + "), beyond the model's vocab_size " +
          std::to_string(config.vocab_size));
    }
    d->examples = std::make_unique<ExampleData>(std::move(examples));
    return Status::Ok();
  }
  if (r.spec.data.format == "jsonl") {  // causal jsonl: instruction data unless it is text
    TRAIND_ASSIGN_OR_RETURN(JsonlKind kind, PeekJsonlKind(r.spec.data));
    if (kind != JsonlKind::kText) {
      TRAIND_ASSIGN_OR_RETURN(
          ExampleData examples,
          LoadInstructionData(r.spec.data, r.spec.model.init_from.value_or(""), progress));
      if (examples.vocab_size_needed > config.vocab_size) {
        return Status::InvalidArgument(
            "data.train_file: holds token id " + std::to_string(examples.vocab_size_needed - 1) +
            " (with data.tokenizer " + r.spec.data.tokenizer + "), beyond the model's vocab_size " +
            std::to_string(config.vocab_size));
      }
      d->examples = std::make_unique<ExampleData>(std::move(examples));
      return Status::Ok();
    }
  }
  if (r.spec.data.packing) {
    return Status::InvalidArgument("data.packing: " + r.spec.data.train_file +
                                   " holds text lines (a token stream): packing is for "
                                   "prompt-completion or conversational examples");
  }
  TRAIND_ASSIGN_OR_RETURN(TokenData data, LoadTokenData(r.spec.data, progress));
  if (data.vocab_size_needed > config.vocab_size) {
    return Status::InvalidArgument("data.train_file: holds token id " +
                                   std::to_string(data.vocab_size_needed - 1) +
                                   ", beyond the model's vocab_size " +
                                   std::to_string(config.vocab_size));
  }
  d->train_tokens = std::move(data.train);
  d->validation_tokens = std::move(data.validation);
  return Status::Ok();
}

// Allocates the model and the optimizer state in the arena (plan == what is allocated).
Status BuildModelAndOptimizer(const RunRequest& r, const DevicePlan& dp, const DataParallel& p,
                              DeviceObjects* d) {
  const TrainingSpec& t = r.spec.training;
  d->arena = std::make_unique<DeviceArena>(d->backend.get(), dp.plan.budget_bytes);
  TRAIND_ASSIGN_OR_RETURN(
      d->model, Model::Create(dp.config,
                              JobModelOptions(r.spec, dp.B, dp.plan.gradient_checkpointing,
                                              PacksGemmWeights(dp.capabilities) && dp.plan.packed_weights),
                              d->arena.get()));
  if (t.offload != "none") TRAIND_RETURN_IF_ERROR(OpenStore(r, p, d));
  if (p.comm != nullptr && r.spec.distributed.has_value() &&
      r.spec.distributed->zero_stage == 1) {
    if (dp.capabilities.has_own_memory) {  // the checkpoint's state gather stages host buffers
      return Status::Unimplemented("distributed.zero_stage: 1 on " + dp.device +
                                   " is not supported yet (the cpu backend only): use zero_stage 0");
    }
    const int64_t n = d->model->num_trainable();
    TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> sharded,
                            ShardedOptimizer::Create(t, d->model->trainable_params(), n, p.comm,
                                                     d->arena.get(), d->store));
    // Measured: the optimizer bytes in this rank's arena (the model allocates none); with
    // offload, that is the window, and the shard's state is in the rank's store.
    const int64_t held = d->arena->used_by_category().optimizer;
    const int64_t whole = OptimizerPlanBytes(t, d->model->trainable_params(), n);
    const int64_t state = d->store != nullptr ? sharded->shard_state_bytes() : held;
    char line[320];
    std::snprintf(
        line, sizeof(line),
        "zero_stage 1: rank %d of %d updates elements [%lld, %lld) of %lld; optimizer state %lld "
        "bytes in this rank's %s (unsharded %lld, ratio %.4f)",
        p.rank, p.world, static_cast<long long>(sharded->shard_begin()),
        static_cast<long long>(sharded->shard_end()), static_cast<long long>(n),
        static_cast<long long>(state), d->store != nullptr ? "store" : "arena",
        static_cast<long long>(whole),
        whole > 0 ? static_cast<double>(state) / static_cast<double>(whole) : 0.0);
    std::string message = line;
    if (d->store != nullptr) {
      message += ", " + d->store->Describe() + "; window " + std::to_string(held) +
                 " bytes in its arena";
    }
    r.Message(message);
    d->optimizer = std::move(sharded);
  } else if (t.offload != "none") {
    // A 16-bit model may keep its fp32 master weights in the store too (planner.h,
    // MasterWeightsOffDevice): the optimizer refreshes the model's weights, and the model's
    // weights come in and go out through the optimizer's store.
    OffloadOptions oo;
    oo.master_sink = d->model->master_weights_sink();
    oo.master_weights = oo.master_sink != nullptr;
    // A device with its own memory (cuda, simt): the update runs on the host (the gradients down,
    // the weights up; not the state both ways), with the job's CPU threads.
    oo.update_on_host = OffloadUpdatesOnHost(dp.capabilities);
    oo.host_threads = r.options->device.threads;
    TRAIND_ASSIGN_OR_RETURN(d->optimizer,
                            MakeOffloadedOptimizer(t, d->model->trainable_params(),
                                                   d->model->num_trainable(), d->arena.get(),
                                                   d->store, oo));
    if (oo.master_weights) d->model->SetMasterWeightsStore(d->optimizer->master_weights_store());
    const int64_t state = dp.plan.offload_state_bytes;
    char line[240];
    std::snprintf(line, sizeof(line), ": %.2f MiB of %s state%s off the device, %.2f MiB window on it",
                  static_cast<double>(state) / 1048576.0, t.optim.c_str(),
                  oo.master_weights
                      ? (" and " + std::to_string(dp.plan.offload_master_bytes / 1048576) + " MiB of fp32 master weights")
                            .c_str()
                      : "",
                  static_cast<double>(dp.plan.bytes.optimizer) / 1048576.0);
    r.Message("training.offload " + t.offload + ": optimizer state in " + d->store->Describe() + line +
              (oo.update_on_host ? "; " + t.optim + " updates on the host (gradients down, weights up)"
                                 : std::string()));
    if (d->model->merge_needs_base()) {
      r.Message("training.offload " + t.offload + " with peft: the frozen base on the device in " +
                dp.plan.precision + " only (no fp32 copy of its GEMM weights" +
                (t.peft->merge ? "; the merged export reads the fp32 base again from " +
                                     (r.spec.model.init_from ? "model.init_from " + *r.spec.model.init_from
                                                              : std::string("the seeded init"))
                               : std::string()) +
                ")");
    }
  } else {
    TRAIND_ASSIGN_OR_RETURN(d->optimizer, MakeOptimizer(t, d->model->trainable_params(),
                                                        d->model->num_trainable(), d->arena.get()));
  }
  return Status::Ok();
}

// The initial state: the newest checkpoint on resume, else a fresh run (random or init_from).
Status RestoreOrInitialize(const RunRequest& r, const DevicePlan& dp, const DataParallel& p,
                           DeviceObjects* d, Progress* progress) {
  const JobSpec& spec = r.spec;
  const bool writer = p.writes_outputs();  // data parallel: rank 0 alone writes output_dir
  std::error_code ec;
  if (writer) fs::create_directories(spec.output_dir, ec);
  if (ec) return Status::FailedPrecondition("output_dir " + spec.output_dir + ": " + ec.message());

  TrainerState& state = progress->state;
  // With data parallel, the world's accumulation (micro-batches per step over every rank): what
  // the batches depend on, so a checkpoint resumes on any world size with the same global batch.
  const int64_t accum = dp.accum * p.world;
  state.micro_batch = dp.B;
  state.gradient_accumulation_steps = accum;
  // Where the run continues from: output_dir's newest checkpoint on a restart of the same job or
  // with resume_from_checkpoint: true; else a resume_from_checkpoint folder; else nowhere (fresh).
  const TrainingSpec& t = spec.training;
  const int64_t latest = r.options->resume || t.resume_from_last_checkpoint ? FindLatestCheckpoint(spec.output_dir) : -1;
  std::string resume_dir;
  if (latest >= 0) {
    resume_dir = CheckpointDir(spec.output_dir, latest);
  } else if (t.resume_from_checkpoint) {
    resume_dir = *t.resume_from_checkpoint;
  } else if (t.resume_from_last_checkpoint) {
    return Status::FailedPrecondition("training.resume_from_checkpoint: true, but output_dir " + spec.output_dir +
                                      " holds no complete checkpoint-<step>/ to continue from");
  } else if (!r.options->resume && writer) {
    TRAIND_RETURN_IF_ERROR(CheckOutputDirFree(spec));
  }
  // The base weights: init_from, or the seeded init (LoRA checkpoints hold only the adapters, so
  // a LoRA resume rebuilds its frozen base the same way).
  bool prequantized = false;  // init_from holds bitsandbytes' 4-bit weights
  auto init_base = [&]() -> Status {
    if (spec.model.init_from.has_value()) {
      // Tensor by tensor from the open folder (the host holds one tensor, not the file).
      TRAIND_ASSIGN_OR_RETURN(HfWeightsReader weights, HfWeightsReader::Open(*spec.model.init_from));
      for (const std::string& n : weights.names()) prequantized |= n.find(".quant_state.bitsandbytes__") != std::string::npos;
      TRAIND_RETURN_IF_ERROR(d->model->LoadHfFrom(weights));
      const std::vector<std::string> fresh = d->model->NewlyInitialized();
      if (!fresh.empty()) {
        std::string names;
        for (const std::string& n : fresh) names += (names.empty() ? "" : ", ") + n;
        r.Message("model.init_from: " + *spec.model.init_from + " has no " + names +
                  ": newly initialised for model.head " + spec.model.config.head +
                  " (train them before using the model)");
      }
      return Status::Ok();
    }
    d->model->InitRandom(static_cast<uint64_t>(spec.training.seed));
    return Status::Ok();
  };
  if (!resume_dir.empty()) {
    const std::string& dir = resume_dir;
    if (d->model->lora()) TRAIND_RETURN_IF_ERROR(init_base());
    TRAIND_RETURN_IF_ERROR(LoadCheckpoint(dir, d->model.get(), d->optimizer.get(), &state));
    if (state.micro_batch != dp.B || state.gradient_accumulation_steps != accum) {
      return Status::FailedPrecondition(
          "checkpoint " + dir + " was trained with micro-batch " + std::to_string(state.micro_batch) +
          " x " + std::to_string(state.gradient_accumulation_steps) + " accumulation, this run plans " +
          std::to_string(dp.B) + " x " + std::to_string(accum) +
          (p.world > 1 ? " (" + std::to_string(dp.accum) + " x world size " +
                              std::to_string(p.world) + ")"
                        : std::string()) +
          ": set per_device_train_batch_size and gradient_accumulation_steps to match");
    }
    if (state.global_step > spec.training.max_steps) {
      return Status::FailedPrecondition("checkpoint " + dir + " is past training.max_steps " +
                                        std::to_string(spec.training.max_steps));
    }
    r.Message("resuming from " + dir);
  } else {
    if (r.options->resume) r.Message("no checkpoint in " + spec.output_dir + ": starting a fresh run");
    if (writer) TRAIND_RETURN_IF_ERROR(RemoveCheckpoints(spec.output_dir));
    TRAIND_RETURN_IF_ERROR(init_base());
    d->model->InitAdapters(static_cast<uint64_t>(spec.training.seed));
  }
  if (const auto& q = spec.model.quantization_config; q.has_value()) {
    char line[200];
    std::snprintf(line, sizeof(line), ": %lld block weights %s %s%s, %.1f MiB on the device",
                  static_cast<long long>(dp.plan.quantized_base_params),
                  prequantized ? "loaded pre-quantized (bitsandbytes) in" : "quantized at load to",
                  q->bnb_4bit_quant_type.c_str(),
                  q->bnb_4bit_use_double_quant ? " with double quantization" : "",
                  static_cast<double>(dp.plan.quantized_base_bytes) / 1048576.0);
    r.Message("model.quantization_config" + std::string(line));
  }
  // Master weights in the store: the weights just loaded (written behind) become its committed
  // state (a resume's ReadState already committed them with the optimizer state).
  if (MasterWeightsStore* master = d->optimizer->master_weights_store()) {
    TRAIND_RETURN_IF_ERROR(master->CommitMaster());
  }
  progress->first_step = state.global_step;
  return Status::Ok();
}

}  // namespace

void RunRequest::Message(const std::string& line) const {
  if (callbacks->on_message) callbacks->on_message(line);
}

bool RunRequest::Cancelled() const {
  return options->cancel != nullptr && options->cancel->load(std::memory_order_relaxed);
}

bool RunRequest::Preempted() const {
  return options->preempt != nullptr && options->preempt->load(std::memory_order_relaxed);
}

// Each stage is given the parts it reads (const) and the part it fills.
Result<std::unique_ptr<TrainingSession>> SetUpSession(const JobSpec& spec, const RunOptions& options,
                                                      const RunCallbacks& callbacks) {
  auto s = std::make_unique<TrainingSession>();
  RunRequest& r = s->request_;
  r.spec = spec;
  r.options = &options;
  r.callbacks = &callbacks;
  s->progress_.start = std::chrono::steady_clock::now();
  DevicePlan& dp = s->device_plan_;
  DeviceObjects& d = s->objects_;
  DataParallel& p = s->parallel_;
  TRAIND_RETURN_IF_ERROR(ValidateRun(r));
  TRAIND_RETURN_IF_ERROR(OpenCommunicator(r, &p));
  TRAIND_RETURN_IF_ERROR(OpenDeviceAndPlan(r, p, &dp, &d.backend));
  TRAIND_RETURN_IF_ERROR(LoadData(r, dp.config, &s->data_));
  TRAIND_RETURN_IF_ERROR(BuildModelAndOptimizer(r, dp, p, &d));
  TRAIND_RETURN_IF_ERROR(RestoreOrInitialize(r, dp, p, &d, &s->progress_));
  TRAIND_RETURN_IF_ERROR(CheckRanksAgree(dp, p, *d.model, s->progress_.state));
  TRAIND_RETURN_IF_ERROR(SetUpSampler(r.spec, dp.config, s->data_.train_tokens, &d));
  return s;
}

}  // namespace traind::engine
