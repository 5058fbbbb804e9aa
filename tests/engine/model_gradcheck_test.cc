// Finite-difference check of whole tiny models: for the largest-gradient element of several
// parameter tensors, central differences of the fp32 loss (h = 1e-2 and h/2, Richardson
// extrapolated) against the analytic gradient. Tolerance |fd - g| <= 5e-3 |g| + 1e-4: fp32 loss
// noise (~1e-6) / h and the O(h^4) truncation set it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

void FiniteDifferences(const ModelConfig& c, const std::vector<std::string>& names) {
  const ModelOptions o = TinyOptions(2, 8);
  TestModel t = TestModel::Make(c, o);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(17);
  // Larger weights than the 0.02 init, so attention is far from uniform and the q/k gradients
  // are large enough for a meaningful fp32 difference quotient.
  t.backend->Scale(m.param_data(), 3.0f, m.num_params());
  SetBatch(t, MakeBatch(o.micro_batch * o.seq_len, c.vocab_size, 18, 5));
  m.ZeroGrad();
  m.Forward(true, 1.0f);
  m.Backward();
  const std::vector<float> grads = ToHost(*t.backend, m.grad_data(), m.num_params());
  std::vector<float> params = ToHost(*t.backend, m.param_data(), m.num_params());
  const double h = 1e-2;
  int checked = 0;
  double worst = 0;
  for (const ParamInfo& info : m.params()) {
    if (std::find(names.begin(), names.end(), info.hf_name) == names.end()) continue;
    int64_t best = info.offset;
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      if (std::abs(grads[i]) > std::abs(grads[best])) best = i;
    }
    auto loss_at = [&](double delta) {
      const float saved = params[best];
      params[best] = static_cast<float>(saved + delta);
      t.backend->CopyHostToDevice(m.param_data() + best, &params[best], sizeof(float));
      const double l = m.Forward(false, 1.0f);
      params[best] = saved;
      t.backend->CopyHostToDevice(m.param_data() + best, &params[best], sizeof(float));
      return l;
    };
    // Richardson extrapolation of two central differences: truncation error O(h^4).
    const double d1 = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double d2 = (loss_at(h / 2) - loss_at(-h / 2)) / h;
    const double fd = (4 * d2 - d1) / 3;
    const double g = grads[best];
    EXPECT_NEAR(fd, g, 5e-3 * std::abs(g) + 1e-4)
        << info.hf_name << " element " << best - info.offset;
    EXPECT_GT(std::abs(g), 1e-3) << info.hf_name << ": gradient too small to be a useful check";
    worst = std::max(worst, std::abs(fd - g) / std::abs(g));
    ++checked;
  }
  std::printf("[%s] worst finite-difference relative error %.2e over %d tensors\n", ArchName(c.arch),
              worst, checked);
  EXPECT_EQ(checked, static_cast<int>(names.size()));
}

TEST(ModelGradcheck, Gpt2) {
  FiniteDifferences(TinyGpt2(),
                    {"transformer.wte.weight", "transformer.wpe.weight",
                     "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                     "transformer.h.0.attn.c_attn.bias", "transformer.h.1.mlp.c_fc.weight",
                     "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.bias"});
}

TEST(ModelGradcheck, Llama) {
  FiniteDifferences(
      TinyLlama(false),
      {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
       "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
       "model.layers.1.self_attn.v_proj.weight", "model.layers.1.mlp.gate_proj.weight",
       "model.layers.1.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"});
}

}  // namespace
}  // namespace traind::engine::testing
