// The memory plan: the arena's measured high-water mark of a real run agrees with EstimateJob's
// total within 2% for several configs; "auto" picks the largest micro-batch that fits (a multiple
// of 8, capped by effective_batch_size, accumulation to reach it, checkpointing only when needed);
// a job that cannot fit is a FAILED_PRECONDITION with the breakdown and what to change, and
// EstimateJobWithAdvice gives its plan with each change's bytes instead.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/device_registry.h"
#include "train/planner.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

struct PlanCase {
  std::string name;
  std::string arch;
  int64_t micro_batch;
  int64_t seq_len;
  bool checkpointing;
};

JobSpec CaseSpec(const std::string& dir, const std::string& data, const PlanCase& c) {
  JobSpec s = testing::TinySpec(dir, data);
  s.training.max_steps = 1;
  s.training.per_device_train_batch_size = c.micro_batch;
  s.training.gradient_checkpointing = c.checkpointing;
  s.data.seq_len = c.seq_len;
  if (c.arch == "llama") {
    s.model.config = testing::TinyLlamaConfig({48, 96, 3, 4, 2, 64});
  } else {
    s.model.config.n_positions = 64;
  }
  return s;
}

TEST(TrainerPlan, MeasuredPeakMatchesPlanWithin2Percent) {
  const std::string dir = testing::MakeTempDir("plan");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 6000, 64, 1);
  const PlanCase cases[] = {
      {"gpt2_b4", "gpt2", 4, 16, false},
      {"gpt2_b16_t64", "gpt2", 16, 64, false},
      {"gpt2_b8_ckpt", "gpt2", 8, 32, true},
      {"llama_gqa_b4", "llama", 4, 32, false},
      {"llama_gqa_b8_ckpt", "llama", 8, 32, true},
  };
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(c.name);
    JobSpec spec = CaseSpec(dir + "/" + c.name, dir + "/tokens.bin", c);
    RunOptions o = testing::TestRunOptions();
    auto est = EstimateJob(spec, o.device);
    ASSERT_TRUE(est.ok()) << est.status().ToString();
    EXPECT_EQ(est->micro_batch, c.micro_batch);
    EXPECT_EQ(est->gradient_checkpointing, c.checkpointing);
    EXPECT_EQ(est->bytes.optimizer, 2 * est->bytes.weights);  // AdamW m and v, fp32
    auto r = RunJob(spec, o, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const double planned = static_cast<double>(est->bytes.total());
    const double peak = static_cast<double>(r->peak_memory_bytes);
    EXPECT_EQ(r->plan.bytes.total(), est->bytes.total());
    EXPECT_LE(std::abs(peak - planned) / planned, 0.02) << "planned " << planned << " peak " << peak;
    std::printf("[plan] %-18s planned %10.0f  measured peak %10.0f  (%+.3f%%)\n", c.name.c_str(),
                planned, peak, 100.0 * (peak - planned) / planned);
  }
}

// Bytes of the tiny gpt2 job at micro-batch b.
// pack: the plan of a device that packs GEMM operands (PlanJob with offload_on_host false: bf16
// then plans packed weights and the packed-activation room, which grows with b).
int64_t Bytes(const JobSpec& s, int64_t b, bool ckpt, bool pack = false) {
  return JobBytes(s.model.config, JobModelOptions(s, b, ckpt, pack)).total();
}

TEST(TrainerPlan, AutoBatchPicksTheLargestFittingMultipleOfEight) {
  JobSpec s = testing::TinySpec("/tmp", "/nonexistent");  // EstimateJob touches no file
  s.training.per_device_train_batch_size = 0;            // "auto"
  DeviceOptions d;
  // A budget that fits 37 sequences but not 38: 37 rounds down to 32.
  d.memory_budget_bytes = Bytes(s, 37, false) + (Bytes(s, 38, false) - Bytes(s, 37, false)) / 2;
  auto p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->micro_batch, 32);
  EXPECT_FALSE(p->gradient_checkpointing);
  EXPECT_EQ(p->gradient_accumulation_steps, 1);
  EXPECT_EQ(p->budget_bytes, d.memory_budget_bytes);
  EXPECT_EQ(p->bytes.total(), Bytes(s, 32, false));
  EXPECT_NE(p->reason.find("37"), std::string::npos) << p->reason;

  // effective_batch_size 20: capped at 20, one step of 20 sequences.
  s.training.effective_batch_size = 20;
  p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->micro_batch, 20);
  EXPECT_EQ(p->gradient_accumulation_steps, 1);

  // effective_batch_size 100 with room for 37: 32 x ceil(100/32) = 4.
  s.training.effective_batch_size = 100;
  p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->micro_batch, 32);
  EXPECT_EQ(p->gradient_accumulation_steps, 4);

  // Room for 5 only: the largest power of two below, 4, and accumulation 25 for 100 (checkpointing
  // stays off unless it would fit 8).
  d.memory_budget_bytes = Bytes(s, 5, false) + 1;
  const bool eight_with_ckpt = Bytes(s, 8, true) <= d.memory_budget_bytes;
  p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->gradient_checkpointing, eight_with_ckpt) << p->reason;
  if (!eight_with_ckpt) {
    EXPECT_EQ(p->micro_batch, 4);
    EXPECT_EQ(p->gradient_accumulation_steps, 25);
  }
}

TEST(TrainerPlan, SixteenBitOnTensorCoresAlignsTheAutoBatchTo64) {
  // Issue 4: "rounded down to a multiple of 8 (64 for 16-bit types on sm_80+)". PlanJob is what
  // RunJob/EstimateJob call; tensor_cores is true for cuda:N devices.
  JobSpec s = testing::TinySpec("/tmp", "/nonexistent");
  s.training.per_device_train_batch_size = 0;  // "auto"
  s.training.bf16 = true;
  auto config = ResolveModelConfig(s);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const int64_t budget =
      Bytes(s, 150, false, true) + (Bytes(s, 151, false, true) - Bytes(s, 150, false, true)) / 2;
  auto gpu = PlanJob(s, *config, budget, /*tensor_cores=*/true);
  auto cpu = PlanJob(s, *config, budget, /*tensor_cores=*/false);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  EXPECT_EQ(gpu->micro_batch, 128);  // 150 fits: a multiple of 64
  EXPECT_EQ(cpu->micro_batch, 144);  // a multiple of 8
  // fp32 keeps the multiple of 8 on tensor cores too; below 64, 16-bit falls back to 8s.
  s.training.bf16 = false;
  auto f32 = PlanJob(s, *config, Bytes(s, 150, false) + 1, true);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->micro_batch, 144);
  s.training.fp16 = true;
  auto small = PlanJob(s, *config, Bytes(s, 50, false) + 1, true);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->micro_batch, 48);
}

TEST(TrainerPlan, AutoTurnsOnCheckpointingOnlyWhenNeeded) {
  // A model whose activations dominate (long sequence, small weights): without checkpointing
  // fewer than 8 fit, with it more do.
  JobSpec s = testing::TinySpec("/tmp", "/nonexistent");
  s.model.config.n_positions = 256;
  s.model.config.n_layer = 6;
  s.data.seq_len = 256;
  s.training.per_device_train_batch_size = 0;
  DeviceOptions d;
  d.memory_budget_bytes = Bytes(s, 6, false) + 1;  // 6 fit without checkpointing
  ASSERT_GT(Bytes(s, 6, false), Bytes(s, 8, true)) << "checkpointing must save memory here";
  auto p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->gradient_checkpointing) << p->reason;
  EXPECT_GE(p->micro_batch, 8);
  EXPECT_NE(p->reason.find("checkpointing"), std::string::npos);
  // With a big budget, no checkpointing.
  d.memory_budget_bytes = Bytes(s, 64, false);
  p = EstimateJob(s, d);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->gradient_checkpointing);
  EXPECT_EQ(p->micro_batch, 64);
}

TEST(TrainerPlan, TooSmallBudgetIsAClearError) {
  JobSpec s = testing::TinySpec("/tmp", "/nonexistent");
  DeviceOptions d;
  d.memory_budget_bytes = Bytes(s, 4, false) / 3;
  auto p = EstimateJob(s, d);  // fixed batch 4
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Status::Code::kFailedPrecondition);
  const std::string& m = p.status().message();
  for (const char* part : {"needs", "budget", "GiB", "weights", "activations", "optimizer",
                           "no single change fits; together, micro-batch 1 with gradient "
                           "checkpointing, offload nvme and LoRA need"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
  // The levers named are exactly those that fit, each with its bytes: with room for checkpointing
  // (and for micro-batch 1) but not for the job as given, both are named; a lever already set
  // (gradient_checkpointing) is never suggested.
  d.memory_budget_bytes = std::max(Bytes(s, 4, true), Bytes(s, 1, false));
  p = EstimateJob(s, d);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("any one of these fits: gradient_checkpointing: true ("),
            std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("per_device_train_batch_size: 1 with gradient_accumulation_steps: 4 ("),
            std::string::npos) << p.status().message();
  s.training.gradient_checkpointing = true;
  d.memory_budget_bytes = Bytes(s, 4, true) - 1;
  p = EstimateJob(s, d);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().find("gradient_checkpointing: true ("), std::string::npos)
      << p.status().message();
  s.training.gradient_checkpointing = false;
  s.training.per_device_train_batch_size = 0;
  d.memory_budget_bytes = 1000;
  p = EstimateJob(s, d);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Status::Code::kFailedPrecondition);

  d.device = "cuda:1";
  p = EstimateJob(s, d);
  EXPECT_EQ(p.status().code(), Status::Code::kFailedPrecondition);
  d.device = "tpu";
  p = EstimateJob(s, d);
  EXPECT_EQ(p.status().code(), Status::Code::kInvalidArgument);
}

DeviceCapabilities Cpu() { return DeviceCapabilitiesOf(DeviceKind::kCpu); }

// The bytes of `s` at micro-batch b on the cpu device, straight from JobBytes (what each lever of
// the advice must report for its changed spec).
int64_t CpuTotal(const JobSpec& s, int64_t b, bool ckpt) {
  return JobBytes(s.model.config, JobModelOptions(s, b, ckpt, PacksGemmWeights(Cpu())), s.training, 1,
                  OffloadUpdatesOnHost(Cpu()))
      .total();
}

// `trainctl estimate` of a job that does not fit (issue 41): no error, but the plan of the smallest
// configuration tried with fits false, each lever with the bytes of its changed spec (those that
// fit first), and the advice of EstimateJob's error as the reason.
TEST(TrainerPlan, EstimateWithAdviceReturnsThePlanOfAJobThatDoesNotFit) {
  JobSpec s = testing::TinySpec("/tmp", "/nonexistent");  // fixed batch 4, fp32, adamw
  ASSERT_EQ(s.training.per_device_train_batch_size, 4);
  DeviceOptions d;
  d.memory_budget_bytes = std::max(Bytes(s, 4, true), Bytes(s, 1, false));
  ASSERT_GT(Bytes(s, 4, false), d.memory_budget_bytes);
  auto p = EstimateJobWithAdvice(s, d);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->fits);
  EXPECT_EQ(p->micro_batch, 4) << "a fixed batch is the only one tried";
  EXPECT_FALSE(p->gradient_checkpointing);
  EXPECT_EQ(p->bytes.total(), Bytes(s, 4, false));
  EXPECT_EQ(p->budget_bytes, d.memory_budget_bytes);
  EXPECT_GT(p->total_params, 0);
  // The reason is EstimateJob's error without the breakdown.
  auto e = EstimateJob(s, d);
  ASSERT_FALSE(e.ok());
  const std::string& m = e.status().message();
  const std::string advice = m.substr(m.find("): ") + 3);
  EXPECT_EQ(p->reason, m.substr(0, m.find(" (")) + ": " + advice);
  EXPECT_EQ(advice.rfind("any one of these fits: gradient_checkpointing: true (", 0), 0u) << advice;

  // Each lever: its changed spec's bytes, fits == within the budget, those that fit first.
  std::map<std::string, JobSpec> changed;
  for (const char* optim : {"adamw_8bit", "adafactor"}) {
    changed["optim: " + std::string(optim)] = s;
    changed["optim: " + std::string(optim)].training.optim = optim;
  }
  changed["offload: cpu"] = s;
  changed["offload: cpu"].training.offload = "cpu";
  changed["offload: nvme (with offload_dir)"] = s;
  changed["offload: nvme (with offload_dir)"].training.offload = "nvme";
  changed["bf16: true"] = s;
  changed["bf16: true"].training.bf16 = true;
  changed["peft: {type: lora, r: 8}"] = s;
  changed["peft: {type: lora, r: 8}"].training.peft = PeftSpec{};
  {  // QLoRA: LoRA on an NF4 base with double quantization, in bf16
    const std::string q =
        "peft: {type: lora, r: 8} with quantization_config: {load_in_4bit: true, "
        "bnb_4bit_quant_type: nf4, bnb_4bit_use_double_quant: true} (QLoRA)";
    changed[q] = changed["peft: {type: lora, r: 8}"];
    changed[q].training.bf16 = true;
    QuantizationSpec qs;
    qs.load_in_4bit = true;
    qs.bnb_4bit_quant_type = "nf4";
    qs.bnb_4bit_use_double_quant = true;
    qs.bnb_4bit_compute_dtype = "bfloat16";
    changed[q].model.quantization_config = qs;
  }
  std::map<std::string, int64_t> want = {
      {"gradient_checkpointing: true", CpuTotal(s, 4, true)},
      {"per_device_train_batch_size: 1 with gradient_accumulation_steps: 4", CpuTotal(s, 1, false)}};
  for (const auto& [what, spec] : changed) want[what] = CpuTotal(spec, 4, false);
  // Listed: exactly the changes that lower the bytes (bf16 may not: its fp32 master copy).
  size_t helping = 0;
  for (const auto& [what, bytes] : want) helping += bytes < p->bytes.total();
  ASSERT_EQ(p->levers.size(), helping);
  bool fitting = true;
  int fit = 0;
  for (const PlanLever& l : p->levers) {
    SCOPED_TRACE(l.change);
    ASSERT_EQ(want.count(l.change), 1u);
    EXPECT_EQ(l.bytes, want[l.change]);
    EXPECT_LT(l.bytes, p->bytes.total());
    EXPECT_EQ(l.fits, l.bytes <= d.memory_budget_bytes);
    EXPECT_TRUE(fitting || !l.fits) << "the levers that fit come first";
    fitting = l.fits;
    fit += l.fits;
    if (l.fits) {
      EXPECT_NE(p->reason.find(l.change + " ("), std::string::npos) << p->reason;
    }
  }
  EXPECT_GE(fit, 2);  // checkpointing and micro-batch 1 at least
  EXPECT_LT(fit, static_cast<int>(p->levers.size())) << "some lever must not fit here";

  // "auto" with no room at all: micro-batch 1 with checkpointing (accumulation for
  // effective_batch_size), and the combination of every lever, which does not fit either, last.
  s.training.per_device_train_batch_size = 0;
  s.training.effective_batch_size = 6;
  d.memory_budget_bytes = 1000;
  p = EstimateJobWithAdvice(s, d);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->fits);
  EXPECT_EQ(p->micro_batch, 1);
  EXPECT_TRUE(p->gradient_checkpointing);
  EXPECT_EQ(p->gradient_accumulation_steps, 6);
  EXPECT_EQ(p->bytes.total(), Bytes(s, 1, true));
  ASSERT_FALSE(p->levers.empty());
  for (const PlanLever& l : p->levers) EXPECT_FALSE(l.fits) << l.change;
  JobSpec all = s;
  all.training.offload = "nvme";
  all.training.peft = PeftSpec{};
  EXPECT_EQ(p->levers.back().change, "together: micro-batch 1 with gradient checkpointing, offload nvme and LoRA");
  EXPECT_EQ(p->levers.back().bytes, CpuTotal(all, 1, true));
  EXPECT_NE(p->reason.find("use a device with more memory"), std::string::npos) << p->reason;

  // A job that fits: the same plan as EstimateJob's, fits, no levers.
  d.memory_budget_bytes = Bytes(s, 64, false);
  p = EstimateJobWithAdvice(s, d);
  auto q = EstimateJob(s, d);
  ASSERT_TRUE(p.ok() && q.ok());
  EXPECT_TRUE(p->fits);
  EXPECT_TRUE(p->levers.empty());
  EXPECT_EQ(p->micro_batch, q->micro_batch);
  EXPECT_EQ(p->bytes.total(), q->bytes.total());
  EXPECT_EQ(p->reason, q->reason);
  // Errors other than not fitting stay errors.
  d.device = "tpu";
  EXPECT_EQ(EstimateJobWithAdvice(s, d).status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace traind::engine
