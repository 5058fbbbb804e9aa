// output_dir safety (JOBSPEC.md): a fresh run refuses an output_dir holding another run's files
// and leaves them untouched, unless training.overwrite_output_dir; training.resume_from_checkpoint
// (true: output_dir's newest checkpoint; a path: that checkpoint) continues a run bit-identical to
// an uninterrupted one. Parsing, canonical JSON and the input checks of both fields.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "trainer_test_util.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

class OutputDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("outdir");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 600, 64, 5);
  }
  JobSpec Spec(const std::string& sub) {
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.training.save_steps = 2;
    return s;
  }
  // Runs `spec` fresh (or as a restart with `resume`), cancelled after step `cancel_after` (0: no).
  Result<RunSummary> Run(const JobSpec& spec, int64_t cancel_after = 0, bool resume = false) {
    std::atomic<bool> cancel{false};
    RunOptions o = testing::TestRunOptions(1);
    o.cancel = &cancel;
    o.resume = resume;
    RunCallbacks cb;
    cb.on_step = [&](const StepReport& r) {
      if (cancel_after > 0 && r.step == cancel_after) cancel.store(true);
    };
    return RunJob(spec, o, cb);
  }
  std::string dir_, data_;
};

TEST_F(OutputDirTest, FreshRunRefusesAnotherRunsResultsAndTouchesNothing) {
  const JobSpec spec = Spec("a");
  ASSERT_TRUE(Run(spec).ok());
  const std::string weights = testing::ReadFile(spec.output_dir + "/model.safetensors");
  const std::string state = testing::ReadFile(spec.output_dir + "/trainer_state.json");
  ASSERT_FALSE(weights.empty());

  const Status free = CheckOutputDirFree(spec);
  ASSERT_EQ(free.code(), Status::Code::kFailedPrecondition) << free.ToString();
  EXPECT_NE(free.message().find("output_dir: " + spec.output_dir + " holds another run's files (checkpoint-2, "
                                "checkpoint-4, checkpoint-6 and 2 more)"),
            std::string::npos)
      << free.message();
  EXPECT_NE(free.message().find("training.overwrite_output_dir: true"), std::string::npos);
  EXPECT_NE(free.message().find("training.resume_from_checkpoint: true"), std::string::npos);

  // RunJob refuses the same way (what `traind run` and a job runner do), before touching anything.
  auto again = Run(spec);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(testing::ReadFile(spec.output_dir + "/model.safetensors"), weights);
  EXPECT_EQ(testing::ReadFile(spec.output_dir + "/trainer_state.json"), state);
  for (int step : {2, 4, 6}) EXPECT_TRUE(fs::exists(spec.output_dir + "/checkpoint-" + std::to_string(step)));

  // A restart of the same job (RunOptions::resume) is not a fresh run: it continues.
  EXPECT_TRUE(Run(spec, 0, /*resume=*/true).ok());
}

TEST_F(OutputDirTest, OtherFilesDoNotCountAndOverwriteReplacesTheOldRun) {
  JobSpec spec = Spec("b");
  fs::create_directories(spec.output_dir);
  testing::WriteFile(spec.output_dir + "/README.md", "notes\n");
  EXPECT_TRUE(CheckOutputDirFree(spec).ok()) << "only another run's results count";
  ASSERT_TRUE(Run(spec).ok());

  spec.training.overwrite_output_dir = true;
  spec.training.save_steps = 3;
  EXPECT_TRUE(CheckOutputDirFree(spec).ok());
  ASSERT_TRUE(Run(spec).ok());
  // The new run's checkpoints only: the old run's checkpoint-2 and -4 are gone, not mixed in.
  EXPECT_FALSE(fs::exists(spec.output_dir + "/checkpoint-2"));
  EXPECT_FALSE(fs::exists(spec.output_dir + "/checkpoint-4"));
  EXPECT_TRUE(fs::exists(spec.output_dir + "/checkpoint-3"));
  EXPECT_TRUE(fs::exists(spec.output_dir + "/README.md"));
}

TEST_F(OutputDirTest, ResumeFromCheckpointTrueContinuesBitIdentical) {
  const JobSpec ref = Spec("ref");
  ASSERT_TRUE(Run(ref).ok());
  JobSpec spec = Spec("c");
  auto cancelled = Run(spec, /*cancel_after=*/3);
  ASSERT_EQ(cancelled.status().code(), Status::Code::kCancelled);
  ASSERT_TRUE(fs::exists(spec.output_dir + "/checkpoint-2"));
  ASSERT_FALSE(Run(spec).ok()) << "a fresh run refuses the cancelled run's checkpoint";

  spec.training.resume_from_last_checkpoint = true;
  ASSERT_TRUE(ValidateJobInputs(spec).ok());
  auto resumed = Run(spec);  // a fresh job (not a restart) that asks to continue
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->global_step, 6);
  EXPECT_EQ(testing::ReadFile(spec.output_dir + "/model.safetensors"),
            testing::ReadFile(ref.output_dir + "/model.safetensors"));
}

TEST_F(OutputDirTest, ResumeFromACheckpointPathWritesToItsOwnOutputDir) {
  const JobSpec ref = Spec("ref");
  ASSERT_TRUE(Run(ref).ok());
  JobSpec spec = Spec("d");
  spec.training.resume_from_checkpoint = ref.output_dir + "/checkpoint-4";
  ASSERT_TRUE(ValidateJobInputs(spec).ok());
  auto resumed = Run(spec);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->global_step, 6);
  EXPECT_EQ(testing::ReadFile(spec.output_dir + "/model.safetensors"),
            testing::ReadFile(ref.output_dir + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(spec.output_dir + "/checkpoint-6"));
  EXPECT_FALSE(fs::exists(spec.output_dir + "/checkpoint-4")) << "steps before the checkpoint are not redone";
}

TEST_F(OutputDirTest, ResumeInputsAreChecked) {
  JobSpec spec = Spec("e");
  spec.training.resume_from_last_checkpoint = true;
  Status s = ValidateJobInputs(spec);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("training.resume_from_checkpoint: true, but output_dir"), std::string::npos) << s.message();
  spec.training.resume_from_last_checkpoint = false;
  spec.training.resume_from_checkpoint = dir_ + "/nowhere/checkpoint-9";
  s = ValidateJobInputs(spec);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("training.resume_from_checkpoint: " + dir_ + "/nowhere/checkpoint-9"), std::string::npos);
  fs::create_directories(dir_ + "/not-a-checkpoint");
  spec.training.resume_from_checkpoint = dir_ + "/not-a-checkpoint";
  s = ValidateJobInputs(spec);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("is not a checkpoint"), std::string::npos) << s.message();
}

TEST(OutputDirSpec, ParsesBothFieldsAndRoundTrips) {
  const std::string base = R"(
model: {arch: gpt2, config: {vocab_size: 64, n_positions: 32, n_embd: 32, n_layer: 1, n_head: 2}}
data: {train_file: data.bin, format: tokens, token_dtype: uint16, seq_len: 16}
output_dir: out
training:
  max_steps: 4
)";
  auto plain = ParseJobSpec(base, "/base");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->training.overwrite_output_dir);
  EXPECT_FALSE(plain->training.resume_from_last_checkpoint);
  EXPECT_FALSE(plain->training.resume_from_checkpoint.has_value());

  auto last = ParseJobSpec(base + "  overwrite_output_dir: true\n  resume_from_checkpoint: true\n", "/base");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_TRUE(last->training.overwrite_output_dir);
  EXPECT_TRUE(last->training.resume_from_last_checkpoint);
  auto again = ParseJobSpec(JobSpecToJson(*last), "");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->training.resume_from_last_checkpoint);
  EXPECT_TRUE(again->training.overwrite_output_dir);

  auto path = ParseJobSpec(base + "  resume_from_checkpoint: runs/x/checkpoint-40\n", "/base");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  ASSERT_TRUE(path->training.resume_from_checkpoint.has_value());
  EXPECT_EQ(*path->training.resume_from_checkpoint, "/base/runs/x/checkpoint-40");
  auto path_again = ParseJobSpec(JobSpecToJson(*path), "");
  ASSERT_TRUE(path_again.ok());
  EXPECT_EQ(path_again->training.resume_from_checkpoint, path->training.resume_from_checkpoint);

  auto off = ParseJobSpec(base + "  resume_from_checkpoint: false\n  overwrite_output_dir: false\n", "/base");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->training.resume_from_last_checkpoint);
  EXPECT_FALSE(off->training.resume_from_checkpoint.has_value());

  auto bad = ParseJobSpec(base + "  resume_from_checkpoint: [a, b]\n", "/base");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("training.resume_from_checkpoint"), std::string::npos) << bad.status().message();
  auto bad_bool = ParseJobSpec(base + "  overwrite_output_dir: maybe\n", "/base");
  ASSERT_FALSE(bad_bool.ok());
  EXPECT_NE(bad_bool.status().message().find("training.overwrite_output_dir"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine
