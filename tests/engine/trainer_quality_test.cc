// Training quality: a byte-level gpt2 trained by RunJob on tinyshakespeare reaches a validation
// loss within 2% of the PyTorch reference (reference/train_reference.py) trained with the same
// config, the same initial weights (ours, exported) and the same batches (shuffle: false).
// Size: the tiny gpt2: 4 layers, d256, 4 heads, T128, B8, vocab 256, 200 steps.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "data/window_order.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "core/safetensors.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

TEST(TrainerQuality, TinyShakespeareMatchesPyTorchWithin2Percent) {
  const std::string text = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!std::filesystem::exists(text)) {
    GTEST_SKIP() << "SKIPPED: " << text << " is absent (shared data is not part of the project)";
  }
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  const std::string dir = testing::MakeTempDir("quality");
  JobSpec spec = testing::TinyShakespeareSpec(text, dir + "/out");
  spec.training.logging_steps = 1;
  const TrainingSpec& t = spec.training;

  const std::string init = dir + "/init";
  std::filesystem::create_directories(init);
  {
    std::unique_ptr<Backend> backend = MakeCpuBackend(1);
    DeviceArena arena(backend.get(), 0);
    ModelOptions mo;
    mo.micro_batch = 8;
    mo.seq_len = 128;
    auto model = Model::Create(spec.model.config, mo, &arena);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    (*model)->InitRandom(static_cast<uint64_t>(t.seed));
    ASSERT_TRUE(WriteSafetensors(init + "/model.safetensors", (*model)->ExportHf()).ok());
    testing::WriteFile(init + "/config.json", WriteHfConfigJson(spec.model.config));
  }
  spec.model.init_from = init;

  auto t0 = std::chrono::steady_clock::now();
  // One thread on each side: on the shared 2-core CI machine spinning OpenMP teams of two are
  // slower for a model this small.
  RunOptions options = testing::TestRunOptions(1);
  auto run = RunJob(spec, options, {});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  auto t1 = std::chrono::steady_clock::now();

  const int64_t n = static_cast<int64_t>(std::filesystem::file_size(text));
  nlohmann::json c = {{"arch", "gpt2"},
                      {"config", nlohmann::json::parse(WriteHfConfigJson(spec.model.config))},
                      {"data_file", text}, {"format", "text"},
                      {"train_tokens", TrainTokenCount(n, spec.data.validation_split)},
                      {"seq_len", 128}, {"micro_batch", 8}, {"accum", 1}, {"steps", t.max_steps},
                      {"lr", t.learning_rate}, {"schedule", "cosine"}, {"warmup", t.warmup_steps},
                      {"weight_decay", t.weight_decay}, {"beta1", 0.9}, {"beta2", 0.999},
                      {"eps", 1e-8}, {"max_grad_norm", 1.0}, {"threads", 1}, {"eval", true}};
  testing::WriteFile(dir + "/case.json", c.dump());
  std::filesystem::copy_file(init + "/model.safetensors", dir + "/init.safetensors");
  std::string out;
  ASSERT_EQ(testing::RunPython("train_reference.py", dir, &out), 0) << out;
  auto t2 = std::chrono::steady_clock::now();
  nlohmann::json ref = nlohmann::json::parse(testing::ReadFile(dir + "/ref.json"));
  const double ref_eval = ref["eval_loss"].get<double>();
  std::printf("[quality] eval_loss ours %.5f  pytorch %.5f  (%+.3f%%), train_loss ours %.5f; "
              "ours %.1fs, pytorch %.1fs\n",
              run->eval_loss, ref_eval, 100.0 * (run->eval_loss - ref_eval) / ref_eval,
              run->train_loss, std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
  // Same weights and batches: the first steps agree to fp32 rounding (later ones drift apart
  // chaotically, which is why the end point is compared at 2%).
  nlohmann::json st = nlohmann::json::parse(testing::ReadFile(spec.output_dir + "/trainer_state.json"));
  std::vector<double> ours;
  for (auto& e : st["log_history"]) {
    if (e.contains("loss")) ours.push_back(e["loss"].get<double>());
  }
  ASSERT_EQ(ours.size(), static_cast<size_t>(t.max_steps));
  // At d256 the fp32 rounding differences grow by about 10x every 5 Adam steps (measured: step 10
  // differs by 1.7e-5 relative), so the first five steps are held to 1e-5 and the next five to 1e-4.
  for (int s = 0; s < 10; ++s) {
    const double r = ref["losses"][s].get<double>();
    EXPECT_NEAR(ours[s], r, (s < 5 ? 1e-5 : 1e-4) * r) << "step " << s + 1;
  }
  // Learned something: well below the uniform-byte loss ln(256) = 5.55.
  EXPECT_LT(ref_eval, 2.9);
  EXPECT_LE(std::abs(run->eval_loss - ref_eval) / ref_eval, 0.02);
}

}  // namespace
}  // namespace traind::engine
