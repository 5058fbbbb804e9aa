// Packed GEMM weights (Backend::PackGemmB, ModelOptions::pack_weights): on the CPU backend a bf16
// B packed in both of a linear layer's layouts gives the products the plain B gives (reference:
// the same backend's GEMMs before packing, within float reassociation), the packed copy is what
// the GEMMs read until it is forgotten, a bf16 model with packed weights has the loss and the
// gradients of the same model without them (also after its weights change), and the plan counts
// the copies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "model_test_util.h"
#include "models/layout.h"

namespace traind::engine {
namespace {

using testing::TestModel;

std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = F32ToBF16(u(rng));
  return v;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return worst / std::max(scale, 1e-30);
}

// A linear layer W (OC x C) in bf16 at sizes that are not multiples of the layout's blocks (the
// copy is padded): the forward with and without a bias (two CPU paths: oneDNN's matmul with the
// bias, and the plain GEMM) and the input gradient.
struct LinearProducts {
  std::vector<float> fwd_bias, fwd, dinp;
};

constexpr int64_t kM = 37, kC = 72, kOC = 100;

LinearProducts Products(Backend& be, const uint16_t* x, const uint16_t* w, const uint16_t* dy,
                        const float* bias) {
  LinearProducts r;
  r.fwd_bias.assign(kM * kOC, 0.0f);
  r.fwd.assign(kM * kOC, 0.0f);
  r.dinp.assign(kM * kC, 0.0f);
  be.LinearForward(r.fwd_bias.data(), nullptr, x, w, bias, kM, kC, kOC, DType::kBF16);
  be.Gemm(false, true, kM, kOC, kC, 1.0f, x, kC, w, kC, 0.0f, r.fwd.data(), kOC, DType::kBF16,
          DType::kF32);
  be.Gemm(false, false, kM, kC, kOC, 1.0f, dy, kOC, w, kC, 0.0f, r.dinp.data(), kC,
          DType::kBF16, DType::kF32);
  return r;
}

TEST(PackedWeightsTest, CpuProductsWithPackedBf16WeightsEqualThePlainOnes) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const std::vector<uint16_t> x = RandomBf16(kM * kC, 1), dy = RandomBf16(kM * kOC, 2);
  std::vector<uint16_t> w = RandomBf16(kOC * kC, 3);
  std::vector<float> bias(kOC);
  for (int64_t i = 0; i < kOC; ++i) bias[i] = 0.01f * static_cast<float>(i);
  const LinearProducts plain = Products(*be, x.data(), w.data(), dy.data(), bias.data());

  const int64_t fwd_bytes = be->PackedGemmBBytes(kC, kOC, DType::kBF16);
  const int64_t bwd_bytes = be->PackedGemmBBytes(kOC, kC, DType::kBF16);
  // Within the planned bound (layout.h), which the model allocates.
  EXPECT_LE(fwd_bytes, PackedCopyBytes(kC, kOC));
  EXPECT_LE(bwd_bytes, PackedCopyBytes(kOC, kC));
  std::vector<char> fwd_copy(PackedCopyBytes(kC, kOC)), bwd_copy(PackedCopyBytes(kOC, kC));
  const bool packed =
      be->PackGemmB(fwd_copy.data(), static_cast<int64_t>(fwd_copy.size()), w.data(), true, kC,
                    kOC, kC, DType::kBF16) &&
      be->PackGemmB(bwd_copy.data(), static_cast<int64_t>(bwd_copy.size()), w.data(), false, kOC,
                    kC, kC, DType::kBF16);
  // The backend packs exactly when it says it has a layout (oneDNN with bf16 kernels).
  EXPECT_EQ(packed, fwd_bytes > 0 && bwd_bytes > 0);
  std::printf("packed: %d (forward copy %lld bytes, input-gradient copy %lld bytes)\n",
              packed ? 1 : 0, static_cast<long long>(fwd_bytes),
              static_cast<long long>(bwd_bytes));
  // A storage smaller than the layout is refused.
  if (fwd_bytes > 0) {
    EXPECT_FALSE(be->PackGemmB(fwd_copy.data(), fwd_bytes - 1, dy.data(), true, kC, kOC, kC,
                               DType::kBF16));
  }

  const LinearProducts with = Products(*be, x.data(), w.data(), dy.data(), bias.data());
  // Same kernels on a copied operand: equal within fp32 reassociation.
  EXPECT_LT(MaxRelDiff(with.fwd_bias, plain.fwd_bias), 1e-6);
  EXPECT_LT(MaxRelDiff(with.fwd, plain.fwd), 1e-6);
  EXPECT_LT(MaxRelDiff(with.dinp, plain.dinp), 1e-6);

  // The GEMMs read the copy: new values at w are not seen until the copy is forgotten (the
  // caller's contract), then they are.
  std::vector<uint16_t> w2 = RandomBf16(kOC * kC, 4);
  std::memcpy(w.data(), w2.data(), w2.size() * sizeof(uint16_t));
  const LinearProducts stale = Products(*be, x.data(), w.data(), dy.data(), bias.data());
  if (packed) {
    EXPECT_LT(MaxRelDiff(stale.fwd, plain.fwd), 1e-6);
    EXPECT_LT(MaxRelDiff(stale.dinp, plain.dinp), 1e-6);
  }
  be->ForgetPackedGemmB(w.data(), w.data() + w.size());
  const LinearProducts fresh = Products(*be, x.data(), w.data(), dy.data(), bias.data());
  EXPECT_GT(MaxRelDiff(fresh.fwd, plain.fwd), 1e-2);
  // The new weights' products, checked against double sums of the bf16 values.
  double worst = 0;
  for (int64_t m = 0; m < kM; ++m) {
    for (int64_t o = 0; o < kOC; ++o) {
      double s = 0;
      for (int64_t c = 0; c < kC; ++c) s += double(BF16ToF32(x[m * kC + c])) * BF16ToF32(w[o * kC + c]);
      worst = std::max(worst, std::abs(s - fresh.fwd[m * kOC + o]));
    }
  }
  EXPECT_LT(worst, 1e-4);
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> grads;
};

// Forward + backward, then new master weights (ParamsChanged, as after an optimizer step) and
// forward + backward again: the losses and the last gradients.
TrainRun TwoWeightVersions(const ModelConfig& c, bool pack) {
  ModelOptions o = testing::TinyOptions(3, 16);
  o.compute_type = DType::kBF16;
  o.pack_weights = pack;
  TestModel t = TestModel::Make(c, o);
  TrainRun r;
  if (t.model == nullptr) return r;
  t.model->InitRandom(7);
  testing::SetBatch(t, testing::MakeBatch(48, c.vocab_size, 3));
  for (int version = 0; version < 2; ++version) {
    if (version == 1) {
      std::vector<float> p = testing::ToHost(*t.backend, t.model->param_data(), t.model->num_params());
      for (size_t i = 0; i < p.size(); ++i) p[i] *= 1.0f + 0.25f * std::sin(static_cast<float>(i));
      t.backend->CopyHostToDevice(t.model->param_data(), p.data(), p.size() * sizeof(float));
      t.model->ParamsChanged();
    }
    t.model->ZeroGrad();
    r.losses.push_back(t.model->Forward(true, 1.0f));
    t.model->Backward();
  }
  r.grads = testing::ToHost(*t.backend, t.model->grad_data(), t.model->num_trainable());
  return r;
}

TEST(PackedWeightsTest, Bf16ModelsWithPackedWeightsTrainAsWithout) {
  for (const ModelConfig& c : {testing::TinyGpt2(), testing::TinyLlama(false), testing::TinyLlama(true)}) {
    const TrainRun plain = TwoWeightVersions(c, false), packed = TwoWeightVersions(c, true);
    ASSERT_EQ(plain.losses.size(), 2u);
    ASSERT_EQ(packed.losses.size(), 2u);
    EXPECT_NE(plain.losses[0], plain.losses[1]);  // the weights did change
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(packed.losses[i], plain.losses[i], 1e-6 * std::abs(plain.losses[i]))
          << c.arch << " weights " << i;
    }
    EXPECT_LT(testing::RelErr(packed.grads, plain.grads), 1e-6) << c.arch;
  }
}

// The plan: both copies of every block's and the lm head's weight, only for bf16; the small gpt2
// of the benches (d384, vocab 50304) as a hand count.
TEST(PackedWeightsTest, ThePlanCountsBothCopiesOfEveryPackedWeight) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 50304;
  c.n_positions = 256;
  c.n_embd = 384;
  c.n_layer = 6;
  c.n_head = 6;
  ModelOptions o;
  o.micro_batch = 8;
  o.seq_len = 256;
  o.compute_type = DType::kBF16;
  const MemoryBytes plain = Model::PlanBytes(c, o);
  o.pack_weights = true;
  const MemoryBytes packed = Model::PlanBytes(c, o);
  // Per block: qkv 384 -> 1152, proj 384 -> 384, fc 384 -> 1536, fc2 1536 -> 384 (every
  // dimension already a multiple of the layout's blocks); the lm head 384 -> 50304; two copies
  // of two bytes each.
  const int64_t per_block = 384 * 1152 + 384 * 384 + 384 * 1536 + 1536 * 384;
  const int64_t hand = 2 * 2 * (6 * per_block + 384 * 50304);
  EXPECT_EQ(PackedWeightBytes(MakeArchDims(c)), hand);
  EXPECT_EQ(packed.weights - plain.weights, hand);
  EXPECT_EQ(packed.total() - plain.total(), hand);
  o.compute_type = DType::kF32;  // fp32 GEMMs read the fp32 weights as they are
  EXPECT_EQ(Model::PlanBytes(c, o).total(), Model::PlanBytes(c, [&] {
              ModelOptions f = o;
              f.pack_weights = false;
              return f;
            }()).total());
}

}  // namespace
}  // namespace traind::engine
