// mixtral through the normal job path (RunJob, CPU): a tiny mixture-of-experts model trains
// (its loss falls), every step reports the tokens routed to each expert of each layer (they sum to
// tokens x top-k x layers), the output folder is a MixtralForCausalLM with HF tensor names, and a
// cancelled and resumed run repeats the uninterrupted run's losses bit for bit, also with
// gradient accumulation and gradient checkpointing (routing recomputed, not recounted).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "trainer_test_util.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::TestRunOptions;

JobSpec TinyMixtralSpec(const std::string& dir, const std::string& data) {
  JobSpec s = testing::TinySpec(dir, data);
  ModelConfig& c = s.model.config;
  c = ModelConfig{};
  c.arch = Arch::kMixtral;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.output_router_logits = true;
  c.router_aux_loss_coef = 0.02;
  return s;
}

TEST(MixtralTrainerTest, TrainsReportsRoutingAndWritesHfFolder) {
  const std::string dir = MakeTempDir("mixtral_job");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 20000, 64, 3);
  JobSpec spec = TinyMixtralSpec(dir, data);
  spec.training.max_steps = 40;
  spec.training.logging_steps = 10;
  std::vector<StepReport> steps;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { steps.push_back(r); };
  Result<RunSummary> run = RunJob(spec, TestRunOptions(1), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(steps.size(), 40u);
  const double first = (steps[0].loss + steps[1].loss + steps[2].loss) / 3;
  const double last = (steps[37].loss + steps[38].loss + steps[39].loss) / 3;
  EXPECT_LT(last, first - 0.5) << "the model did not learn";
  for (const StepReport& r : steps) {
    ASSERT_EQ(r.expert_layers, 2);
    ASSERT_EQ(r.expert_tokens.size(), 8u);
    // B=4 x T=16 tokens, each to 2 experts, in each of 2 layers (eval forwards not counted).
    EXPECT_EQ(std::accumulate(r.expert_tokens.begin(), r.expert_tokens.end(), int64_t{0}),
              4 * 16 * 2 * 2);
  }
  const nlohmann::json config = nlohmann::json::parse(ReadFile(spec.output_dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["output_router_logits"], true);
  auto model = ReadSafetensors(spec.output_dir + "/model.safetensors");
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE(model->tensors.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_TRUE(model->tensors.count("model.layers.0.block_sparse_moe.gate.weight"));
}

TEST(MixtralTrainerTest, ResumeIsBitIdentical) {
  for (bool variant : {false, true}) {
    SCOPED_TRACE(variant ? "accumulation 2 + checkpointing" : "plain");
    const std::string dir = MakeTempDir("mixtral_resume");
    const std::string data = dir + "/tokens.bin";
    testing::WriteSyntheticTokens(data, 20000, 64, 4);
    JobSpec a = TinyMixtralSpec(dir + "/a", data);
    a.training.save_steps = 2;
    if (variant) {
      a.training.gradient_accumulation_steps = 2;
      a.training.per_device_train_batch_size = 2;
      a.training.gradient_checkpointing = true;
    }
    JobSpec b = a;
    b.output_dir = dir + "/b/out";
    const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(a, b);
    ASSERT_TRUE(r.a && r.a->ok()) << (r.a ? r.a->status().ToString() : "");
    ASSERT_TRUE(r.b_resumed && r.b_resumed->ok())
        << (r.b_resumed ? r.b_resumed->status().ToString() : "");
    testing::ExpectResumedLossesIdentical(r);
  }
}

}  // namespace
}  // namespace traind::engine
