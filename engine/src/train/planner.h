// The memory planner behind EstimateJob and RunJob: bytes per category for a job at a micro-batch
// (model + optimizer + the trainer's own device buffers), the device budget, and the choice of
// micro-batch, accumulation and gradient checkpointing for per_device_train_batch_size "auto".
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"  // DeviceCapabilities
#include "models/model.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"
#include "traind/engine/trainer.h"  // DeviceOptions, EstimateJob

namespace traind::engine {

// The model config of the job: spec.model.config, or init_from's config.json when init_from is set.
Result<ModelConfig> ResolveModelConfig(const JobSpec& spec);

// The model options a job runs its model with at micro-batch `micro_batch`; pack_weights: on a
// device that packs GEMM weights (PacksGemmWeights).
ModelOptions JobModelOptions(const JobSpec& spec, int64_t micro_batch, bool gradient_checkpointing,
                             bool pack_weights = false);
// Whether a job on a device with `caps` keeps packed copies of its bf16 weights
// (ModelOptions::pack_weights): DeviceCapabilities::packs_gemm_weights (the cpu backend, whose
// oneDNN GEMMs otherwise copy the weights into their blocked layout on every call).
bool PacksGemmWeights(const DeviceCapabilities& caps);
// Whether the job keeps its fp32 weights off the device (ModelOptions::
// master_weights_off_device): bf16 or fp16 with training.peft (always: the frozen base is held in
// the compute type only, its fp32 copy is nowhere, the merge re-reads it), or training.offload
// cpu | nvme (any optim) without ZeRO-1 (sample_every then generates from the 16-bit compute
// weights).
bool MasterWeightsOffDevice(const JobSpec& spec);
// Whether a model of `config` built with `options` keeps its master weights in the optimizer's
// store (decoder families without LoRA; the encoder keeps its weights on the device).
bool MasterWeightsOffModel(const ModelConfig& config, const ModelOptions& options);
// Whether training.offload updates on the host on a device with `caps`
// (OffloadOptions::update_on_host): a device with a memory of its own (has_own_memory: cuda:N,
// simt). The optimizer's state windows then live on the host, not in the device plan.
bool OffloadUpdatesOnHost(const DeviceCapabilities& caps);

// Every byte RunJob allocates in the arena for `config` with `options`: Model::PlanBytes, the
// optimizer's state (AdamW: 2 * params * 4 bytes) and the step runner's device buffers (StepRunner::PlanBytes: two
// micro-batch upload slots and the step scalars, counted as activations).
// `training` names the optimizer (its state bytes: OptimizerPlanBytes); the default is AdamW.
// `zero_shards` > 1 (distributed.zero_stage 1 over that many ranks): the optimizer bytes of the
// largest rank's shard (ZeroOnePlanBytes). `offload_on_host`: OffloadUpdatesOnHost of the device.
MemoryBytes JobBytes(const ModelConfig& config, const ModelOptions& options,
                     const TrainingSpec& training = TrainingSpec{}, int zero_shards = 1,
                     bool offload_on_host = false);

// Plans `spec` (with model config `config`) against `budget_bytes` (> 0). With a fixed
// per_device_train_batch_size: that batch, FAILED_PRECONDITION when it does not fit. With "auto":
// the largest micro-batch that fits, rounded down to a multiple of 8 (or to a power of two below
// 8; a multiple of 64 when `tensor_cores` and the precision is bf16/fp16: a CUDA device of sm_80
// or later), capped at effective_batch_size; gradient checkpointing is turned on (unless the spec already
// asks for it) only when fewer than min(8, effective_batch_size) sequences fit without it and
// it makes the rounded micro-batch larger; accumulation = ceil(effective_batch_size / micro_batch) when
// effective_batch_size is given. `offload_on_host`: OffloadUpdatesOnHost of the device.
Result<MemoryPlan> PlanJob(const JobSpec& spec, const ModelConfig& config, int64_t budget_bytes,
                           bool tensor_cores = false, bool offload_on_host = false);
// As PlanJob, but a job that does not fit is no error: the plan of the smallest configuration
// tried (the given micro-batch, or micro-batch 1 with gradient checkpointing for "auto"), with
// fits false and the advice in levers and reason (MemoryPlan).
Result<MemoryPlan> PlanJobWithAdvice(const JobSpec& spec, const ModelConfig& config,
                                     int64_t budget_bytes, bool tensor_cores = false,
                                     bool offload_on_host = false);

// "1.23 GiB".
std::string FormatGiB(int64_t bytes);

}  // namespace traind::engine
