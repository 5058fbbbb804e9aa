// Checkpoints and resume: a run cancelled after step k and resumed ends bit-identical (weights,
// optimizer state, losses) to an uninterrupted run; save -> load -> save is byte-identical;
// cancellation returns CANCELLED within a step; incomplete checkpoint folders are never picked.
// Runs use 2 CPU threads so the kernels' parallel reductions are part of what must reproduce.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "data/window_order.h"
#include "model_test_util.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

class TrainerResume : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("resume");
    data_ = dir_ + "/tokens.bin";
    // 540 training tokens: 33 windows per epoch, so 6 steps of 8 windows cross into epoch 1
    // (a new shuffled order) after the checkpoint at step 2.
    testing::WriteSyntheticTokens(data_, kTokens, 64, 5);
  }
  // 6 steps; checkpoints every 2; logging windows of 3 (so one is open at checkpoint-2 and -4);
  // eval every 4.
  JobSpec Spec(const std::string& sub) {
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.training.save_steps = 2;
    s.training.logging_steps = 3;
    s.training.eval_steps = 4;
    s.training.gradient_accumulation_steps = 2;
    return s;
  }
  static constexpr int64_t kTokens = 600;
  std::string dir_, data_;
};

TEST_F(TrainerResume, CancelledAndResumedRunIsBitIdentical) {
  const JobSpec a = Spec("a"), b = Spec("b");
  const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(a, b, [&] {
    EXPECT_TRUE(fs::exists(b.output_dir + "/checkpoint-2"));
    EXPECT_FALSE(fs::exists(b.output_dir + "/checkpoint-4"));
    EXPECT_FALSE(fs::exists(b.output_dir + "/model.safetensors"));
  });
  ASSERT_TRUE(r.a && r.a->ok()) << (r.a ? r.a->status().ToString() : "not run");
  // Cancelled from inside step 3's report: CANCELLED before step 4 runs.
  ASSERT_TRUE(r.b_cancelled);
  ASSERT_FALSE(r.b_cancelled->ok());
  EXPECT_EQ(r.b_cancelled->status().code(), Status::Code::kCancelled);
  EXPECT_EQ(r.steps_before_resume, 3u);
  // Resume: continues from checkpoint-2 (steps 3..6).
  ASSERT_TRUE(r.b_resumed && r.b_resumed->ok())
      << (r.b_resumed ? r.b_resumed->status().ToString() : "not run");
  testing::ExpectResumedLossesIdentical(r);
  ASSERT_FALSE(r.resume_notes.empty());
  EXPECT_NE(r.resume_notes[0].find("checkpoint-2"), std::string::npos);
  const RunSummary& ra = **r.a;
  const RunSummary& rc = **r.b_resumed;
  EXPECT_EQ(rc.train_loss, ra.train_loss);
  EXPECT_EQ(rc.eval_loss, ra.eval_loss);

  for (const char* f : {"model.safetensors", "config.json", "checkpoint-6/model.safetensors",
                        "checkpoint-6/optimizer.safetensors", "checkpoint-6/trainer_state.json",
                        "checkpoint-6/trainer_extra.json", "checkpoint-4/optimizer.safetensors"}) {
    EXPECT_EQ(testing::ReadFile(a.output_dir + "/" + f), testing::ReadFile(b.output_dir + "/" + f))
        << f;
  }
  EXPECT_EQ(testing::LogWithoutSummary(a.output_dir + "/trainer_state.json"),
            testing::LogWithoutSummary(b.output_dir + "/trainer_state.json"));
}

// qwen3 (per-head q/k norms) and gemma (1 + w norms, GeGLU, scaled embeddings) resume as the
// others do: cancelled after step 3 and resumed from checkpoint-2, every loss and every output
// file equals the uninterrupted run's.
TEST_F(TrainerResume, Qwen3AndGemmaResumeBitIdentically) {
  for (const std::string family : {"qwen3", "gemma"}) {
    SCOPED_TRACE(family);
    JobSpec a = Spec("a-" + family), b = Spec("b-" + family);
    a.model.config = b.model.config = testing::TinyFamily(family);
    const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(a, b);
    ASSERT_TRUE(r.a && r.a->ok()) << (r.a ? r.a->status().ToString() : "not run");
    ASSERT_TRUE(r.b_resumed && r.b_resumed->ok())
        << (r.b_resumed ? r.b_resumed->status().ToString() : "not run");
    EXPECT_EQ(r.steps_before_resume, 3u);
    testing::ExpectResumedLossesIdentical(r);
    for (const char* f : {"model.safetensors", "config.json", "checkpoint-6/optimizer.safetensors"}) {
      EXPECT_EQ(testing::ReadFile(a.output_dir + "/" + f), testing::ReadFile(b.output_dir + "/" + f))
          << f;
    }
  }
}

TEST_F(TrainerResume, SaveLoadSaveIsByteIdentical) {
  const JobSpec a = Spec("a");
  auto ra = RunJob(a, testing::TestRunOptions(2), {});
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();

  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  ModelOptions mo;
  mo.micro_batch = 4;
  mo.seq_len = 16;
  auto model = Model::Create(a.model.config, mo, &arena);
  ASSERT_TRUE(model.ok());
  AdamWOptions ao;
  ao.weight_decay = 0.1;
  auto opt = AdamWOptimizer::Create((*model)->params(), (*model)->num_params(), ao, &arena);
  ASSERT_TRUE(opt.ok());
  TrainerState state;
  const std::string src = a.output_dir + "/checkpoint-4";
  ASSERT_TRUE(LoadCheckpoint(src, model->get(), opt->get(), &state).ok());
  EXPECT_EQ(state.global_step, 4);
  EXPECT_EQ(state.window_steps, 1);  // step 4 opened the window 4..6
  EXPECT_EQ(state.loader.epoch, 0);
  EXPECT_EQ(state.loader.next_window, 32);  // 4 steps x 2 micro-batches x 4 windows

  const std::string out = dir_ + "/resaved";
  fs::create_directories(out);
  const int64_t wpe = (TrainTokenCount(kTokens, a.data.validation_split) - 1) / a.data.seq_len;
  auto saved = SaveCheckpoint(out, a, model->get(), **opt, state, wpe);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  for (const char* f : {kConfigFile, kModelFile, kTrainerStateFile, kOptimizerFile, kTrainerExtraFile}) {
    const std::string x = testing::ReadFile(src + "/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x, testing::ReadFile(*saved + "/" + f)) << f;
  }
}

TEST_F(TrainerResume, IgnoresIncompleteCheckpointsAndChecksTheBatch) {
  const JobSpec a = Spec("a");
  ASSERT_TRUE(RunJob(a, testing::TestRunOptions(2), {}).ok());
  // A crash mid-write leaves a .tmp folder or (by hand) a folder missing files: never picked.
  fs::create_directories(a.output_dir + "/checkpoint-9.tmp");
  testing::WriteFile(a.output_dir + "/checkpoint-9.tmp/config.json", "{}");
  fs::create_directories(a.output_dir + "/checkpoint-8");
  fs::copy_file(a.output_dir + "/checkpoint-6/config.json", a.output_dir + "/checkpoint-8/config.json");
  EXPECT_EQ(FindLatestCheckpoint(a.output_dir), 6);
  EXPECT_EQ(FindLatestCheckpoint(dir_ + "/nonexistent"), -1);

  // Resuming with another micro-batch would change the batches: refused.
  JobSpec other = a;
  other.training.per_device_train_batch_size = 2;
  RunOptions o = testing::TestRunOptions(2);
  o.resume = true;
  auto r = RunJob(other, o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("micro-batch"), std::string::npos) << r.status().message();

  // A fresh run (resume false) that may overwrite the output_dir clears the earlier run's
  // checkpoints (without overwrite_output_dir it is refused: trainer_output_dir_test).
  JobSpec shorter = a;
  shorter.training.max_steps = 1;
  shorter.training.overwrite_output_dir = true;
  ASSERT_TRUE(RunJob(shorter, testing::TestRunOptions(2), {}).ok());
  EXPECT_EQ(FindLatestCheckpoint(a.output_dir), 1);
  EXPECT_FALSE(fs::exists(a.output_dir + "/checkpoint-9.tmp"));
}

TEST_F(TrainerResume, CancelBeforeTheFirstStep) {
  std::atomic<bool> cancel{true};
  RunOptions o = testing::TestRunOptions(2);
  o.cancel = &cancel;
  int steps = 0;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport&) { ++steps; };
  auto r = RunJob(Spec("c"), o, cb);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kCancelled);
  EXPECT_EQ(steps, 0);
}

}  // namespace
}  // namespace traind::engine
