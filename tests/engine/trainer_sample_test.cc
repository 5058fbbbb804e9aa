// training.sample_every: samples from the model in training appear every N steps, do not change
// the training (losses and weights bit-identical to a run without them), are planned (peak ==
// plan), resume to the same samples, and show text for text data.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "train/sampler.h"
#include "trainer_test_util.h"
#include "traind/engine/job_spec.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

class TrainerSample : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("sample");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 600, 64, 5);
  }
  JobSpec Spec(const std::string& sub, int64_t every) {
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.training.save_steps = 2;
    s.training.sample_every = every;
    return s;
  }
  std::string dir_, data_;
};

TEST_F(TrainerSample, SamplesEveryNStepsLeaveTrainingUnchangedAndArePlanned) {
  std::vector<double> losses_plain, losses_sampled;
  RunCallbacks plain;
  plain.on_step = [&](const StepReport& r) { losses_plain.push_back(r.loss); };
  auto a = RunJob(Spec("plain", 0), testing::TestRunOptions(2), plain);
  ASSERT_TRUE(a.ok()) << a.status().ToString();

  std::vector<SampleReport> samples;
  MemoryPlan plan;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { losses_sampled.push_back(r.loss); };
  cb.on_sample = [&](const SampleReport& r) { samples.push_back(r); };
  cb.on_plan = [&](const MemoryPlan& p) { plan = p; };
  auto b = RunJob(Spec("sampled", 2), testing::TestRunOptions(2), cb);
  ASSERT_TRUE(b.ok()) << b.status().ToString();

  EXPECT_EQ(losses_sampled, losses_plain);
  EXPECT_EQ(testing::ReadFile(dir_ + "/sampled/out/model.safetensors"),
            testing::ReadFile(dir_ + "/plain/out/model.safetensors"));
  ASSERT_EQ(samples.size(), 3u);
  std::vector<uint16_t> head(8);
  {
    std::ifstream in(data_, std::ios::binary);
    in.read(reinterpret_cast<char*>(head.data()), 16);
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleReport& s = samples[i];
    EXPECT_EQ(s.step, static_cast<int64_t>(2 * (i + 1)));
    // 32 positions: a prompt of 32/4 = 8 tokens (the data's first) and 24 new ones.
    ASSERT_EQ(s.prompt_ids.size(), 8u);
    for (size_t k = 0; k < 8; ++k) EXPECT_EQ(s.prompt_ids[k], head[k]) << k;
    EXPECT_EQ(s.ids.size(), 24u);
    for (int32_t id : s.ids) EXPECT_TRUE(id >= 0 && id < 64) << id;
    EXPECT_TRUE(s.text.empty());  // format: tokens has no tokenizer
  }
  EXPECT_NE(samples[0].ids, samples[2].ids);  // the model changed between them
  // The key/value cache is in the plan, and the plan is what was used.
  const JobSpec spec = Spec("x", 2);
  const MemoryBytes extra = SamplerPlanBytes(spec.model.config, spec.training, DType::kF32);
  EXPECT_GT(extra.activations, 0);
  EXPECT_EQ(b->peak_memory_bytes, plan.bytes.total());
  EXPECT_EQ(plan.bytes.total(), a->peak_memory_bytes + extra.total());
}

TEST_F(TrainerSample, AResumedRunLogsTheSameSamples) {
  std::vector<SampleReport> whole, resumed;
  RunCallbacks ca;
  ca.on_sample = [&](const SampleReport& r) { whole.push_back(r); };
  ASSERT_TRUE(RunJob(Spec("a", 2), testing::TestRunOptions(2), ca).ok());
  std::atomic<bool> cancel{false};
  RunOptions ob = testing::TestRunOptions(2);
  ob.cancel = &cancel;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) {
    if (r.step == 3) cancel.store(true);
  };
  cb.on_sample = [&](const SampleReport& r) { resumed.push_back(r); };
  EXPECT_EQ(RunJob(Spec("b", 2), ob, cb).status().code(), Status::Code::kCancelled);
  RunOptions oc = testing::TestRunOptions(2);
  oc.resume = true;
  ASSERT_TRUE(RunJob(Spec("b", 2), oc, cb).ok());
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(resumed.size(), 3u);  // step 2 before the cancel, steps 4 and 6 after the resume
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i].step, whole[i].step);
    EXPECT_EQ(resumed[i].ids, whole[i].ids) << "step " << whole[i].step;
  }
}

TEST_F(TrainerSample, TextDataGivesTextSamples) {
  const std::string text_file = dir_ + "/text.txt";
  std::string text;
  for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question. ";
  testing::WriteFile(text_file, text);
  JobSpec s = testing::TinySpec(dir_ + "/text", text_file);
  s.model.config.vocab_size = 256;
  s.data.format = "text";
  s.data.tokenizer = "byte";
  s.training.max_steps = 4;
  s.training.sample_every = 4;
  std::vector<SampleReport> samples;
  RunCallbacks cb;
  cb.on_sample = [&](const SampleReport& r) { samples.push_back(r); };
  auto r = RunJob(s, testing::TestRunOptions(2), cb);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].prompt, "to be or");  // the first 32/4 bytes
  EXPECT_FALSE(samples[0].text.empty());
}

TEST(SampleSpecTest, SampleEveryIsParsedCheckedAndRoundTripped) {
  const std::string base =
      "model: {arch: gpt2, config: {vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 1, "
      "n_head: 2}}\ndata: {train_file: /tmp/x.txt, seq_len: 16}\noutput_dir: /tmp/out\n";
  auto ok = ParseJobSpec(base + "training: {max_steps: 4, sample_every: 2}\n", "");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->training.sample_every, 2);
  auto again = ParseJobSpec(JobSpecToJson(*ok), "");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->training.sample_every, 2);
  auto neg = ParseJobSpec(base + "training: {max_steps: 4, sample_every: -1}\n", "");
  EXPECT_NE(neg.status().message().find("training.sample_every"), std::string::npos);
  auto lora = ParseJobSpec(
      base + "training: {max_steps: 4, sample_every: 2, peft: {type: lora, r: 2}}\n", "");
  EXPECT_EQ(lora.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(lora.status().message().find("training.sample_every"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine
