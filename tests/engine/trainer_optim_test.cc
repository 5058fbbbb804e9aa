// Every optimizer through the whole trainer (training.optim): the planned optimizer bytes equal
// what the arena allocates, checkpoints hold its state and a resumed run is bit-identical to an
// uninterrupted one, the host-driven path (SGD, Adafactor) and the device-scalar path (AdamW,
// 8-bit AdamW) both learn; and 8-bit AdamW tracks AdamW on the tiny gpt2 (200 steps of
// tinyshakespeare: final eval loss within 2%).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "models/model.h"
#include "optim/optimizer.h"
#include "train/planner.h"
#include "trainer_test_util.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

struct OptimCase {
  const char* optim;
  OptimArgs args;
};

std::vector<OptimCase> Cases() {
  OptimArgs sgd;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  OptimArgs relative;  // HF Adafactor's own defaults: relative step, parameter scaling
  relative.relative_step = true;
  relative.scale_parameter = true;
  relative.warmup_init = true;
  OptimArgs beta1;
  beta1.beta1 = 0.9;
  return {{"adamw", {}}, {"adamw_8bit", {}}, {"sgd", sgd}, {"adafactor", beta1},
          {"adafactor", relative}};
}

class TrainerOptim : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("optim");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 900, 64, 7);
  }
  JobSpec Spec(const std::string& sub) const {
    const OptimCase c = Cases()[GetParam()];
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.training.optim = c.optim;
    s.training.optim_args = c.args;
    s.training.max_steps = 6;
    s.training.save_steps = 3;
    s.training.logging_steps = 1;
    s.training.learning_rate = std::string(c.optim) == "sgd" ? 0.05 : 3e-3;
    s.training.weight_decay = 0.01;
    s.training.gradient_accumulation_steps = 2;
    return s;
  }
  std::string dir_, data_;
};

TEST_P(TrainerOptim, PlansItsStateLearnsAndResumesBitIdentical) {
  const JobSpec a = Spec("a");
  SCOPED_TRACE(a.training.optim);
  // Plan == allocation: the optimizer's planned bytes are what the arena saw under kOptimizer.
  const int64_t planned = JobBytes(a.model.config, JobModelOptions(a, 8, false), a.training).optimizer;
  std::vector<double> losses_a;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { losses_a.push_back(r.loss); };
  MemoryPlan seen;
  cb.on_plan = [&](const MemoryPlan& p) { seen = p; };
  auto ra = RunJob(a, testing::TestRunOptions(2), cb);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  ASSERT_EQ(losses_a.size(), 6u);
  EXPECT_EQ(seen.bytes.optimizer, planned);
  EXPECT_EQ(seen.optimizer, a.training.optim);
  auto estimate = EstimateJob(a, testing::TestRunOptions(2).device);
  ASSERT_TRUE(estimate.ok()) << estimate.status().ToString();
  EXPECT_EQ(estimate->optimizer, a.training.optim);
  EXPECT_EQ(estimate->bytes.optimizer, planned) << "estimate shows the optimizer's state bytes";
  EXPECT_EQ(ra->peak_memory_bytes, ra->plan.bytes.total()) << "plan == measured peak";
  EXPECT_LT(losses_a.back(), losses_a.front()) << "the loss must fall";
  const int64_t params = seen.bytes.gradients / 4;
  if (a.training.optim == "adamw") {
    EXPECT_EQ(planned, 8 * params);
  } else if (a.training.optim == "sgd") {
    EXPECT_LE(planned, 4 * params) << "momentum: one fp32 per parameter";
  }

  // The same run stopped after checkpoint-3 and resumed: identical losses and files.
  const JobSpec b = Spec("b");
  std::atomic<bool> cancel{false};
  RunOptions ob = testing::TestRunOptions(2);
  ob.cancel = &cancel;
  std::vector<double> losses_b;
  RunCallbacks cb_b;
  cb_b.on_step = [&](const StepReport& r) {
    losses_b.push_back(r.loss);
    if (r.step == 4) cancel.store(true);
  };
  ASSERT_EQ(RunJob(b, ob, cb_b).status().code(), Status::Code::kCancelled);
  ASSERT_TRUE(fs::exists(b.output_dir + "/checkpoint-3/optimizer.safetensors"));
  RunOptions oc = testing::TestRunOptions(2);
  oc.resume = true;
  losses_b.resize(3);
  auto rc = RunJob(b, oc, cb_b);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  ASSERT_EQ(losses_b.size(), 6u);
  for (size_t s = 0; s < 6; ++s) EXPECT_EQ(losses_b[s], losses_a[s]) << "step " << s + 1;
  for (const char* f : {"model.safetensors", "checkpoint-6/optimizer.safetensors"}) {
    EXPECT_EQ(testing::ReadFile(a.output_dir + "/" + f), testing::ReadFile(b.output_dir + "/" + f)) << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainerOptim, ::testing::Range(0, 5), [](const auto& info) {
  const OptimCase c = Cases()[info.param];
  std::string n = c.optim;
  if (c.args.relative_step) n += "_relative_step";
  if (c.args.beta1) n += "_beta1";
  if (c.args.nesterov) n += "_nesterov";
  return n;
});

// A checkpoint of one optimizer does not resume under another: one clear error.
TEST(TrainerOptimResume, OtherOptimizersStateIsDataLoss) {
  const std::string dir = testing::MakeTempDir("optim-switch");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 600, 64, 3);
  JobSpec s = testing::TinySpec(dir + "/out", dir + "/tokens.bin");
  s.training.max_steps = 2;
  s.training.save_steps = 1;
  ASSERT_TRUE(RunJob(s, testing::TestRunOptions(1), {}).ok());
  fs::remove_all(s.output_dir + "/checkpoint-2");
  s.training.optim = "sgd";
  s.training.optim_args.momentum = 0.9;
  RunOptions o = testing::TestRunOptions(1);
  o.resume = true;
  auto r = RunJob(s, o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
}

// The bar for 8-bit AdamW: over 200 steps of the tiny gpt2 on tinyshakespeare its final
// eval loss stays within 2% of fp32 AdamW's, and its state is at most 2.1 bytes per parameter
// (8 for AdamW).
TEST(TrainerOptimQuality, AdamW8bitTracksAdamWOnTinyShakespeare) {
  const std::string text = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  ASSERT_TRUE(fs::exists(text)) << text << " is absent (../shared/data beside the project)";
  const std::string dir = testing::MakeTempDir("optim-quality");
  double eval[2] = {0, 0};
  int64_t state[2] = {0, 0}, params = 0;
  const char* names[2] = {"adamw", "adamw_8bit"};
  for (int i = 0; i < 2; ++i) {
    JobSpec spec = testing::TinyShakespeareSpec(text, dir + "/" + names[i]);
    spec.training.optim = names[i];
    auto r = RunJob(spec, testing::TestRunOptions(2), {});
    ASSERT_TRUE(r.ok()) << names[i] << ": " << r.status().ToString();
    eval[i] = r->eval_loss;
    state[i] = r->plan.bytes.optimizer;
    params = r->plan.bytes.gradients / 4;
  }
  std::printf("tiny gpt2, 200 steps: eval loss adamw %.4f, adamw_8bit %.4f (%+.2f%%); state bytes "
              "per parameter %.3f vs %.3f\n",
              eval[0], eval[1], 100.0 * (eval[1] - eval[0]) / eval[0],
              static_cast<double>(state[0]) / params, static_cast<double>(state[1]) / params);
  EXPECT_LT(std::fabs(eval[1] - eval[0]) / eval[0], 0.02);
  EXPECT_LE(static_cast<double>(state[1]) / params, 2.1);
  EXPECT_EQ(state[0], 8 * params);
}

}  // namespace
}  // namespace traind::engine
