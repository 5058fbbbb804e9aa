// Mixed precision through RunJob: bf16 and fp16 runs of a tiny byte-level gpt2 on tinyshakespeare
// track the fp32 run from the same initial weights and batches (final validation loss within 3%,
// every logged training loss within 3%); the arena's peak equals the plan for 16-bit jobs;
// tf32 is accepted and reported as having no effect on the CPU; fp16 + bf16 together is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trainer_test_util.h"

namespace traind::engine {
namespace {

struct Curve {
  RunSummary summary;
  std::vector<double> losses;  // log_history "loss" entries
  double seconds = 0;
};

Curve RunPrecision(const JobSpec& base, const std::string& precision) {
  JobSpec spec = base;
  spec.training.bf16 = precision == "bf16";
  spec.training.fp16 = precision == "fp16";
  spec.output_dir = base.output_dir + "_" + precision;
  Curve c;
  const auto t0 = std::chrono::steady_clock::now();
  auto run = RunJob(spec, testing::TestRunOptions(), {});
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(run.ok()) << precision << ": " << run.status().ToString();
  if (!run.ok()) return c;
  c.summary = *run;
  const nlohmann::json st =
      nlohmann::json::parse(testing::ReadFile(spec.output_dir + "/trainer_state.json"));
  for (const auto& e : st["log_history"]) {
    if (e.contains("loss")) c.losses.push_back(e["loss"].get<double>());
  }
  return c;
}

TEST(MixedPrecisionTrainer, TinyShakespeareBf16AndFp16TrackFp32) {
  const std::string text = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!std::filesystem::exists(text)) {
    GTEST_SKIP() << "SKIPPED: " << text << " is absent (shared data is not part of the project)";
  }
  const std::string dir = testing::MakeTempDir("mp_shakespeare");
  JobSpec spec = testing::TinyShakespeareSpec(text, dir + "/out");
  spec.training.logging_steps = 10;

  const Curve fp32 = RunPrecision(spec, "fp32");
  const Curve bf16 = RunPrecision(spec, "bf16");
  const Curve fp16 = RunPrecision(spec, "fp16");
  ASSERT_EQ(fp32.losses.size(), 20u);
  // Learned: well below the uniform-byte loss ln(256) = 5.55.
  EXPECT_LT(fp32.summary.eval_loss, 3.0);
  for (const Curve* c : {&bf16, &fp16}) {
    const bool is_bf16 = c == &bf16;
    const char* name = is_bf16 ? "bf16" : "fp16";
    ASSERT_EQ(c->losses.size(), fp32.losses.size()) << name;
    const double rel =
        std::abs(c->summary.eval_loss - fp32.summary.eval_loss) / fp32.summary.eval_loss;
    std::printf("[mp] %s eval_loss %.4f vs fp32 %.4f (%+.2f%%); %.1fs vs fp32 %.1fs\n", name,
                c->summary.eval_loss, fp32.summary.eval_loss, 100.0 * rel, c->seconds,
                fp32.seconds);
    EXPECT_LE(rel, 0.03) << name;
    for (size_t i = 0; i < fp32.losses.size(); ++i) {
      EXPECT_LE(std::abs(c->losses[i] - fp32.losses[i]) / fp32.losses[i], 0.03)
          << name << " log entry " << i << ": " << c->losses[i] << " vs " << fp32.losses[i];
    }
    EXPECT_EQ(c->summary.plan.precision, name);
    // Every byte the arena held is planned: peak == plan, and 16-bit activations are smaller.
    EXPECT_EQ(c->summary.peak_memory_bytes, c->summary.plan.bytes.total()) << name;
    EXPECT_LT(c->summary.plan.bytes.activations, fp32.summary.plan.bytes.activations) << name;
    EXPECT_GT(c->summary.plan.bytes.weights, fp32.summary.plan.bytes.weights) << name;
    EXPECT_EQ(c->summary.plan.bytes.optimizer, fp32.summary.plan.bytes.optimizer) << name;
  }
  EXPECT_EQ(fp32.summary.peak_memory_bytes, fp32.summary.plan.bytes.total());
}

TEST(MixedPrecisionTrainer, Tf32IsAcceptedAndReportedAsNoOpOnCpu) {
  const std::string dir = testing::MakeTempDir("mp_tf32");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 64, 5);
  JobSpec spec = testing::TinySpec(dir, data);
  spec.training.tf32 = true;
  spec.training.max_steps = 2;
  std::vector<std::string> messages;
  RunCallbacks cb;
  cb.on_message = [&](const std::string& m) { messages.push_back(m); };
  auto run = RunJob(spec, testing::TestRunOptions(), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  bool said = false;
  for (const std::string& m : messages) {
    said =
        said || (m.find("tf32") != std::string::npos && m.find("no effect") != std::string::npos);
  }
  EXPECT_TRUE(said) << "no on_message line says tf32 has no effect on the CPU";
  EXPECT_EQ(run->plan.precision, "fp32");
}

TEST(MixedPrecisionTrainer, Fp16AndBf16TogetherIsAnError) {
  const std::string dir = testing::MakeTempDir("mp_both");
  const std::string data = dir + "/tokens.bin";
  testing::WriteSyntheticTokens(data, 3000, 64, 5);
  JobSpec spec = testing::TinySpec(dir, data);
  spec.training.fp16 = true;
  spec.training.bf16 = true;
  auto run = RunJob(spec, testing::TestRunOptions(), {});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(run.status().message().find("training.bf16"), std::string::npos)
      << run.status().ToString();
}

}  // namespace
}  // namespace traind::engine
