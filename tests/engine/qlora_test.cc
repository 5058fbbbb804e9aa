// A frozen LoRA base costs its compute type and no more (issue 43 item 0): with training.peft and
// bf16/fp16 the base's GEMM weights are held only in the compute type, with or without offload, and
// the cpu's packed weight copies are dropped by the planner (before it refuses a job) when they do
// not fit.
#include <gtest/gtest.h>

#include <cstdio>

#include "train/planner.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A 7B llama (hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000, untied), bf16,
// LoRA r 16 on q/k/v/o, seq 2048, batch 1, checkpointing, on the cpu device with `budget` bytes.
JobSpec Llama7bLora() {
  JobSpec s;
  s.name = "llama7b-lora";
  s.model.config.arch = "llama";
  s.model.config.vocab_size = 32000;
  s.model.config.hidden_size = 4096;
  s.model.config.intermediate_size = 11008;
  s.model.config.num_hidden_layers = 32;
  s.model.config.num_attention_heads = 32;
  s.model.config.num_key_value_heads = 32;
  s.model.config.max_position_embeddings = 2048;
  s.model.config.tie_word_embeddings = false;
  s.data.train_file = "unused.bin";
  s.data.seq_len = 2048;
  s.output_dir = "unused";
  s.training.bf16 = true;
  s.training.per_device_train_batch_size = 1;
  s.training.gradient_checkpointing = true;
  PeftSpec p;
  p.r = 16;
  p.lora_alpha = 32;
  p.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  s.training.peft = p;
  return s;
}

// The base's parameters as HF counts them.
int64_t Llama7bParams() {
  const int64_t C = 4096, I = 11008, L = 32, V = 32000;
  return 2 * V * C + L * (4 * C * C + 3 * C * I + 2 * C) + C;
}

TEST(FrozenBase, SevenBillionLoraPlansItsWeightsInBf16) {
  const int64_t base16 = 2 * Llama7bParams();
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 24 * kGiB;  // the machine
  auto est = EstimateJob(Llama7bLora(), d);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  std::printf("[7B LoRA bf16, cpu 24 GiB] weights %.2f GiB (base in bf16 %.2f GiB), total %.2f GiB; %s\n",
              static_cast<double>(est->bytes.weights) / kGiB, static_cast<double>(base16) / kGiB,
              static_cast<double>(est->bytes.total()) / kGiB, est->reason.c_str());
  EXPECT_LE(static_cast<double>(est->bytes.weights), 1.1 * static_cast<double>(base16));
  EXPECT_GE(est->bytes.weights, base16);
  // The packed copies did not fit: dropped, and the reason says so.
  EXPECT_FALSE(est->packed_weights);
  EXPECT_NE(est->reason.find("packed weight copies"), std::string::npos) << est->reason;

  // On a device that does not pack, with or without offload: the same weights.
  JobSpec offload = Llama7bLora();
  offload.training.offload = "cpu";
  for (const JobSpec& s : {Llama7bLora(), offload}) {
    const ModelConfig& c = s.model.config;
    const MemoryBytes b = JobBytes(c, JobModelOptions(s, 1, true, /*pack_weights=*/false), s.training);
    EXPECT_LE(static_cast<double>(b.weights), 1.1 * static_cast<double>(base16)) << s.training.offload;
  }
  // Full fine-tuning keeps its fp32 master weights (no LoRA: nothing changes there).
  JobSpec full = Llama7bLora();
  full.training.peft.reset();
  const MemoryBytes fb = JobBytes(full.model.config, JobModelOptions(full, 1, true), full.training);
  EXPECT_GE(fb.weights, 3 * Llama7bParams());
}

// With room for them, the cpu keeps its packed copies (a speed choice, not dropped needlessly).
TEST(FrozenBase, PackedCopiesStayWhenTheyFit) {
  DeviceOptions d;
  d.device = "cpu";
  d.memory_budget_bytes = 200 * kGiB;
  auto est = EstimateJob(Llama7bLora(), d);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  EXPECT_TRUE(est->packed_weights);
  EXPECT_GT(static_cast<double>(est->bytes.weights), 2.0 * 2 * Llama7bParams());
  EXPECT_EQ(est->reason.find("packed weight copies"), std::string::npos) << est->reason;
}

}  // namespace
}  // namespace traind::engine
