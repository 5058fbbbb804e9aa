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
#include "optim_test_util.h"
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

  // Non-zero attention biases, so a bias on the wrong rows shows in the loss.
  auto biases = [](Model& m) {
    for (const ParamInfo& p : m.params()) {
      if (p.hf_name.find("_proj.bias") == std::string::npos) continue;
      for (int64_t i = 0; i < p.numel; ++i) {
        m.param_data()[p.offset + i] = 0.2f * std::sin(0.9f * static_cast<float>(i + p.offset));
      }
    }
  };
  testing::TorchParityRun r;
  testing::TrainAgainstTorch(&spec, dir, data, n_tokens, nlohmann::json::object(), biases, &r);
  if (HasFatalFailure()) return;
  testing::ExpectStepsMatchTorch(r, 3, /*check_lr=*/true);

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
