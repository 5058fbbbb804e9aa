// The memory planner: byte counts come from Model::PlanBytes and the optimizer, never from
// running anything, so estimates, admission and the allocator all see the same numbers.
#include "train/planner.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "backend/device_registry.h"
#include "models/hf_config.h"
#include "models/lora.h"
#include "models/quantized_base.h"
#include "optim/offloaded_optimizer.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"
#include "train/quantization_spec.h"
#include "train/sampler.h"
#include "train/step_runner.h"

namespace traind::engine {
namespace {

// The largest micro-batch "auto" considers when no effective_batch_size caps it.
constexpr int64_t kMaxAutoMicroBatch = 1024;

// ZeRO-1 (distributed.zero_stage 1, world_size W > 1): each rank keeps 1/W of the optimizer state.
int ZeroShards(const JobSpec& spec) {
  const std::optional<DistributedSpec>& d = spec.distributed;
  if (!d.has_value() || d->zero_stage != 1 || !d->world_size.has_value()) return 1;
  return static_cast<int>(std::max<int64_t>(1, *d->world_size));
}

// JobBytes for `spec` at micro-batch `b`, with or without gradient checkpointing.
// `on_host`: OffloadUpdatesOnHost of the device.
// The cpu device is the one device that does not update on the host, and the one that packs
// weights: !on_host == PacksGemmWeights(caps). `pack`: whether the plan keeps those packed
// copies (a speed choice PlanOrAdvise drops when they do not fit); only where the device packs.
MemoryBytes SpecBytes(const ModelConfig& config, const JobSpec& spec, int64_t b, bool ckpt, bool on_host,
                      bool pack = true) {
  return JobBytes(config, JobModelOptions(spec, b, ckpt, pack && !on_host), spec.training, ZeroShards(spec),
                  on_host);
}

std::string Breakdown(const MemoryBytes& b) {
  return "weights " + FormatGiB(b.weights) + ", gradients " + FormatGiB(b.gradients) +
         ", optimizer " + FormatGiB(b.optimizer) + ", activations " + FormatGiB(b.activations) +
         ", temporary " + FormatGiB(b.temporary);
}

// The largest b in [1, cap] whose plan fits (plans grow with b), or 0 when none does.
int64_t LargestFitting(const JobSpec& spec, const ModelConfig& config, int64_t cap, bool ckpt,
                       int64_t budget, bool on_host, bool pack) {
  auto fits = [&](int64_t b) {
    return SpecBytes(config, spec, b, ckpt, on_host, pack).total() <= budget;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = cap;  // fits(lo) holds
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Multiple of `align` (64 for 16-bit compute on tensor cores, else 8) when >= align; else a
// multiple of 8 when >= 8; else the largest power of two <= b.
int64_t RoundMicroBatch(int64_t b, int64_t align = 8) {
  if (b >= align) return b / align * align;
  if (b >= 8) return b / 8 * 8;
  int64_t p = 1;
  while (p * 2 <= b) p *= 2;
  return b >= 1 ? p : 0;
}

}  // namespace

bool MasterWeightsOffModel(const ModelConfig& config, const ModelOptions& options) {
  return options.master_weights_off_device && !config.encoder() && options.compute_type != DType::kF32 &&
         !options.lora.enabled();
}

std::string FormatGiB(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

Result<ModelConfig> ResolveModelConfig(const JobSpec& spec) {
  if (!spec.model.init_from.has_value()) return spec.model.config;
  const std::string path = (std::filesystem::path(*spec.model.init_from) / "config.json").string();
  TRAIND_ASSIGN_OR_RETURN(ModelConfig c, ReadHfConfig(path));
  const nlohmann::json src = nlohmann::json::parse(c.hf_source_json, nullptr, /*allow_exceptions=*/false);
  // A pre-quantized checkpoint (bitsandbytes' packed uint8 weights, absmax, quant_map, ...): the
  // spec's 4-bit base must be the file's (ParseJobSpec takes the file's when the spec gives none).
  TRAIND_RETURN_IF_ERROR(CheckCheckpointQuantization(spec, src, path));
  if (!c.encoder()) return c;
  // bert: the file's config with the spec's head (a file written for another head, or a plain
  // BertModel, is fine: the head's tensors are newly initialised). num_labels: the spec's, unless
  // it is the default 2 and the file's classifier has another count (a value equal to the
  // default counts as not given, as CheckAgreement does); label names: the spec's, else the
  // file's when they fit the count.
  const ModelConfig& mine = spec.model.config;
  const bool file_classifies = c.head == "sequence_classification";
  c.head = mine.head;
  if (!mine.id2label.empty() || mine.num_labels != 2 || !file_classifies) {
    if (!mine.id2label.empty()) c.id2label = mine.id2label;
    if (c.num_labels != mine.num_labels) c.id2label = mine.id2label;
    c.num_labels = mine.num_labels;
  }
  TRAIND_RETURN_IF_ERROR(ValidateModelConfig(c, path + ": "));
  return c;
}

bool MasterWeightsOffDevice(const JobSpec& spec) {
  const TrainingSpec& t = spec.training;
  if (!t.bf16 && !t.fp16) return false;
  // A frozen LoRA base costs its compute type and no more, with or without offload: nothing
  // updates it, so no fp32 copy of its GEMM weights is kept anywhere.
  if (t.peft.has_value()) return true;
  const bool zero1 = spec.distributed.has_value() && spec.distributed->zero_stage == 1;
  return t.offload != "none" && !zero1;
}

ModelOptions JobModelOptions(const JobSpec& spec, int64_t micro_batch, bool gradient_checkpointing,
                             bool pack_weights) {
  ModelOptions o;
  o.pack_weights = pack_weights;
  o.micro_batch = micro_batch;
  o.seq_len = spec.data.seq_len;
  o.gradient_checkpointing = gradient_checkpointing;
  o.checkpoint_every = spec.training.gradient_checkpointing_every;
  o.compute_type = spec.training.bf16   ? DType::kBF16
                   : spec.training.fp16 ? DType::kF16
                                        : DType::kF32;
  if (spec.training.peft) {
    o.lora.r = spec.training.peft->r;
    o.lora.alpha = spec.training.peft->lora_alpha;
    o.lora.dropout = spec.training.peft->lora_dropout;
    o.lora.targets = spec.training.peft->target_modules;
  }
  if (spec.model.quantization_config.has_value() && spec.training.peft) {
    const QuantizationSpec& q = *spec.model.quantization_config;
    o.quant4.enabled = true;
    o.quant4.type = q.bnb_4bit_quant_type == "nf4" ? Quant4Type::kNF4 : Quant4Type::kFP4;
    o.quant4.double_quant = q.bnb_4bit_use_double_quant;
  }
  o.master_weights_off_device = MasterWeightsOffDevice(spec);
  // Causal jsonl data (instruction examples, packed or one a row; or text lines, then one
  // sequence a row): each token's doc_start and position come with the batch.
  o.example_rows = !spec.model.config.encoder() && spec.data.format == "jsonl";
  return o;
}

bool OffloadUpdatesOnHost(const DeviceCapabilities& caps) { return caps.has_own_memory; }

bool PacksGemmWeights(const DeviceCapabilities& caps) { return caps.packs_gemm_weights; }

MemoryBytes JobBytes(const ModelConfig& config, const ModelOptions& options,
                     const TrainingSpec& training, int zero_shards, bool offload_on_host) {
  MemoryBytes b = Model::PlanBytes(config, options);
  // Gradients are fp32 whatever the compute type (weights may hold a 16-bit copy too), one per
  // trainable element (with LoRA only the adapters: the frozen base has no gradient or state).
  const std::vector<ParamInfo> trainable = Model::TrainableParamsOf(config, options);
  int64_t n_trainable = 0;
  for (const ParamInfo& p : trainable) n_trainable = std::max(n_trainable, p.offset + p.numel);
  // With offload only the window of the group being updated is on the device.
  // ZeRO-1: the rank's shard of the state.
  if (training.offload != "none" && zero_shards > 1) {  // the rank's shard, offloaded
    b.optimizer += ZeroOneOffloadPlanBytes(training, trainable, n_trainable, zero_shards).window;
  } else if (training.offload != "none") {
    OffloadOptions oo;
    oo.master_weights = MasterWeightsOffModel(config, options);
    oo.update_on_host = offload_on_host;
    b.optimizer += OffloadedOptimizerDeviceBytes(training, trainable, n_trainable, oo);
  } else if (zero_shards > 1) {
    b.optimizer += ZeroOnePlanBytes(training, trainable, n_trainable, zero_shards);
  } else {
    b.optimizer += OptimizerPlanBytes(training, trainable, n_trainable);
  }
  // The trainer's double-buffered micro-batch uploads and step scalars.
  b.activations += StepRunner::PlanBytes(options.micro_batch, options.seq_len,
                                         config.encoder() ? 1 : options.example_rows ? 2 : 0);
  const MemoryBytes sampler = SamplerPlanBytes(
      config, training, MasterWeightsOffModel(config, options) ? options.compute_type : DType::kF32);
  b.activations += sampler.activations;
  b.temporary += sampler.temporary;
  return b;
}

namespace {

// For a job that does not fit at micro-batch `b` (checkpointing `c`): each single change of the
// spec that lowers its bytes, with the bytes its plan would need, those that fit first; when none
// fits alone, all of them together as the last entry.
std::vector<PlanLever> FittingLevers(const JobSpec& spec, const ModelConfig& config, int64_t b, bool c,
                                     int64_t budget, bool offload_on_host, bool pack) {
  struct Lever {
    std::string what;
    JobSpec spec;
    int64_t micro_batch;
    bool ckpt;
  };
  std::vector<Lever> levers;
  const TrainingSpec& t = spec.training;
  const bool lora_applies = !LoraModuleNames(config.arch).empty();
  if (!c) levers.push_back({"gradient_checkpointing: true", spec, b, true});
  if (b > 1) {
    levers.push_back({"per_device_train_batch_size: 1 with gradient_accumulation_steps: " +
                          std::to_string(b * t.gradient_accumulation_steps),
                      spec, 1, c});
  }
  if (t.offload == "none") {
    for (const char* where : {"cpu", "nvme"}) {
      JobSpec s = spec;
      s.training.offload = where;
      levers.push_back({std::string("offload: ") + where + (std::string(where) == "nvme" ? " (with offload_dir)" : ""),
                        s, b, c});
    }
  }
  if (const OptimizerRow* row = FindOptimizer(t.optim)) {
    for (OptimKind leaner : row->leaner) {
      const char* optim = Optimizers()[static_cast<size_t>(leaner)].name;
      JobSpec s = spec;
      s.training.optim = optim;
      levers.push_back({std::string("optim: ") + optim, s, b, c});
    }
  }
  if (!t.bf16 && !t.fp16) {
    JobSpec s = spec;
    s.training.bf16 = true;
    levers.push_back({"bf16: true", s, b, c});
  }
  if (!t.peft && lora_applies) {
    JobSpec s = spec;
    s.training.peft = PeftSpec{};
    levers.push_back({"peft: {type: lora, r: 8}", s, b, c});
  }
  // QLoRA: LoRA on a 4-bit NF4 base (double quantization), bf16 unless fp16 was asked for.
  if (!spec.model.quantization_config && lora_applies) {
    JobSpec s = spec;
    if (!s.training.peft) s.training.peft = PeftSpec{};
    if (!t.bf16 && !t.fp16) s.training.bf16 = true;
    QuantizationSpec q;
    q.load_in_4bit = true;
    q.bnb_4bit_quant_type = "nf4";
    q.bnb_4bit_use_double_quant = true;
    q.bnb_4bit_compute_dtype = s.training.fp16 ? "float16" : "bfloat16";
    s.model.quantization_config = q;
    levers.push_back({std::string(t.peft ? "" : "peft: {type: lora, r: 8} with ") +
                          "quantization_config: {load_in_4bit: true, bnb_4bit_quant_type: nf4, "
                          "bnb_4bit_use_double_quant: true} (QLoRA)",
                      s, b, c});
  }
  std::vector<PlanLever> fit, rest;
  const int64_t now = SpecBytes(config, spec, b, c, offload_on_host, pack).total();
  for (const Lever& l : levers) {
    const int64_t need = SpecBytes(config, l.spec, l.micro_batch, l.ckpt, offload_on_host, pack).total();
    if (need >= now) continue;  // no help here (bf16 with small activations: the master copy costs more)
    (need <= budget ? fit : rest).push_back({l.what, need, need <= budget});
  }
  if (fit.empty()) {
    JobSpec all = spec;
    all.training.offload = t.offload == "none" ? "nvme" : t.offload;
    const bool lora = !all.training.peft && lora_applies;
    if (lora) all.training.peft = PeftSpec{};
    const int64_t together = SpecBytes(config, all, 1, true, offload_on_host, pack).total();
    rest.push_back({"together: micro-batch 1 with gradient checkpointing, offload " + all.training.offload +
                        (lora ? " and LoRA" : ""),
                    together, together <= budget});
  }
  fit.insert(fit.end(), rest.begin(), rest.end());
  return fit;
}

// The advice of FittingLevers in one line.
std::string Advice(const std::vector<PlanLever>& levers) {
  std::string fits;
  for (const PlanLever& l : levers) {
    if (l.fits) fits += (fits.empty() ? "" : "; ") + l.change + " (" + FormatGiB(l.bytes) + ")";
  }
  const PlanLever& together = levers.back();  // never empty: without a fitting lever, the combination
  if (together.change.rfind("together: ", 0) != 0) return "any one of these fits: " + fits;
  const std::string what = together.change.substr(std::string("together: ").size());
  if (together.fits) return "no single change fits; together, " + what + " need " + FormatGiB(together.bytes);
  return "even " + what + " needs " + FormatGiB(together.bytes) +
         ": use a device with more memory or a smaller model";
}

// What a plan says besides its bytes: the offloaded state and master weights (the store's, not
// the device's) and the parameter counts (HF shapes; LoRA: the adapters trainable; QLoRA: the
// 4-bit base's bytes).
void FillPlanCounts(const JobSpec& spec, const ModelConfig& config, MemoryPlan* plan) {
  const TrainingSpec& t = spec.training;
  const ModelOptions mo = JobModelOptions(spec, 1, false);
  if (t.offload != "none") {
    const std::vector<ParamInfo> trainable = Model::TrainableParamsOf(config, mo);
    int64_t n = 0;
    for (const ParamInfo& p : trainable) n = std::max(n, p.offset + p.numel);
    // ZeRO-1: each rank's store holds its shard (the largest rank's).
    const int shards = ZeroShards(spec);
    plan->offload_state_bytes = shards > 1
                                    ? ZeroOneOffloadPlanBytes(t, trainable, n, shards).state
                                    : OptimizerPlanBytes(t, trainable, n);
    if (MasterWeightsOffModel(config, mo)) plan->offload_master_bytes = 4 * n;
  }
  auto hf_numel = [](const ParamInfo& p) {
    int64_t n = 1;
    for (int64_t d : p.hf_shape) n *= d;
    return n;
  };
  int64_t base = 0, adapters = 0;
  for (const ParamInfo& p : Model::ParamsOf(config)) base += hf_numel(p);
  if (mo.lora.enabled()) {
    for (const ParamInfo& p : Model::TrainableParamsOf(config, mo)) adapters += hf_numel(p);
  }
  plan->trainable_params = mo.lora.enabled() ? adapters : base;
  plan->total_params = base + adapters;
  if (mo.quant4.enabled) {
    const QuantizedBaseBytes q =
        QuantizedBasePlan(BuildParams(MakeArchDims(config)), mo.quant4.double_quant);
    plan->quantized_base_bytes = q.quantized;
    plan->quantized_base_params = q.elements;
  }
}

// PlanJob's work. A job that does not fit gets the plan of the smallest configuration tried with
// fits false, `levers` and `reason` the advice, and `*too_big` (when given) PlanJob's error message.
// `pack`: whether the plan keeps the cpu's packed weight copies (PlanOrAdvise's caller drops them
// when the job does not fit with them).
Result<MemoryPlan> PlanOrAdvisePacked(const JobSpec& spec, const ModelConfig& config, int64_t budget_bytes,
                                      bool tensor_cores, bool offload_on_host, bool pack,
                                      std::string* too_big) {
  const TrainingSpec& t = spec.training;
  const int64_t align = tensor_cores && (t.bf16 || t.fp16) ? 64 : 8;
  if (spec.data.seq_len > config.max_positions()) {
    return Status::InvalidArgument("data.seq_len: " + std::to_string(spec.data.seq_len) +
                                   " exceeds the model's maximum positions " +
                                   std::to_string(config.max_positions()));
  }
  MemoryPlan plan;
  plan.precision = t.bf16 ? "bf16" : (t.fp16 ? "fp16" : "fp32");
  plan.optimizer = t.optim;
  plan.offload = t.offload;
  FillPlanCounts(spec, config, &plan);
  plan.budget_bytes = budget_bytes;
  plan.packed_weights = pack && !offload_on_host;
  plan.gradient_accumulation_steps = t.gradient_accumulation_steps;
  bool ckpt = t.gradient_checkpointing;

  // The job does not fit even at micro-batch b (checkpointing c), the smallest configuration
  // tried: that plan, with the advice.
  auto not_fitting = [&](int64_t b, bool c) {
    plan.micro_batch = b;
    plan.gradient_checkpointing = c;
    plan.bytes = SpecBytes(config, spec, b, c, offload_on_host, pack);
    plan.fits = false;
    plan.levers = FittingLevers(spec, config, b, c, budget_bytes, offload_on_host, pack);
    const std::string needs = "needs " + FormatGiB(plan.bytes.total()) + ", budget " +
                              FormatGiB(budget_bytes) + " at micro-batch " + std::to_string(b) +
                              (c ? " with" : " without") + " gradient checkpointing";
    const std::string advice = Advice(plan.levers);
    plan.reason = needs + ": " + advice;
    if (too_big != nullptr) *too_big = needs + " (" + Breakdown(plan.bytes) + "): " + advice;
    return plan;
  };

  if (!t.auto_batch()) {
    plan.micro_batch = t.per_device_train_batch_size;
    plan.bytes = SpecBytes(config, spec, plan.micro_batch, ckpt, offload_on_host, pack);
    if (plan.bytes.total() > budget_bytes) return not_fitting(plan.micro_batch, ckpt);
    plan.gradient_checkpointing = ckpt;
    plan.reason = "micro-batch " + std::to_string(plan.micro_batch) + " as given" +
                  (ckpt ? " with gradient checkpointing as asked" : "") + ": " +
                  FormatGiB(plan.bytes.total()) + " of " + FormatGiB(budget_bytes);
    return plan;
  }

  const std::optional<int64_t>& eff = t.effective_batch_size;
  // Search past the cap, round, then cap: effective_batch_size 20 with room for 37 gives 20.
  const int64_t cap = eff.has_value() ? std::max<int64_t>(1, *eff) : kMaxAutoMicroBatch;
  const int64_t search = std::max(cap, kMaxAutoMicroBatch);
  const int64_t wanted = std::min<int64_t>(8, cap);
  std::string why;
  int64_t raw = 0;
  if (ckpt) {
    raw = LargestFitting(spec, config, search, true, budget_bytes, offload_on_host, pack);
    why = "gradient checkpointing as asked";
  } else {
    raw = LargestFitting(spec, config, search, false, budget_bytes, offload_on_host, pack);
    if (raw < wanted) {
      // Only when it buys a larger (rounded) micro-batch: checkpointing costs a forward pass.
      const int64_t with_ckpt = LargestFitting(spec, config, search, true, budget_bytes, offload_on_host, pack);
      if (RoundMicroBatch(with_ckpt, align) > RoundMicroBatch(raw, align)) {
        raw = with_ckpt;
        ckpt = true;
        why = "gradient checkpointing on because only " + std::to_string(raw) +
              " sequences fit without it";
      }
    }
  }
  if (raw == 0) {
    if (eff.has_value()) plan.gradient_accumulation_steps = std::max<int64_t>(1, *eff);
    return not_fitting(1, true);
  }
  plan.micro_batch = std::min(RoundMicroBatch(raw, align), cap);
  plan.gradient_checkpointing = ckpt;
  if (eff.has_value()) {
    plan.gradient_accumulation_steps = (*eff + plan.micro_batch - 1) / plan.micro_batch;
  }
  plan.bytes = SpecBytes(config, spec, plan.micro_batch, ckpt, offload_on_host, pack);
  plan.reason = "auto: largest micro-batch that fits " + FormatGiB(budget_bytes) + " is " +
                std::to_string(raw) + ", using " + std::to_string(plan.micro_batch) + " x " +
                std::to_string(plan.gradient_accumulation_steps) + " accumulation" +
                (eff.has_value() ? " for effective batch " + std::to_string(*eff) : "") +
                (why.empty() ? "" : "; " + why) + " (" + FormatGiB(plan.bytes.total()) + ")";
  return plan;
}

// PlanOrAdvisePacked with the cpu's packed weight copies when the job fits with them, else without
// them (a speed choice, dropped before the job is refused; the reason and advice say so).
Result<MemoryPlan> PlanOrAdvise(const JobSpec& spec, const ModelConfig& config, int64_t budget_bytes,
                                bool tensor_cores, bool offload_on_host, std::string* too_big) {
  TRAIND_ASSIGN_OR_RETURN(MemoryPlan packed, PlanOrAdvisePacked(spec, config, budget_bytes, tensor_cores,
                                                                offload_on_host, true, too_big));
  if (packed.fits || offload_on_host || !(spec.training.bf16 || spec.training.fp16)) return packed;
  const int64_t with = packed.bytes.total();
  TRAIND_ASSIGN_OR_RETURN(MemoryPlan plain, PlanOrAdvisePacked(spec, config, budget_bytes, tensor_cores,
                                                               offload_on_host, false, too_big));
  if (plain.bytes.total() >= with) return packed;  // nothing packed (fp32, or too few rows)
  const std::string dropped = "without the cpu's packed weight copies (a speed choice; " +
                              FormatGiB(with) + " with them)";
  plain.reason += "; " + dropped;
  if (too_big != nullptr && !plain.fits) *too_big += "; " + dropped;
  return plain;
}

}  // namespace

Result<MemoryPlan> PlanJob(const JobSpec& spec, const ModelConfig& config, int64_t budget_bytes,
                           bool tensor_cores, bool offload_on_host) {
  std::string too_big;
  TRAIND_ASSIGN_OR_RETURN(MemoryPlan plan,
                          PlanOrAdvise(spec, config, budget_bytes, tensor_cores, offload_on_host, &too_big));
  if (!plan.fits) return Status::FailedPrecondition(too_big);
  return plan;
}

Result<MemoryPlan> PlanJobWithAdvice(const JobSpec& spec, const ModelConfig& config, int64_t budget_bytes,
                                     bool tensor_cores, bool offload_on_host) {
  return PlanOrAdvise(spec, config, budget_bytes, tensor_cores, offload_on_host, nullptr);
}

}  // namespace traind::engine

namespace traind::engine {

namespace {

Result<MemoryPlan> Estimate(const JobSpec& spec, const DeviceOptions& device, bool advise) {
  TRAIND_ASSIGN_OR_RETURN(int64_t budget, DeviceBudget(device));  // checks the device too
  TRAIND_ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(spec));
  // The registry's capabilities of the device (no backend is open here). Tensor cores (cuda:N,
  // sm_80+, the architectures this project builds for): 16-bit batches align to 64.
  TRAIND_ASSIGN_OR_RETURN(DeviceCapabilities caps, DeviceCapabilitiesOf(device.device));
  const bool on_host = OffloadUpdatesOnHost(caps);
  return advise ? PlanJobWithAdvice(spec, config, budget, caps.tensor_cores, on_host)
                : PlanJob(spec, config, budget, caps.tensor_cores, on_host);
}

}  // namespace

Result<MemoryPlan> EstimateJob(const JobSpec& spec, const DeviceOptions& device) {
  return Estimate(spec, device, /*advise=*/false);
}

Result<MemoryPlan> EstimateJobWithAdvice(const JobSpec& spec, const DeviceOptions& device) {
  return Estimate(spec, device, /*advise=*/true);
}

}  // namespace traind::engine
