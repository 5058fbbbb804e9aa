// SGD: 10 steps on hand-made views (matrices that decay, vectors that do not; one large enough to
// be threaded) against torch.optim.SGD (reference/sgd_reference.py) for momentum / dampening /
// nesterov / weight-decay combinations, 1e-6 relative (max |diff| / max |torch| per view), and on
// the padded vocabulary tables of gpt2, llama and bert (torch on HF's tensors); state save/load;
// option validation.
#include <gtest/gtest.h>

#include "backend/arena.h"
#include "backend/step_scalars.h"
#include "optim/sgd.h"
#include "optim_test_util.h"

namespace traind::engine {
namespace {

struct Config {
  double momentum, dampening, weight_decay;
  bool nesterov;
};

// 10 steps of every config on `params` (views of a flat buffer of n) against sgd_reference.py, on
// HF's tensors (a padded view's real rows, `transposed` views transposed); padded elements of
// init and gradients are 0, as a model keeps them, and stay 0.
void ExpectTenStepsMatchTorch(const std::string& label, const std::vector<ParamInfo>& params,
                              int64_t n, const std::vector<bool>& transposed) {
  const std::vector<Config> configs = {{0.0, 0.0, 0.0, false}, {0.0, 0.0, 0.01, false},
                                       {0.9, 0.0, 0.0, false}, {0.9, 0.1, 0.0, false},
                                       {0.9, 0.0, 0.05, true}, {0.5, 0.5, 0.02, false},
                                       {0.99, 0.0, 0.0, true}};
  const int steps = 10;
  const std::vector<float> init = testing::ZeroPadding(testing::RandomVector(n, 1, 0.5f), params);
  std::vector<std::vector<float>> grads;
  std::vector<double> lrs;
  std::vector<float> scales;
  for (int s = 0; s < steps; ++s) {
    grads.push_back(testing::ZeroPadding(testing::RandomVector(n, 100 + s, 1.0f, 0.1f), params));
    lrs.push_back(0.05 * (1.0 + 0.1 * s));
    scales.push_back(s % 3 == 0 ? 1.0f : 0.75f);
  }
  nlohmann::json cj = nlohmann::json::array();
  for (const Config& c : configs) {
    cj.push_back({{"momentum", c.momentum},
                  {"dampening", c.dampening},
                  {"weight_decay", c.weight_decay},
                  {"nesterov", c.nesterov}});
  }
  const std::string dir = testing::MakeTempDir("sgd_parity_" + label);
  testing::WriteOptimCase(dir, params, n, init, grads, lrs, scales, cj, transposed);
  std::string out;
  ASSERT_EQ(testing::RunPython("sgd_reference.py", dir, &out), 0) << out;

  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  double worst_all = 0.0;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    DeviceArena arena(backend.get(), 0);
    SgdOptions o;
    o.momentum = configs[ci].momentum;
    o.dampening = configs[ci].dampening;
    o.weight_decay = configs[ci].weight_decay;
    o.nesterov = configs[ci].nesterov;
    auto opt = SgdOptimizer::Create(params, n, o, &arena);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    EXPECT_EQ(arena.used_by_category().optimizer, SgdOptimizer::PlanBytes(params, o));
    std::vector<float> p = init;
    for (int s = 0; s < steps; ++s) (*opt)->Step(p.data(), grads[s].data(), lrs[s], scales[s]);
    EXPECT_EQ((*opt)->step(), steps);
    const std::vector<float> ref = testing::ReadFloats(dir + "/out_" + std::to_string(ci) + ".bin");
    const double worst = testing::MaxRelError(p, ref, params);
    worst_all = std::max(worst_all, worst);
    EXPECT_LT(worst, 1e-6) << label << " config " << ci;
    EXPECT_EQ(testing::ZeroPadding(p, params), p) << label << " config " << ci << ": padding moved";
  }
  std::printf("[sgd] %s: worst relative error vs torch.optim.SGD over %zu configs: %.3g\n",
              label.c_str(), configs.size(), worst_all);
}

TEST(Sgd, TenStepsMatchTorch) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  int64_t n = 0;
  std::vector<ParamInfo> params =
      testing::MakeParams({{7, 13}, {13}, {3, 4, 5}, {128, 160}, {1}}, &n);
  ExpectTenStepsMatchTorch("views", params, n, {});
}

// A padded vocabulary (61 tokens laid out as 64 rows) of gpt2, llama and bert: the same, against
// torch.optim.SGD on HF's 61-row tensors.
TEST(Sgd, PaddedVocabularyMatchesTorchOnTheRealRows) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  for (const std::string arch : {"gpt2", "llama", "bert"}) {
    int64_t n = 0;
    std::vector<bool> transposed;
    const std::vector<ParamInfo> params = testing::PaddedVocabParams(arch, &n, &transposed);
    ExpectTenStepsMatchTorch(arch, params, n, transposed);
  }
}

// The StepRunner's device-scalar protocol gives Step's result (CPU backend: device memory is host
// memory), and an overflowed fp16 step changes nothing.
TEST(Sgd, IssueStepFromScalarsMatchesStep) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DeviceArena arena(backend.get(), 0);
  int64_t n = 0;
  std::vector<ParamInfo> params = testing::MakeParams({{40, 50}, {7}}, &n);
  SgdOptions o;
  o.momentum = 0.9;
  o.dampening = 0.2;
  o.weight_decay = 0.01;
  auto a = SgdOptimizer::Create(params, n, o, &arena);
  auto b = SgdOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(a.ok() && b.ok());
  testing::ExpectIssueStepMatchesStep(a->get(), b->get(), n);
  EXPECT_EQ((*b)->step(), 3);
}

TEST(Sgd, StateRoundTripAndValidation) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  int64_t n = 0;
  std::vector<ParamInfo> params = testing::MakeParams({{4, 5}, {6}}, &n);
  SgdOptions o;
  o.momentum = 0.9;
  auto opt = SgdOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = testing::RandomVector(n, 3, 1.0f), g = testing::RandomVector(n, 4, 1.0f);
  (*opt)->Step(p.data(), g.data(), 0.1, 1.0f);
  (*opt)->Step(p.data(), g.data(), 0.1, 1.0f);
  SafetensorsFile st = (*opt)->SaveState();
  EXPECT_EQ(st.metadata["format"], "traind-sgd-v1");
  EXPECT_EQ(st.tensors.size(), 2u);
  auto opt2 = SgdOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE((*opt2)->LoadState(st).ok());
  std::vector<float> p2 = p;
  (*opt)->Step(p.data(), g.data(), 0.1, 1.0f);
  (*opt2)->Step(p2.data(), g.data(), 0.1, 1.0f);
  EXPECT_EQ(p, p2);
  st.tensors.erase("p1.momentum_buffer");
  Status bad = (*opt2)->LoadState(st);
  EXPECT_EQ(bad.code(), Status::Code::kDataLoss);
  EXPECT_NE(bad.message().find("p1.momentum_buffer"), std::string::npos);

  SgdOptions nest;
  nest.nesterov = true;  // without momentum: torch refuses
  EXPECT_EQ(SgdOptimizer::Create(params, n, nest, &arena).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(SgdOptimizer::PlanBytes(params, SgdOptions{}), 0);
}

}  // namespace
}  // namespace traind::engine
