// The llama-like families through the trainer: three AdamW steps of RunJob (what `traind run`
// and the daemon's job runner call) from an init_from folder, against torch.optim.AdamW on the
// torch-primitive model of reference/model_reference.py (reference/train_reference.py): per-step
// loss, grad norm, learning rate and the final weights within 1e-5 relative. Variants: qwen2
// (q/k/v biases), mistral (a sliding window shorter than the sequence), llama with Llama 3.1's
// rope_scaling, and llama with an explicit head_dim, attention_bias and linear rope_scaling; a
// vocabulary of 61 (padded to 64 in the engine's layout).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "core/safetensors.h"
#include "data/window_order.h"
#include "model_test_util.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

class FamiliesTrain : public ::testing::TestWithParam<std::string> {};

TEST_P(FamiliesTrain, ThreeAdamWStepsMatchTorch) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  const std::string dir = testing::MakeTempDir("families_" + GetParam());
  const std::string data = dir + "/tokens.bin";
  const int64_t n_tokens = 4000;
  testing::WriteSyntheticTokens(data, n_tokens, 61, 3);
  JobSpec spec = testing::TinySpec(dir, data);
  spec.model.config = testing::TinyFamily(GetParam());
  spec.model.config.vocab_size = 61;
  spec.data.shuffle = false;
  spec.training.max_steps = 3;
  spec.training.warmup_steps = 1;
  spec.training.learning_rate = 2e-3;
  spec.training.max_grad_norm = 0.5;
  spec.training.logging_steps = 1;

  const std::string init = dir + "/init";
  std::filesystem::create_directories(init);
  {
    std::unique_ptr<Backend> backend = MakeCpuBackend(1);
    DeviceArena arena(backend.get(), 0);
    ModelOptions mo;
    mo.micro_batch = 4;
    mo.seq_len = 16;
    auto model = Model::Create(spec.model.config, mo, &arena);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    Model& m = **model;
    m.InitRandom(11);
    // Non-zero attention biases, so a bias on the wrong rows shows in the loss.
    for (const ParamInfo& p : m.params()) {
      if (p.hf_name.find("_proj.bias") == std::string::npos) continue;
      for (int64_t i = 0; i < p.numel; ++i) {
        m.param_data()[p.offset + i] = 0.2f * std::sin(0.9f * static_cast<float>(i + p.offset));
      }
    }
    ASSERT_TRUE(WriteSafetensors(init + "/model.safetensors", m.ExportHf()).ok());
    testing::WriteFile(init + "/config.json", WriteHfConfigJson(spec.model.config));
  }
  spec.model.init_from = init;
  auto run = RunJob(spec, testing::TestRunOptions(), {});
  ASSERT_TRUE(run.ok()) << run.status().ToString();

  nlohmann::json cfg = nlohmann::json::parse(WriteHfConfigJson(spec.model.config));
  nlohmann::json c = {{"arch", ArchName(spec.model.config.arch)}, {"config", cfg}, {"data_file", data},
                      {"format", "uint16"},
                      {"train_tokens", TrainTokenCount(n_tokens, spec.data.validation_split)},
                      {"seq_len", 16}, {"micro_batch", 4}, {"accum", 1}, {"steps", 3},
                      {"lr", 2e-3}, {"schedule", "cosine"}, {"warmup", 1},
                      {"weight_decay", 0.1}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8},
                      {"max_grad_norm", 0.5}, {"threads", 1}, {"eval", true}};
  testing::WriteFile(dir + "/case.json", c.dump());
  std::filesystem::copy_file(init + "/model.safetensors", dir + "/init.safetensors");
  std::string out;
  ASSERT_EQ(testing::RunPython("train_reference.py", dir, &out), 0) << out;
  nlohmann::json ref = nlohmann::json::parse(testing::ReadFile(dir + "/ref.json"));

  nlohmann::json st = nlohmann::json::parse(testing::ReadFile(spec.output_dir + "/trainer_state.json"));
  std::vector<nlohmann::json> logs;
  for (auto& e : st["log_history"]) {
    if (e.contains("loss")) logs.push_back(e);
  }
  ASSERT_EQ(logs.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    const double loss = ref["losses"][s], norm = ref["grad_norms"][s], lr = ref["lrs"][s];
    EXPECT_NEAR(logs[s]["loss"].get<double>(), loss, 1e-5 * std::abs(loss)) << "step " << s;
    EXPECT_NEAR(logs[s]["grad_norm"].get<double>(), norm, 1e-5 * norm) << "step " << s;
    EXPECT_NEAR(logs[s]["learning_rate"].get<double>(), lr, 1e-12) << "step " << s;
  }
  EXPECT_NEAR(run->eval_loss, ref["eval_loss"].get<double>(), 1e-5 * ref["eval_loss"].get<double>());

  auto ours = ReadSafetensors(spec.output_dir + "/model.safetensors");
  auto theirs = ReadSafetensors(dir + "/ref_final.safetensors");
  ASSERT_TRUE(ours.ok() && theirs.ok());
  ASSERT_EQ(ours->tensors.size(), theirs->tensors.size());
  for (const auto& [name, t] : theirs->tensors) {
    ASSERT_TRUE(ours->tensors.count(name)) << name;
    if (name.find("k_proj.bias") != std::string::npos) {
      // The key bias has an exactly-zero true gradient (softmax ignores a shift shared by all
      // keys): both sides see rounding noise, which Adam turns into steps of up to lr.
      auto a = ours->tensors[name].ToF32().value(), b = t.ToF32().value();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_LE(std::abs(static_cast<double>(a[i]) - b[i]), 3 * spec.training.learning_rate)
            << name << "[" << i << "]";
      }
      continue;
    }
    EXPECT_LE(testing::MaxRelDiff(ours->tensors[name], t), 1e-5) << name;
  }
  // The written config.json loads back as the same model and writes byte-identically.
  const std::string written = testing::ReadFile(spec.output_dir + "/config.json");
  Result<ModelConfig> back = ReadHfConfig(spec.output_dir + "/config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(WriteHfConfigJson(*back), written);
  EXPECT_EQ(back->rope_scaling, spec.model.config.rope_scaling);
  EXPECT_EQ(back->sliding_window, spec.model.config.sliding_window);
  EXPECT_EQ(back->head_size(), spec.model.config.head_size());
}

INSTANTIATE_TEST_SUITE_P(LlamaLike, FamiliesTrain,
                         ::testing::Values("qwen2", "mistral", "llama3_rope", "llama_head_dim",
                                           "qwen3", "gemma"));

}  // namespace
}  // namespace traind::engine
