// Adafactor: 10 steps on factored (2-D, 3-D, one large enough to be threaded) and unfactored
// (vector) views against reference/adafactor_reference.py (HF transformers' Adafactor written out
// in torch fp32), 1e-5 relative (max |diff| / max |ref| per view), for relative_step on/off,
// scale_parameter on/off, warmup_init, beta1 set and weight decay; state save/load; HF's option
// checks; PlanBytes = arena bytes. A padded vocabulary (gpt2, llama, bert with 61 tokens laid out
// as 64 rows) against the reference on HF's 61-row tensors.
#include <gtest/gtest.h>

#include "backend/arena.h"
#include "optim/adafactor.h"
#include "optim_test_util.h"

namespace traind::engine {
namespace {

struct Config {
  bool relative_step, scale_parameter, warmup_init;
  std::optional<double> beta1;
  double weight_decay, clip_threshold;
};

AdafactorOptions ToOptions(const Config& c) {
  AdafactorOptions o;
  o.relative_step = c.relative_step;
  o.scale_parameter = c.scale_parameter;
  o.warmup_init = c.warmup_init;
  o.beta1 = c.beta1;
  o.weight_decay = c.weight_decay;
  o.clip_threshold = c.clip_threshold;
  if (!c.relative_step) o.lr = 1e-2;
  return o;
}

TEST(Adafactor, TenStepsMatchHfAlgorithm) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  const std::vector<Config> configs = {
      {true, true, false, std::nullopt, 0.0, 1.0},    // HF defaults
      {true, false, false, std::nullopt, 0.0, 1.0},   // no parameter scale
      {true, true, true, std::nullopt, 0.0, 1.0},     // warmup_init
      {false, false, false, std::nullopt, 0.0, 1.0},  // external lr (T5 fine-tuning settings)
      {false, true, false, 0.9, 0.01, 1.0},           // external lr x scale, beta1, decay
      {true, true, false, 0.8, 0.1, 0.5},             // beta1, decay, tighter clipping
  };
  int64_t n = 0;
  std::vector<ParamInfo> params =
      testing::MakeParams({{7, 13}, {13}, {2, 5, 6}, {96, 200}, {1}, {1, 9}}, &n);
  const int steps = 10;
  std::vector<float> init = testing::RandomVector(n, 7, 0.3f);
  std::vector<std::vector<float>> grads;
  std::vector<double> lrs;
  std::vector<float> scales;
  for (int s = 0; s < steps; ++s) {
    grads.push_back(testing::RandomVector(n, 200 + s, 0.5f, 0.02f));
    lrs.push_back(1e-2 * (1.0 - 0.05 * s));
    scales.push_back(s % 2 == 0 ? 1.0f : 0.5f);
  }
  nlohmann::json cj = nlohmann::json::array();
  for (const Config& c : configs) {
    cj.push_back({{"relative_step", c.relative_step},
                  {"scale_parameter", c.scale_parameter},
                  {"warmup_init", c.warmup_init},
                  {"beta1", c.beta1.has_value() ? nlohmann::json(*c.beta1) : nlohmann::json()},
                  {"weight_decay", c.weight_decay},
                  {"clip_threshold", c.clip_threshold},
                  {"eps1", 1e-30},
                  {"eps2", 1e-3},
                  {"decay_rate", -0.8}});
  }
  const std::string dir = testing::MakeTempDir("adafactor_parity");
  testing::WriteOptimCase(dir, params, n, init, grads, lrs, scales, cj);
  std::string out;
  ASSERT_EQ(testing::RunPython("adafactor_reference.py", dir, &out), 0) << out;

  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  double worst_all = 0.0;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    DeviceArena arena(backend.get(), 0);
    const AdafactorOptions o = ToOptions(configs[ci]);
    auto opt = AdafactorOptimizer::Create(params, n, o, &arena);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    EXPECT_EQ(arena.used_by_category().optimizer, AdafactorOptimizer::PlanBytes(params, o));
    std::vector<float> p = init;
    for (int s = 0; s < steps; ++s) (*opt)->Step(p.data(), grads[s].data(), lrs[s], scales[s]);
    const std::vector<float> ref = testing::ReadFloats(dir + "/out_" + std::to_string(ci) + ".bin");
    const double worst = testing::MaxRelError(p, ref, params);
    worst_all = std::max(worst_all, worst);
    EXPECT_LT(worst, 1e-5) << "config " << ci;
    // The steps moved the parameters by far more than the error (warmup_init moves least:
    // relative steps of 1e-6 t), so the comparison says something about the update.
    const double moved = testing::MaxRelError(init, ref, params);
    EXPECT_GT(moved, 100 * worst) << "config " << ci;
    std::printf("[adafactor] config %zu: moved %.3g, error %.3g\n", ci, moved, worst);
  }
  std::printf("[adafactor] worst relative error vs the HF algorithm over %zu configs: %.3g\n",
              configs.size(), worst_all);
}

// Issue 41 item 8: the padded vocabulary. gpt2 (tied wte), llama (wte and an untied lm_head) and
// bert (wte and the MLM decoder's (Vp) bias) with a vocabulary of 61, laid out with 64 rows: every
// statistic (RMS(p), RMS(update) for clipping, the row/column means, a vector's moment) is HF's,
// over the 61 real rows, so 10 steps match the reference run on HF's own tensors (61 rows, gpt2's
// Conv1D weights transposed, float64) within 1e-5 for relative_step x scale_parameter on and off
// (clip_threshold 1 and 0.5, beta1 and decay); the padded rows of the weights and of the state
// stay exactly 0. Before the fix (statistics over 64 rows) 5 of the 6 configs were off by
// 3.4e-4 to 1.6e-3 on every family, and the row statistic's padded rows were not 0.
TEST(Adafactor, PaddedVocabularyMatchesHfOnTheRealRows) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  const std::vector<Config> configs = {
      {true, true, false, std::nullopt, 0.0, 1.0},    // HF defaults
      {true, false, false, std::nullopt, 0.0, 1.0},   // relative step, no parameter scale
      {false, true, false, std::nullopt, 0.0, 1.0},   // external lr x parameter scale
      {false, false, false, std::nullopt, 0.0, 1.0},  // external lr alone
      {false, true, false, 0.9, 0.01, 0.5},           // beta1, decay, tighter clipping
      {true, false, false, std::nullopt, 0.0, 0.5},   // clipping without the parameter scale
  };
  nlohmann::json cj = nlohmann::json::array();
  for (const Config& c : configs) {
    cj.push_back({{"relative_step", c.relative_step},
                  {"scale_parameter", c.scale_parameter},
                  {"warmup_init", c.warmup_init},
                  {"beta1", c.beta1.has_value() ? nlohmann::json(*c.beta1) : nlohmann::json()},
                  {"weight_decay", c.weight_decay},
                  {"clip_threshold", c.clip_threshold},
                  {"eps1", 1e-30},
                  {"eps2", 1e-3},
                  {"decay_rate", -0.8}});
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  for (const std::string arch : {"gpt2", "llama", "bert"}) {
    SCOPED_TRACE(arch);
    int64_t n = 0;
    std::vector<bool> transposed;
    const std::vector<ParamInfo> params = testing::PaddedVocabParams(arch, &n, &transposed);
    int padded = 0;
    for (const ParamInfo& p : params) padded += testing::HfNumel(p) < p.numel ? 1 : 0;
    ASSERT_EQ(padded, arch == "gpt2" ? 1 : 2) << "the vocabulary tables are padded";
    const int steps = 10;
    const std::vector<float> init =
        testing::ZeroPadding(testing::RandomVector(n, 17, 0.3f), params);
    std::vector<std::vector<float>> grads;
    std::vector<double> lrs;
    std::vector<float> scales;
    for (int s = 0; s < steps; ++s) {
      grads.push_back(testing::ZeroPadding(testing::RandomVector(n, 300 + s, 0.5f, 0.02f), params));
      lrs.push_back(1e-2 * (1.0 - 0.05 * s));
      scales.push_back(s % 2 == 0 ? 1.0f : 0.5f);
    }
    const std::string dir = testing::MakeTempDir("adafactor_padded_" + arch);
    testing::WriteOptimCase(dir, params, n, init, grads, lrs, scales, cj, transposed);
    std::string out;
    ASSERT_EQ(testing::RunPython("adafactor_reference.py", dir, &out), 0) << out;
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      DeviceArena arena(backend.get(), 0);
      const AdafactorOptions o = ToOptions(configs[ci]);
      auto opt = AdafactorOptimizer::Create(params, n, o, &arena);
      ASSERT_TRUE(opt.ok()) << opt.status().ToString();
      EXPECT_EQ(arena.used_by_category().optimizer, AdafactorOptimizer::PlanBytes(params, o));
      std::vector<float> p = init;
      for (int s = 0; s < steps; ++s) (*opt)->Step(p.data(), grads[s].data(), lrs[s], scales[s]);
      const std::vector<float> ref =
          testing::ReadFloats(dir + "/out_" + std::to_string(ci) + ".bin");
      const double worst = testing::MaxRelError(p, ref, params);
      const double moved = testing::MaxRelError(init, ref, params);
      EXPECT_LT(worst, 1e-5) << "config " << ci;
      EXPECT_GT(moved, 100 * worst) << "config " << ci;
      std::printf("[adafactor padded] %s config %zu: moved %.3g, error %.3g\n", arch.c_str(), ci,
                  moved, worst);
      // The padding: weights, and every state tensor's padded rows (each state tensor's elements
      // past its live part), exactly 0.
      const SafetensorsFile st = (*opt)->SaveState();
      int64_t nonzero = 0;
      for (const ParamInfo& info : params) {
        const int64_t live = testing::HfNumel(info);
        if (live >= info.numel) continue;
        for (int64_t i = info.offset + live; i < info.offset + info.numel; ++i) {
          nonzero += p[static_cast<size_t>(i)] != 0.0f ? 1 : 0;
        }
        const int64_t rows = info.shape[0], real_rows = info.hf_shape[0];
        for (const auto& [name, t] : st.tensors) {
          if (name.rfind(info.hf_name + ".", 0) != 0 || t.shape.empty() || t.shape[0] != rows)
            continue;  // a column statistic: no vocabulary dim
          const Result<std::vector<float>> v = t.ToF32();
          ASSERT_TRUE(v.ok()) << name;
          const size_t per_row = v->size() / static_cast<size_t>(rows);
          for (size_t i = static_cast<size_t>(real_rows) * per_row; i < v->size(); ++i) {
            nonzero += (*v)[i] != 0.0f ? 1 : 0;
          }
        }
      }
      EXPECT_EQ(nonzero, 0) << "config " << ci << ": padded weights or state not 0";
    }
  }
}

// The case through the trainer: gpt2 with a vocabulary of 61 (wte padded to 64 rows),
// four steps of Adafactor with HF's defaults (relative step, parameter scale) under global
// clipping and weight decay, against HF's Adafactor in torch on the 61-row wte
// (reference/train_reference.py): losses, grad norms and every weight (c_attn.bias aside: see
// ExpectTrainerStepsMatchTorch) within 1e-5. (Before the fix wte parted at step 3.)
TEST(Adafactor, TrainerStepsMatchHfOnAPaddedVocabulary) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  OptimArgs hf;
  hf.relative_step = true;
  hf.scale_parameter = true;
  testing::ExpectTrainerStepsMatchTorch("adafactor", hf, 4);
}

TEST(Adafactor, StateRoundTripShapesAndValidation) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  int64_t n = 0;
  std::vector<ParamInfo> params = testing::MakeParams({{4, 5}, {6}, {2, 3, 4}}, &n);
  AdafactorOptions o;
  o.beta1 = 0.9;
  auto opt = AdafactorOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt.ok());
  // exp_avg (n) + row/col (4+5, 6 for the vector's full moment, 2*3+2*4) + scratch (2 + 2 doubles).
  EXPECT_EQ(AdafactorOptimizer::PlanBytes(params, o), (n + 9 + 6 + 14) * 4 + 4 * 8);
  std::vector<float> p = testing::RandomVector(n, 3, 1.0f), g = testing::RandomVector(n, 4, 1.0f);
  (*opt)->Step(p.data(), g.data(), 0.0, 1.0f);
  SafetensorsFile st = (*opt)->SaveState();
  EXPECT_EQ(st.metadata["format"], "traind-adafactor-v1");
  EXPECT_EQ(st.tensors["p0.exp_avg_sq_row"].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(st.tensors["p0.exp_avg_sq_col"].shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(st.tensors["p2.exp_avg_sq_row"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(st.tensors["p2.exp_avg_sq_col"].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(st.tensors["p1.exp_avg_sq"].shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(st.tensors.size(), 3u + 5u);
  auto opt2 = AdafactorOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE((*opt2)->LoadState(st).ok());
  std::vector<float> p2 = p;
  (*opt)->Step(p.data(), g.data(), 0.0, 1.0f);
  (*opt2)->Step(p2.data(), g.data(), 0.0, 1.0f);
  EXPECT_EQ(p, p2);
  st.tensors["p2.exp_avg_sq_col"].shape = {8};
  Status bad = (*opt2)->LoadState(st);
  EXPECT_EQ(bad.code(), Status::Code::kDataLoss);
  EXPECT_NE(bad.message().find("p2.exp_avg_sq_col"), std::string::npos);

  AdafactorOptions lr_and_rel;
  lr_and_rel.lr = 1e-3;  // HF: "Cannot combine manual lr and relative_step=True options"
  EXPECT_EQ(AdafactorOptimizer::Create(params, n, lr_and_rel, &arena).status().code(),
            Status::Code::kInvalidArgument);
  AdafactorOptions warm;
  warm.relative_step = false;
  warm.warmup_init = true;
  EXPECT_EQ(AdafactorOptimizer::Create(params, n, warm, &arena).status().code(),
            Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace traind::engine
