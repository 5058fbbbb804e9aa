// MemoryPlan: the bytes a training job will allocate, by category, computed before anything runs.
// The same numbers drive `trainctl estimate`, the auto batch size, admission in worker/, and the
// engine's allocator, whose measured high-water mark must agree with `total()`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace traind::engine {

struct MemoryBytes {
  int64_t weights = 0;      // parameters (and fp32 master copies with mixed precision)
  int64_t gradients = 0;    // parameter gradients
  int64_t optimizer = 0;    // optimizer state (AdamW: m and v; MemoryPlan::optimizer names it)
  int64_t activations = 0;  // forward activations kept for backward
  int64_t temporary = 0;    // scratch buffers live only within a layer or op
  int64_t total() const { return weights + gradients + optimizer + activations + temporary; }
};

// One change of a job's spec and the bytes its plan would need with it: the advice for a job that
// does not fit (MemoryPlan::levers).
struct PlanLever {
  std::string change;  // as the spec would say it: "gradient_checkpointing: true", "offload: cpu"
  int64_t bytes = 0;   // the plan's total with this change
  bool fits = false;   // bytes <= the budget
};

struct MemoryPlan {
  int64_t micro_batch = 0;                  // sequences per micro-batch
  int64_t gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  bool gradient_checkpointing = false;
  std::string precision = "fp32";           // "fp32" | "bf16" | "fp16"
  std::string optimizer = "adamw";          // training.optim, whose state is bytes.optimizer
  // Parameters as HF counts them (unpadded vocabulary, tied embeddings once): the trainable ones
  // (all, or with training.peft the LoRA adapters) and the total (base + adapters).
  int64_t trainable_params = 0;
  int64_t total_params = 0;
  // training.offload: none | cpu | nvme. With offload, bytes.optimizer is the device window (one
  // group's state) and offload_state_bytes what the store holds (host RAM or disk).
  std::string offload = "none";
  int64_t offload_state_bytes = 0;
  // The fp32 master weights in the store too (offload with a 16-bit compute type, no
  // LoRA, no ZeRO-1, no sample_every): bytes.weights then counts the 16-bit weights and the fp32
  // copies of the tensors read in fp32 only. 0 when the master weights stay on the device.
  int64_t offload_master_bytes = 0;
  // Whether the job keeps the cpu device's packed copies of its 16-bit GEMM weights
  // (ModelOptions::pack_weights): a speed choice the planner drops, before it refuses a job, when
  // they do not fit (`reason` then says so). false on every other device.
  bool packed_weights = false;
  // QLoRA (model.quantization_config): the bytes of the 4-bit frozen base within bytes.weights
  // (packed codes and absmax), and the elements it holds; 0 without quantization.
  int64_t quantized_base_bytes = 0;
  int64_t quantized_base_params = 0;
  MemoryBytes bytes;
  int64_t budget_bytes = 0;                 // the budget it was planned against (0 = unlimited)
  std::string reason;                       // one line: why this batch and these techniques
  // false only from EstimateJobWithAdvice (trainer.h) for a job that does not fit even in the
  // smallest configuration tried: the plan is that configuration's (bytes.total() > budget_bytes),
  // `reason` the advice in one line and `levers` each single change that lowers its bytes, with
  // those bytes (the ones that fit first), and, when none fits alone, all of them together last.
  bool fits = true;
  std::vector<PlanLever> levers;
};

}  // namespace traind::engine
