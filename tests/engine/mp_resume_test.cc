// fp16 resume: the dynamic loss scaler's state (scale, clean-step count, skipped steps) and the
// open logging window's skip count are saved in trainer_extra.json, so an fp16 run cancelled after
// a skipped (overflow) step and resumed ends bit-identical to an uninterrupted one. Checkpoints
// without the fields (older ones) still load, with a fresh scaler; invalid values are DATA_LOSS.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer_test_util.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

class Fp16Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("mp_resume");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 4000, 64, 3);
  }
  // As mp_loss_scaler_test's RunJobReportsSkippedSteps: one token per sequence over a 16384-token
  // vocabulary, so the scaled loss gradient overflows f16 at 2^16 and step 1 is skipped. 8 steps,
  // checkpoints every 2, logging windows of 3 (one is open at checkpoint-2, holding step 1's
  // skip).
  JobSpec Spec(const std::string& sub) const {
    JobSpec spec = testing::TinySpec(dir_ + "/" + sub, data_);
    spec.model.config.vocab_size = 16384;
    spec.model.config.n_embd = 16;
    spec.model.config.n_layer = 1;
    spec.data.seq_len = 1;
    spec.training.per_device_train_batch_size = 1;
    spec.training.fp16 = true;
    spec.training.max_steps = 8;
    spec.training.save_steps = 2;
    spec.training.logging_steps = 3;
    spec.training.learning_rate = 2e-2;
    return spec;
  }
  // Runs `spec` until the report of step 3 cancels it (checkpoint-2 is the newest).
  static void RunAndCancelAtStep3(const JobSpec& spec, std::vector<StepReport>* steps) {
    std::atomic<bool> cancel{false};
    RunOptions o = testing::TestRunOptions(2);
    o.cancel = &cancel;
    RunCallbacks cb;
    cb.on_step = [&](const StepReport& r) {
      steps->push_back(r);
      if (r.step == 3) cancel.store(true);
    };
    auto r = RunJob(spec, o, cb);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kCancelled);
    ASSERT_TRUE(fs::exists(spec.output_dir + "/checkpoint-2"));
    ASSERT_FALSE(fs::exists(spec.output_dir + "/checkpoint-4"));
  }
  static Result<RunSummary> Resume(const JobSpec& spec, std::vector<StepReport>* steps) {
    RunOptions o = testing::TestRunOptions(2);
    o.resume = true;
    RunCallbacks cb;
    cb.on_step = [steps](const StepReport& r) { steps->push_back(r); };
    return RunJob(spec, o, cb);
  }
  static nlohmann::json ReadJsonFile(const std::string& path) {
    return nlohmann::json::parse(testing::ReadFile(path));
  }
  static void WriteJsonFile(const std::string& path, const nlohmann::json& j) {
    std::ofstream(path) << j.dump(2) << "\n";
  }
  std::string dir_, data_;
};

TEST_F(Fp16Resume, CancelledAfterOverflowAndResumedIsBitIdentical) {
  const JobSpec a = Spec("a");
  std::vector<StepReport> steps_a;
  RunCallbacks cb_a;
  cb_a.on_step = [&](const StepReport& r) { steps_a.push_back(r); };
  auto ra = RunJob(a, testing::TestRunOptions(2), cb_a);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  ASSERT_EQ(steps_a.size(), 8u);
  ASSERT_TRUE(steps_a[0].skipped) << "step 1 must overflow, or the scaler state is not exercised";

  const JobSpec b = Spec("b");
  std::vector<StepReport> steps_b;
  RunAndCancelAtStep3(b, &steps_b);
  if (HasFatalFailure()) return;
  // checkpoint-2 carries the scaler after step 1's skip: 2^16 halved at least once.
  const nlohmann::json extra = ReadJsonFile(b.output_dir + "/checkpoint-2/trainer_extra.json");
  ASSERT_TRUE(extra.contains("loss_scaler")) << extra.dump();
  EXPECT_LE(extra["loss_scaler"]["scale"].get<double>(), 32768.0);
  EXPECT_GE(extra["loss_scaler"]["skipped_steps"].get<int64_t>(), 1);
  EXPECT_GE(extra["window_skipped"].get<int64_t>(), 1);  // the open window [1, 3] holds step 1

  // Another copy of the interrupted run, with checkpoint-2 stripped of its scaler state: its
  // optimizer has taken fewer steps than global_step with no skips on record, so the checkpoint
  // is inconsistent and must be refused as DATA_LOSS, not resumed with a wrong scaler.
  const JobSpec c = Spec("c");
  std::error_code ec;
  fs::create_directories(c.output_dir, ec);
  fs::copy(b.output_dir, c.output_dir, fs::copy_options::recursive, ec);
  ASSERT_FALSE(ec) << ec.message();
  nlohmann::json old_extra = extra;
  old_extra.erase("loss_scaler");
  old_extra.erase("window_skipped");
  WriteJsonFile(c.output_dir + "/checkpoint-2/trainer_extra.json", old_extra);

  auto rb = Resume(b, &steps_b);
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  ASSERT_EQ(steps_b.size(), 9u);  // 1..3, then 3..8 after resuming from step 2
  for (size_t s = 0; s < 8; ++s) {
    const StepReport& got = s < 2 ? steps_b[s] : steps_b[s + 1];
    EXPECT_EQ(got.loss, steps_a[s].loss) << "step " << s + 1;  // bit-identical
    EXPECT_EQ(got.skipped, steps_a[s].skipped) << "step " << s + 1;
  }
  for (const char* f : {"model.safetensors", "checkpoint-8/optimizer.safetensors",
                        "checkpoint-8/trainer_extra.json", "checkpoint-4/model.safetensors"}) {
    EXPECT_EQ(testing::ReadFile(a.output_dir + "/" + f), testing::ReadFile(b.output_dir + "/" + f))
        << f;
  }
  const nlohmann::json log_a = testing::LogWithoutSummary(a.output_dir + "/trainer_state.json");
  EXPECT_EQ(log_a, testing::LogWithoutSummary(b.output_dir + "/trainer_state.json"));
  EXPECT_EQ(rb->train_loss, ra->train_loss);
  EXPECT_EQ(rb->eval_loss, ra->eval_loss);
  int64_t logged_skips = 0;
  for (const auto& e : log_a) logged_skips += e.value("skipped", int64_t{0});
  EXPECT_GE(logged_skips, 1);

  std::vector<StepReport> steps_c;
  auto rc = Resume(c, &steps_c);
  ASSERT_FALSE(rc.ok());
  EXPECT_EQ(rc.status().code(), Status::Code::kDataLoss) << rc.status().ToString();
  EXPECT_NE(rc.status().message().find("step counters"), std::string::npos)
      << rc.status().ToString();
}

TEST_F(Fp16Resume, InvalidScalerStateIsDataLoss) {
  const JobSpec b = Spec("b");
  std::vector<StepReport> steps;
  RunAndCancelAtStep3(b, &steps);
  if (HasFatalFailure()) return;
  const std::string path = b.output_dir + "/checkpoint-2/trainer_extra.json";
  nlohmann::json extra = ReadJsonFile(path);
  for (double bad : {-1.0, 0.0, 1e300}) {
    extra["loss_scaler"]["scale"] = bad;
    WriteJsonFile(path, extra);
    auto r = Resume(b, &steps);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
    EXPECT_NE(r.status().message().find("loss_scaler"), std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace traind::engine
