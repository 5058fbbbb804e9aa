// fp16 dynamic loss scaling: the LossScaler rule against torch GradScaler's (init 2^16, halve and
// skip on inf/NaN, x2 after 2000 clean steps), the backend's overflow check, a forced overflow in a
// real fp16 step (inf injected into a gradient) that skips, halves and recovers, and RunJob
// reporting skipped steps in StepReport and log_history.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "trainer_test_util.h"

namespace traind::engine::testing {
namespace {

TEST(LossScaler, TorchGradScalerRule) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_TRUE(s.Update(true));  // overflow: skip, halve
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
  for (int i = 0; i < 1999; ++i) ASSERT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 32768.0f);  // 1999 clean steps: not yet
  EXPECT_EQ(s.growth_tracker(), 1999);
  EXPECT_FALSE(s.Update(false));  // the 2000th
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  // An overflow restarts the clean-step count.
  for (int i = 0; i < 1500; ++i) s.Update(false);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 32768.0f);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.skipped_steps(), 2);
  // Consecutive overflows keep halving.
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1024.0f);
}

TEST(LossScaler, StopsGrowingBeforeFp32Overflow) {
  LossScalerOptions o;
  o.init_scale = 0x1p127;
  o.growth_interval = 1;
  LossScaler s(o);
  s.Update(false);
  EXPECT_EQ(s.scale(), 0x1p127f);  // 2^128 is not a finite float
}

TEST(LossScaler, BackendFindsInfAndNan) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const int64_t n = 100003;
  float* x = static_cast<float*>(be->Alloc(n * sizeof(float)));
  ASSERT_NE(x, nullptr);
  std::vector<float> h(static_cast<size_t>(n), 3.0e38f);  // huge but finite: squares overflow fp32
  be->CopyHostToDevice(x, h.data(), n * sizeof(float));
  EXPECT_FALSE(LossScaler::FoundInf(be.get(), x, n));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const float good = 1.0f;
    be->CopyHostToDevice(x + 77777, &bad, sizeof(float));
    EXPECT_TRUE(LossScaler::FoundInf(be.get(), x, n)) << bad;
    EXPECT_FALSE(LossScaler::FoundInf(be.get(), x, 77777)) << "the range ends before it";
    be->CopyHostToDevice(x + 77777, &good, sizeof(float));
  }
  be->Free(x);
}

// The trainer's fp16 step on a tiny model (f16 compute, scaled loss, unscale in AdamW), with inf
// planted in one gradient at step 2: that step is skipped (weights and optimizer untouched), the
// scale halves, later steps run, and the scale grows back after growth_interval clean steps.
TEST(LossScaler, ForcedOverflowSkipsHalvesAndRecovers) {
  const ModelConfig c = TinyGpt2();
  ModelOptions o = TinyOptions(2, 8);
  o.compute_type = DType::kF16;
  TestModel t = TestModel::Make(c, o);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(9);
  auto opt = AdamWOptimizer::Create(m.params(), m.num_params(), AdamWOptions{}, t.arena.get());
  ASSERT_TRUE(opt.ok());
  LossScalerOptions so;
  so.growth_interval = 3;
  LossScaler scaler(so);
  const int64_t P = m.num_params();
  std::vector<float> before;
  std::vector<float> scales;
  for (int step = 1; step <= 8; ++step) {
    SetBatch(t, MakeBatch(16, c.vocab_size, static_cast<uint32_t>(step)));
    const float scale = scaler.scale();
    m.ZeroGrad();
    const double loss = m.Forward(true, scale);
    ASSERT_TRUE(std::isfinite(loss));
    m.Backward();
    if (step == 2) {
      const float inf = std::numeric_limits<float>::infinity();
      t.backend->CopyHostToDevice(m.grad_data() + P / 2, &inf, sizeof(float));
    }
    before = ToHost(*t.backend, m.param_data(), P);
    const bool skip = scaler.Update(LossScaler::FoundInf(t.backend.get(), m.grad_data(), P));
    EXPECT_EQ(skip, step == 2) << "step " << step;
    if (!skip) {
      const double norm = GlobalGradNorm(t.backend.get(), m.grad_data(), m.params()) / scale;
      ASSERT_TRUE(std::isfinite(norm));
      (*opt)->Step(m.param_data(), m.grad_data(), 1e-3, ClipCoefficient(norm, 1.0) / scale);
      m.ParamsChanged();
    }
    const std::vector<float> after = ToHost(*t.backend, m.param_data(), P);
    if (skip) {
      EXPECT_EQ(after, before) << "a skipped step must not touch the weights";
    } else {
      EXPECT_NE(after, before);
      for (float p : after) ASSERT_TRUE(std::isfinite(p));
    }
    scales.push_back(scaler.scale());
  }
  EXPECT_EQ((*opt)->step(), 7);  // 8 steps, one skipped
  const std::vector<float> want = {65536, 32768, 32768, 32768, 65536, 65536, 65536, 131072};
  EXPECT_EQ(scales, want);
}

// RunJob in fp16 on a model whose initial loss gradient overflows f16 at scale 2^16: one sequence
// of one token (n_valid = 1) and a 16384-token vocabulary (p ~ 6e-5), so dlogits at the target is
// ~ -65532, past f16's largest finite 65504. Step 1 must be skipped; later steps may overflow too
// (the layernorm backward amplifies the scaled gradient), and every skip must show in the
// StepReports, in log_history's "skipped" counts and in its "loss_scale".
TEST(LossScaler, RunJobReportsSkippedSteps) {
  const std::string dir = MakeTempDir("mp_skip");
  const std::string data = dir + "/tokens.bin";
  WriteSyntheticTokens(data, 4000, 64, 3);
  JobSpec spec = TinySpec(dir, data);
  spec.model.config.vocab_size = 16384;
  spec.model.config.n_embd = 16;
  spec.model.config.n_layer = 1;
  spec.data.seq_len = 1;
  spec.training.per_device_train_batch_size = 1;
  spec.training.fp16 = true;
  spec.training.max_steps = 12;
  spec.training.logging_steps = 4;
  spec.training.learning_rate = 2e-2;
  std::vector<StepReport> steps;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { steps.push_back(r); };
  auto run = RunJob(spec, TestRunOptions(), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(steps.size(), 12u);
  EXPECT_TRUE(steps[0].skipped);
  int64_t n_skipped = 0;
  for (const StepReport& r : steps) {
    n_skipped += r.skipped ? 1 : 0;
    EXPECT_EQ(std::isfinite(r.grad_norm), !r.skipped) << "step " << r.step;
    EXPECT_TRUE(std::isfinite(r.loss));
  }
  EXPECT_LE(n_skipped, 4) << "the scaler must settle on a scale that works";
  EXPECT_EQ(run->plan.precision, "fp16");
  const nlohmann::json st =
      nlohmann::json::parse(ReadFile(spec.output_dir + "/trainer_state.json"));
  int64_t window = 0, cumulative = 0;
  for (const auto& e : st["log_history"]) {
    if (!e.contains("loss")) continue;
    ASSERT_TRUE(e.contains("skipped")) << e.dump();
    int64_t want = 0;
    for (int64_t s = window * 4; s < window * 4 + 4; ++s) want += steps[s].skipped ? 1 : 0;
    cumulative += want;
    EXPECT_EQ(e["skipped"].get<int64_t>(), want) << e.dump();
    // No growth within 12 steps: the scale is 2^16 halved once per skip so far.
    EXPECT_EQ(e["loss_scale"].get<double>(), std::ldexp(65536.0, -static_cast<int>(cumulative)));
    EXPECT_TRUE(e["grad_norm"].is_number()) << e.dump();
    ++window;
  }
  EXPECT_EQ(window, 3);
  EXPECT_EQ(cumulative, n_skipped);
  // Trained despite the skipped steps: the validation loss is below the uniform ln(16384) = 9.70.
  std::printf("[mp] fp16 skipped %lld of 12 steps, eval_loss %.4f\n",
              static_cast<long long>(n_skipped), run->eval_loss);
  EXPECT_LT(run->eval_loss, std::log(16384.0) - 0.1);
}

}  // namespace
}  // namespace traind::engine::testing
