// AdamW: (1) the optimizer on hand-made parameter views against torch's update rule written out in
// double (decay only on flagged views, grad_scale as the clip factor), state save/load; (2) three
// trainer steps on a tiny gpt2 (a padded vocabulary of 61) with weight decay, warmup+cosine and
// clipping against torch.optim.AdamW + clip_grad_norm_ + LambdaLR (reference/train_reference.py),
// 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/arena.h"
#include "data/window_order.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "core/safetensors.h"
#include "optim_test_util.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

TEST(AdamW, MatchesTorchRuleWithDecayMask) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  std::vector<ParamInfo> params(2);
  params[0] = {"w", {3, 4}, {3, 4}, 0, 12, true};
  params[1] = {"b", {5}, {5}, 12, 5, false};
  const int64_t n = 17;
  AdamWOptions o;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.3;
  auto opt = AdamWOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  EXPECT_EQ(arena.used_by_category().optimizer, AdamWOptimizer::PlanBytes(n));

  std::vector<float> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = 0.1f * static_cast<float>(i) - 0.7f;
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  float* dp = static_cast<float*>(arena.Allocate(MemoryCategory::kWeights, n * 4, "p").value());
  float* dg = static_cast<float*>(arena.Allocate(MemoryCategory::kGradients, n * 4, "g").value());
  backend->CopyHostToDevice(dp, p.data(), n * 4);
  const double lrs[3] = {0.01, 0.02, 0.005};
  const float scales[3] = {1.0f, 0.5f, 0.25f};
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i * step)) + 0.05f;
    backend->CopyHostToDevice(dg, g.data(), n * 4);
    (*opt)->Step(dp, dg, lrs[step - 1], scales[step - 1]);
    const double lr = lrs[step - 1];
    for (int64_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * scales[step - 1];
      const double wd = i < 12 ? o.weight_decay : 0.0;
      rp[i] *= 1.0 - lr * wd;
      rm[i] = o.beta1 * rm[i] + (1 - o.beta1) * gi;
      rv[i] = o.beta2 * rv[i] + (1 - o.beta2) * gi * gi;
      const double bc1 = 1 - std::pow(o.beta1, step), bc2 = 1 - std::pow(o.beta2, step);
      rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + o.eps);
    }
  }
  EXPECT_EQ((*opt)->step(), 3);
  backend->CopyDeviceToHost(p.data(), dp, n * 4);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], rp[i], 1e-6 * (1 + std::abs(rp[i]))) << i;

  // State round trip: a second optimizer loaded from the first saves the same tensors.
  SafetensorsFile state = (*opt)->SaveState();
  EXPECT_EQ(state.tensors.size(), 4u);
  EXPECT_EQ(state.metadata["step"], "3");
  auto opt2 = AdamWOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt2.ok());
  ASSERT_TRUE((*opt2)->LoadState(state).ok());
  SafetensorsFile again = (*opt2)->SaveState();
  for (const auto& [name, t] : state.tensors) EXPECT_EQ(t.data, again.tensors[name].data) << name;
  // A state of another shape is refused, naming the tensor.
  state.tensors["b.exp_avg"].shape = {4};
  Status bad = (*opt2)->LoadState(state);
  EXPECT_EQ(bad.code(), Status::Code::kDataLoss);
  EXPECT_NE(bad.message().find("b.exp_avg"), std::string::npos);
}

TEST(AdamW, GlobalGradNormSumsEveryView) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  std::vector<ParamInfo> params(2);
  params[0] = {"a", {2, 2}, {2, 2}, 0, 4, true};
  params[1] = {"b", {2}, {2}, 6, 2, false};  // a gap of 2 elements that must not count
  std::vector<float> g = {1, 2, 3, 4, 100, 100, 5, 6};
  float* dg = static_cast<float*>(backend->Alloc(g.size() * 4));
  backend->CopyHostToDevice(dg, g.data(), g.size() * 4);
  EXPECT_NEAR(GlobalGradNorm(backend.get(), dg, params), std::sqrt(1 + 4 + 9 + 16 + 25 + 36.0), 1e-9);
  backend->Free(dg);
}

// Three optimizer steps of the trainer vs torch.optim.AdamW + clip_grad_norm_ + HF cosine warmup
// (a padded vocabulary of 61: the global gradient norm and weight decay see HF's 61 rows).
TEST(AdamW, ThreeTrainerStepsMatchTorch) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  testing::ExpectTrainerStepsMatchTorch("adamw", OptimArgs(), 3);
}

}  // namespace
}  // namespace traind::engine
