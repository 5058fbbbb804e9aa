// The model's memory plan against the arena's measurements, and gradient checkpointing: the
// arena after Create + Forward + Backward holds exactly PlanBytes by category (fp32, bf16 and f16
// compute types), the plan matches a hand count, and recomputed blocks give bit-identical
// gradients with less activation memory.
#include <gtest/gtest.h>

#include <cstring>

#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

struct PlanCase {
  ModelConfig config;
  ModelOptions options;
};

std::vector<PlanCase> PlanCases() {
  std::vector<PlanCase> cases;
  ModelConfig g = TinyGpt2();
  ModelConfig g2 = TinyGpt2();
  g2.n_layer = 3, g2.n_embd = 48, g2.n_head = 6, g2.vocab_size = 300;
  ModelConfig lu = TinyLlama(false);
  ModelConfig lt = TinyLlama(true);
  lt.num_hidden_layers = 4;
  // qwen2 (q/k/v biases), mistral (the window), qwen3 (the per-head q/k norm's saved inputs
  // and rstd) and gemma (GeGLU's scratch).
  for (const ModelConfig& c : {g, g2, lu, lt, TinyFamily("qwen2"), TinyFamily("mistral"),
                               TinyFamily("qwen3"), TinyFamily("gemma")}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int ck : {0, 1, 2}) {
        ModelOptions o = TinyOptions(2, 12);
        o.gradient_checkpointing = ck > 0;
        o.checkpoint_every = ck > 0 ? ck : 1;
        o.compute_type = t;
        cases.push_back({c, o});
      }
    }
  }
  return cases;
}

TEST(ModelMemory, ArenaMatchesPlanExactlyByCategory) {
  for (const PlanCase& pc : PlanCases()) {
    SCOPED_TRACE(
        std::string(ArchName(pc.config.arch)) + " L=" + std::to_string(pc.config.num_layers()) + " ckpt_every=" +
        std::to_string(pc.options.gradient_checkpointing ? pc.options.checkpoint_every : 0) +
        " " + DTypeName(pc.options.compute_type));
    const MemoryBytes plan = Model::PlanBytes(pc.config, pc.options);
    TestModel t = TestModel::Make(pc.config, pc.options);
    ASSERT_NE(t.model, nullptr);
    t.model->InitRandom(1);
    SetBatch(t, MakeBatch(pc.options.micro_batch * pc.options.seq_len, pc.config.vocab_size, 2));
    t.model->ZeroGrad();
    t.model->Forward(true, 1.0f);
    t.model->Backward();
    const MemoryBytes used = t.arena->used_by_category();
    EXPECT_EQ(used.weights, plan.weights);
    EXPECT_EQ(used.gradients, plan.gradients);
    EXPECT_EQ(used.optimizer, 0);
    EXPECT_EQ(used.activations, plan.activations);
    EXPECT_EQ(used.temporary, plan.temporary);
    EXPECT_EQ(t.arena->peak_bytes(), plan.total());
    // fp32 master weights, plus their 16-bit copy (64-byte aligned) with a 16-bit compute type.
    const int64_t master = t.model->num_params() * 4;
    EXPECT_EQ(plan.weights, pc.options.compute_type == DType::kF32
                                ? master
                                : (master + 63) / 64 * 64 + t.model->num_params() * 2);
    EXPECT_EQ(plan.gradients, t.model->num_params() * 4);
  }
}

// An independent count for tiny gpt2 (B=3, T=16: every buffer is a multiple of 64 bytes, so the
// 64-byte alignment adds nothing).
TEST(ModelMemory, Gpt2PlanMatchesHandCount) {
  const ModelConfig c = TinyGpt2();
  const int64_t B = 3, T = 16, N = B * T, C = 32, L = 2, NH = 4, V = 67, Vp = 128, P = 24;
  const MemoryBytes plan = Model::PlanBytes(c, TinyOptions(B, T));
  const int64_t params = Vp * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
  TestModel t = TestModel::Make(c, TinyOptions(B, T));
  ASSERT_NE(t.model, nullptr);
  EXPECT_EQ(t.model->num_params(), params);
  EXPECT_EQ(plan.weights, params * 4);
  EXPECT_EQ(plan.gradients, params * 4);
  // per block: ln1, atty, res2, ln2 (N,C); qkv (N,3C); h, a (N,4C); 2 means + 2 rstds (N); lse.
  const int64_t block = 4 * N * C + 3 * N * C + 8 * N * C + 4 * N + B * NH * T;
  // ids, targets, positions; L+1 residuals; lnf + mean + rstd; logits (N,Vp); losses.
  const int64_t acts = 3 * N + (L + 1) * N * C + L * block + N * C + 2 * N + N * Vp + N;
  EXPECT_EQ(plan.activations, acts * 4);
  // dres, tmp_c (N,C) and scratch (N, max(3C, 4C)).
  EXPECT_EQ(plan.temporary, (2 * N * C + N * 4 * C) * 4);
  (void)V;
}

TEST(ModelMemory, CheckpointingShrinksActivations) {
  ModelConfig c = TinyLlama(false);
  c.num_hidden_layers = 6;
  ModelOptions o = TinyOptions(2, 16);
  const int64_t full = Model::PlanBytes(c, o).activations;
  o.gradient_checkpointing = true;
  o.checkpoint_every = 1;
  const int64_t k1 = Model::PlanBytes(c, o).activations;
  o.checkpoint_every = 2;
  const int64_t k2 = Model::PlanBytes(c, o).activations;
  EXPECT_LT(k1, full);
  EXPECT_LT(k2, full);
  EXPECT_NE(k1, k2);
}

// Gradients with checkpointing (every k) equal the plain run bit for bit on the CPU backend; in
// 16 bits too for llama (the recomputed block rotates and rounds qkv again, into the same bits).
void CheckBitIdentical(const ModelConfig& c, DType type = DType::kF32) {
  ModelOptions base = TinyOptions(2, 16);
  base.compute_type = type;
  const Batch batch = MakeBatch(base.micro_batch * base.seq_len, c.vocab_size, 11);
  auto run = [&](bool ckpt, int64_t k, double* loss) {
    ModelOptions o = base;
    o.gradient_checkpointing = ckpt;
    o.checkpoint_every = k;
    TestModel t = TestModel::Make(c, o);
    EXPECT_NE(t.model, nullptr);
    t.model->InitRandom(5);
    SetBatch(t, batch);
    t.model->ZeroGrad();
    *loss = t.model->Forward(true, 0.5f);
    t.model->Backward();
    return ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
  };
  double loss_ref = 0;
  const std::vector<float> ref = run(false, 1, &loss_ref);
  for (int64_t k : {1, 2, 3, 5}) {
    double loss = 0;
    const std::vector<float> g = run(true, k, &loss);
    ASSERT_EQ(g.size(), ref.size());
    EXPECT_EQ(loss, loss_ref) << "k=" << k;
    EXPECT_EQ(std::memcmp(g.data(), ref.data(), g.size() * sizeof(float)), 0)
        << c.arch << " checkpoint_every=" << k << ": gradients differ";
  }
}

TEST(ModelCheckpointing, Gpt2GradientsBitIdentical) {
  ModelConfig c = TinyGpt2();
  c.n_layer = 4;
  CheckBitIdentical(c);
}

TEST(ModelCheckpointing, LlamaGradientsBitIdentical) {
  ModelConfig c = TinyLlama(false);
  c.num_hidden_layers = 4;
  CheckBitIdentical(c);
  CheckBitIdentical(c, DType::kBF16);
  CheckBitIdentical(c, DType::kF16);
}

// Backward accumulates: two Forward/Backward passes without ZeroGrad give twice the gradient,
// and grad_scale scales it.
TEST(ModelGradients, AccumulateAndScale) {
  const ModelConfig c = TinyGpt2();
  TestModel t = TestModel::Make(c, TinyOptions(2, 8));
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(3);
  SetBatch(t, MakeBatch(16, c.vocab_size, 4));
  m.ZeroGrad();
  m.Forward(true, 1.0f);
  m.Backward();
  const std::vector<float> g1 = ToHost(*t.backend, m.grad_data(), m.num_params());
  m.Forward(true, 2.0f);
  m.Backward();
  const std::vector<float> g3 = ToHost(*t.backend, m.grad_data(), m.num_params());
  double num = 0, den = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    num += (g3[i] - 3.0 * g1[i]) * (g3[i] - 3.0 * g1[i]);
    den += 9.0 * g1[i] * g1[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-6);
  // Padded vocabulary rows (V..Vp) of the tied embedding never receive gradient.
  const ParamInfo& wte = m.params()[0];
  ASSERT_EQ(wte.shape[0], 128);
  for (int64_t i = c.vocab_size * 32; i < wte.numel; ++i) ASSERT_EQ(g3[wte.offset + i], 0.0f);
}

TEST(ModelGradients, AllTargetsIgnoredGivesZeroLossAndGradient) {
  const ModelConfig c = TinyLlama(false);
  TestModel t = TestModel::Make(c, TinyOptions(2, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(3);
  Batch b = MakeBatch(16, c.vocab_size, 4);
  std::fill(b.targets.begin(), b.targets.end(), -1);
  SetBatch(t, b);
  t.model->ZeroGrad();
  EXPECT_EQ(t.model->Forward(true, 1.0f), 0.0);
  t.model->Backward();
  for (float g : ToHost(*t.backend, t.model->grad_data(), t.model->num_params())) {
    ASSERT_EQ(g, 0.0f);
  }
}

}  // namespace
}  // namespace traind::engine::testing
