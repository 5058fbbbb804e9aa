// Mixed precision in the model (ModelOptions::compute_type bf16 / f16): loss and gradients of tiny
// gpt2 and llama models against the same model in fp32 (the independent reference: fp32 is checked
// against PyTorch in model_parity_test), the 16-bit weight copy's refresh, checkpointing, and the
// memory plan with 16-bit weights and activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "model_test_util.h"
#include "optim/adamw.h"

namespace traind::engine::testing {
namespace {

struct MpRun {
  double loss = 0;
  std::vector<float> grads;
};

MpRun LossAndGrads(const ModelConfig& c, ModelOptions o, DType t, float grad_scale,
                   const Batch& batch, uint64_t seed = 5) {
  o.compute_type = t;
  TestModel m = TestModel::Make(c, o);
  MpRun r;
  if (m.model == nullptr) return r;
  m.model->InitRandom(seed);
  SetBatch(m, batch);
  m.model->ZeroGrad();
  r.loss = m.model->Forward(true, grad_scale);
  m.model->Backward();
  r.grads = ToHost(*m.backend, m.model->grad_data(), m.model->num_params());
  for (float& g : r.grads) g /= grad_scale;
  return r;
}

struct Tol {
  double loss;  // relative
  double grad;  // relative L2 over all gradients
};

// Rounding the GEMM inputs to 8 (bf16) or 11 (f16) significant bits, with fp32 accumulation,
// moved these tiny models' losses by <= 1.3e-5 (bf16) / 2.4e-6 (f16) relative and their gradients
// by 2.5e-3-2.8e-3 (bf16) / 3.3e-4 (f16) in relative L2 (printed by the tests); the bounds leave
// 3-8x room. Both are ~the type's unit roundoff (2^-9, 2^-12) averaged over many roundings.
Tol TolFor(DType t) { return t == DType::kBF16 ? Tol{1e-4, 1e-2} : Tol{2e-5, 1.5e-3}; }

void CheckClose(const ModelConfig& c, DType t, float grad_scale) {
  const ModelOptions o = TinyOptions(3, 16);
  const Batch batch = MakeBatch(o.micro_batch * o.seq_len, c.vocab_size, 21);
  const MpRun ref = LossAndGrads(c, o, DType::kF32, 1.0f, batch);
  const MpRun got = LossAndGrads(c, o, t, grad_scale, batch);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  const double loss_rel = std::abs(got.loss - ref.loss) / ref.loss;
  const double grad_rel = RelErr(got.grads, ref.grads);
  std::printf("[mp] %s %s scale %g: loss %.6f vs fp32 %.6f (rel %.2e), grads rel L2 %.2e\n",
              ArchName(c.arch), DTypeName(t), grad_scale, got.loss, ref.loss, loss_rel, grad_rel);
  const Tol tol = TolFor(t);
  EXPECT_LE(loss_rel, tol.loss);
  EXPECT_LE(grad_rel, tol.grad);
  // Not accidentally fp32: 16-bit rounding must leave a trace.
  EXPECT_GT(grad_rel, 1e-6);
  for (float g : got.grads) ASSERT_TRUE(std::isfinite(g));
}

TEST(MixedPrecisionModel, Gpt2Bf16CloseToFp32) { CheckClose(TinyGpt2(), DType::kBF16, 1.0f); }
TEST(MixedPrecisionModel, Gpt2F16CloseToFp32) { CheckClose(TinyGpt2(), DType::kF16, 1.0f); }
TEST(MixedPrecisionModel, LlamaBf16CloseToFp32) {
  CheckClose(TinyLlama(false), DType::kBF16, 1.0f);
  CheckClose(TinyLlama(true), DType::kBF16, 1.0f);
}
TEST(MixedPrecisionModel, LlamaF16CloseToFp32) {
  CheckClose(TinyLlama(false), DType::kF16, 1.0f);
  CheckClose(TinyLlama(true), DType::kF16, 1.0f);
}
// f16 with a loss scale (as the fp16 scaler runs it): unscaled gradients stay as close.
TEST(MixedPrecisionModel, F16WithLossScaleCloseToFp32) {
  CheckClose(TinyGpt2(), DType::kF16, 1024.0f);
  CheckClose(TinyLlama(false), DType::kF16, 65536.0f);
}

// Padded vocabulary rows never receive gradient in 16 bits either.
TEST(MixedPrecisionModel, PaddedVocabRowsGetNoGradient) {
  const ModelConfig c = TinyGpt2();
  const ModelOptions o = TinyOptions(2, 8);
  const MpRun r = LossAndGrads(c, o, DType::kBF16, 1.0f, MakeBatch(16, c.vocab_size, 4));
  ASSERT_FALSE(r.grads.empty());
  for (int64_t i = c.vocab_size * 32; i < 128 * 32; ++i) ASSERT_EQ(r.grads[i], 0.0f);
}

// The 16-bit copy follows the master weights after ParamsChanged() (what the trainer calls after
// each optimizer step): the loss equals a fresh model's on the same new weights, and differs from
// the stale copy's.
TEST(MixedPrecisionModel, ParamsChangedRefreshesTheCopy) {
  const ModelConfig c = TinyLlama(false);
  ModelOptions o = TinyOptions(2, 8);
  o.compute_type = DType::kBF16;
  const Batch batch = MakeBatch(16, c.vocab_size, 8);
  TestModel a = TestModel::Make(c, o);
  TestModel b = TestModel::Make(c, o);
  ASSERT_NE(a.model, nullptr);
  ASSERT_NE(b.model, nullptr);
  a.model->InitRandom(1);
  b.model->InitRandom(2);
  SetBatch(a, batch);
  SetBatch(b, batch);
  const double loss_a1 = a.model->Forward(false, 1.0f);
  const double loss_b = b.model->Forward(false, 1.0f);
  ASSERT_NE(loss_a1, loss_b);
  // Overwrite a's master weights with b's.
  a.backend->CopyDeviceToDevice(a.model->param_data(), b.model->param_data(),
                                static_cast<size_t>(a.model->num_params()) * sizeof(float));
  a.backend->Synchronize();
  // Stale 16-bit GEMM weights until told (embeddings and norms read the fp32 masters already).
  EXPECT_NE(a.model->Forward(false, 1.0f), loss_b);
  a.model->ParamsChanged();
  EXPECT_EQ(a.model->Forward(false, 1.0f), loss_b);
}

// Recomputing blocks in backward gives the same gradients bit for bit in 16 bits too.
TEST(MixedPrecisionModel, CheckpointingBitIdenticalInBf16AndF16) {
  ModelConfig c = TinyGpt2();
  c.n_layer = 3;
  for (DType t : {DType::kBF16, DType::kF16}) {
    ModelOptions o = TinyOptions(2, 16);
    const Batch batch = MakeBatch(32, c.vocab_size, 13);
    const MpRun plain = LossAndGrads(c, o, t, 1.0f, batch);
    o.gradient_checkpointing = true;
    o.checkpoint_every = 2;
    const MpRun ckpt = LossAndGrads(c, o, t, 1.0f, batch);
    ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
    EXPECT_EQ(plain.loss, ckpt.loss);
    EXPECT_EQ(std::memcmp(plain.grads.data(), ckpt.grads.data(), plain.grads.size() * 4), 0)
        << DTypeName(t);
  }
}

// Hand count of the bf16 plan for tiny gpt2 (B=3, T=16, every buffer a multiple of 64 bytes except
// where noted): weights = fp32 master + 16-bit copy; the four GEMM inputs per block, attention's
// qkv and lnf in 16 bits; temporaries gain the 16-bit gradient scratch.
TEST(MixedPrecisionModel, Gpt2Bf16PlanMatchesHandCount) {
  const ModelConfig c = TinyGpt2();
  const int64_t B = 3, T = 16, N = B * T, C = 32, L = 2, NH = 4, Vp = 128, P = 24;
  ModelOptions o = TinyOptions(B, T);
  o.compute_type = DType::kBF16;
  const MemoryBytes plan = Model::PlanBytes(c, o);
  const int64_t params = Vp * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
  auto align = [](int64_t x) { return (x + 63) / 64 * 64; };
  EXPECT_EQ(plan.weights, align(params * 4) + params * 2);
  EXPECT_EQ(plan.gradients, params * 4);
  // per block: ln1, atty, ln2 (N,C), qkv (N,3C) and a (N,4C) in 2 bytes; h (N,4C), res2 (N,C),
  // 2 means + 2 rstds (N), lse (B,NH,T) in 4 bytes.
  const int64_t block16 = 3 * N * C + 3 * N * C + 4 * N * C;
  const int64_t block = block16 * 2 + (4 * N * C + N * C + 4 * N + B * NH * T) * 4;
  // ids, targets, positions; L+1 residuals; lnf (2 bytes) + mean + rstd; logits; losses.
  const int64_t acts =
      (3 * N + (L + 1) * N * C) * 4 + L * block + N * C * 2 + (2 * N + N * Vp + N) * 4;
  EXPECT_EQ(plan.activations, acts);
  // dres, tmp_c (N,C) and scratch (N,4C) in fp32; the 16-bit scratch
  // max(NC, 3NC, 4NC, min(N, 512) * Vp) = 4NC here.
  EXPECT_EQ(plan.temporary, (2 * N * C + N * 4 * C) * 4 + N * 4 * C * 2);
  // The saving: each 16-bit buffer half its fp32 bytes.
  EXPECT_EQ(Model::PlanBytes(c, TinyOptions(B, T)).activations - plan.activations,
            (L * block16 + N * C) * 2);
}

}  // namespace
}  // namespace traind::engine::testing
