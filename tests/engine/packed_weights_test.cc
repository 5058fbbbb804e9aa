// Packed GEMM weights (Backend::PackGemmB, ModelOptions::pack_weights): on the CPU backend a bf16
// or fp32 B packed in both of a linear layer's layouts gives the products the plain B gives
// (reference: the same backend's GEMMs before packing, within float reassociation, and double
// sums), the packed copy is what the GEMMs read until it is forgotten, a bf16 or fp32 model with
// packed weights has the loss and the gradients of the same model without them (also after its
// weights change), and the plan counts the copies. These run oneDNN's bf16 kernels on every
// AVX-512 CPU (its emulation where the CPU has no bf16 arithmetic); there the backend itself widens
// bf16 to fp32 and packs nothing, which the Bf16WithoutBf16Arithmetic tests check against them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "core/half.h"
#include "model_test_util.h"
#include "models/layout.h"
#include "nn/linear.h"

namespace traind::engine {
namespace {

using testing::TestModel;

class OneDnnBf16Environment : public ::testing::Environment {
 public:
  void SetUp() override { native_ = std::make_unique<testing::ScopedBf16GemmNative>(true); }
  void TearDown() override { native_.reset(); }

 private:
  std::unique_ptr<testing::ScopedBf16GemmNative> native_;
};
const ::testing::Environment* const kOneDnnBf16 =
    ::testing::AddGlobalTestEnvironment(new OneDnnBf16Environment);

// Random values in [-1, 1) of `type` (bf16 or fp32), as raw bytes.
std::vector<char> RandomOf(DType type, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<char> v(static_cast<size_t>(n) * DTypeSize(type));
  for (int64_t i = 0; i < n; ++i) {
    const float x = u(rng);
    if (type == DType::kBF16) {
      reinterpret_cast<uint16_t*>(v.data())[i] = F32ToBF16(x);
    } else {
      reinterpret_cast<float*>(v.data())[i] = x;
    }
  }
  return v;
}

float ValueAt(DType type, const std::vector<char>& v, int64_t i) {
  return type == DType::kBF16 ? BF16ToF32(reinterpret_cast<const uint16_t*>(v.data())[i])
                              : reinterpret_cast<const float*>(v.data())[i];
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return worst / std::max(scale, 1e-30);
}

// The worst absolute differences from double sums of the same values: of fwd = x W^T (+ bias)
// (M x OC) and, when given, of dinp = dy W (M x C); x (M x C), w (OC x C), dy (M x OC) of `t`.
struct WorstDiffs {
  double fwd = 0, dinp = 0;
};
WorstDiffs AgainstDoubleSums(DType t, const std::vector<char>& x, const std::vector<char>& w,
                             const std::vector<char>& dy, const float* fwd, const float* dinp,
                             int64_t M, int64_t C, int64_t OC, const float* bias = nullptr) {
  WorstDiffs d;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias != nullptr ? bias[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) {
        s += double(ValueAt(t, x, m * C + c)) * ValueAt(t, w, o * C + c);
      }
      d.fwd = std::max(d.fwd, std::abs(s - fwd[m * OC + o]));
    }
    for (int64_t c = 0; c < C && dinp != nullptr; ++c) {
      double s = 0;
      for (int64_t o = 0; o < OC; ++o) {
        s += double(ValueAt(t, dy, m * OC + o)) * ValueAt(t, w, o * C + c);
      }
      d.dinp = std::max(d.dinp, std::abs(s - dinp[m * C + c]));
    }
  }
  return d;
}

// A linear layer W (OC x C) at sizes that are not multiples of the layouts' blocks (the copy is
// padded) and with whole blocks too: the forward with and without a bias (two CPU paths: oneDNN's
// matmul with the bias, and the GEMM) and the input gradient.
struct LinearProducts {
  std::vector<float> fwd_bias, fwd, dinp;
};

constexpr int64_t kM = 37, kC = 72, kOC = 100;

LinearProducts Products(Backend& be, DType t, const void* x, const void* w, const void* dy,
                        const float* bias) {
  LinearProducts r;
  r.fwd_bias.assign(kM * kOC, 0.0f);
  r.fwd.assign(kM * kOC, 0.0f);
  r.dinp.assign(kM * kC, 0.0f);
  be.LinearForward(r.fwd_bias.data(), nullptr, x, w, bias, kM, kC, kOC, t);
  be.Gemm(false, true, kM, kOC, kC, 1.0f, x, kC, w, kC, 0.0f, r.fwd.data(), kOC, t, DType::kF32);
  be.Gemm(false, false, kM, kC, kOC, 1.0f, dy, kOC, w, kC, 0.0f, r.dinp.data(), kC, t,
          DType::kF32);
  return r;
}

class PackedProductsTest : public ::testing::TestWithParam<DType> {};

TEST_P(PackedProductsTest, CpuProductsWithPackedWeightsEqualThePlainOnes) {
  const DType t = GetParam();
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const std::vector<char> x = RandomOf(t, kM * kC, 1), dy = RandomOf(t, kM * kOC, 2);
  std::vector<char> w = RandomOf(t, kOC * kC, 3);
  std::vector<float> bias(kOC);
  for (int64_t i = 0; i < kOC; ++i) bias[i] = 0.01f * static_cast<float>(i);
  const LinearProducts plain = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());

  const int64_t fwd_bytes = be->PackedGemmBBytes(kC, kOC, t);
  const int64_t bwd_bytes = be->PackedGemmBBytes(kOC, kC, t);
  // Within the planned bound (layout.h), which the model allocates.
  EXPECT_LE(fwd_bytes, PackedCopyBytes(kC, kOC, t));
  EXPECT_LE(bwd_bytes, PackedCopyBytes(kOC, kC, t));
  std::vector<char> fwd_copy(PackedCopyBytes(kC, kOC, t)), bwd_copy(PackedCopyBytes(kOC, kC, t));
  const bool packed =
      be->PackGemmB(fwd_copy.data(), static_cast<int64_t>(fwd_copy.size()), w.data(), true, kC,
                    kOC, kC, t) &&
      be->PackGemmB(bwd_copy.data(), static_cast<int64_t>(bwd_copy.size()), w.data(), false, kOC,
                    kC, kC, t);
  // The backend packs exactly when it says it has a layout (oneDNN with fast kernels).
  EXPECT_EQ(packed, fwd_bytes > 0 && bwd_bytes > 0);
  std::printf("%s packed: %d (forward copy %lld bytes, input-gradient copy %lld bytes)\n",
              DTypeName(t), packed ? 1 : 0, static_cast<long long>(fwd_bytes),
              static_cast<long long>(bwd_bytes));
  // A storage smaller than the layout is refused.
  if (fwd_bytes > 0) {
    EXPECT_FALSE(be->PackGemmB(fwd_copy.data(), fwd_bytes - 1, dy.data(), true, kC, kOC, kC, t));
  }

  const LinearProducts with = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());
  // Same kernels on a copied operand: equal within fp32 reassociation.
  EXPECT_LT(MaxRelDiff(with.fwd_bias, plain.fwd_bias), 1e-6);
  EXPECT_LT(MaxRelDiff(with.fwd, plain.fwd), 1e-6);
  EXPECT_LT(MaxRelDiff(with.dinp, plain.dinp), 1e-6);

  // The GEMMs read the copy: new values at w are not seen until the copy is forgotten (the
  // caller's contract), then they are.
  const std::vector<char> w2 = RandomOf(t, kOC * kC, 4);
  std::memcpy(w.data(), w2.data(), w2.size());
  const LinearProducts stale = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());
  if (packed) {
    EXPECT_LT(MaxRelDiff(stale.fwd, plain.fwd), 1e-6);
    EXPECT_LT(MaxRelDiff(stale.dinp, plain.dinp), 1e-6);
  }
  be->ForgetPackedGemmB(w.data(), w.data() + w.size());
  const LinearProducts fresh = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());
  EXPECT_GT(MaxRelDiff(fresh.fwd, plain.fwd), 1e-2);
  // The new weights' products, against double sums of the same values.
  EXPECT_LT(AgainstDoubleSums(t, x, w, dy, fresh.fwd.data(), nullptr, kM, kC, kOC).fwd, 1e-4);
}

// Whole blocks of both layouts (K and N multiples of 64), forward and input gradient, each
// against double sums: the packers' fast paths (the padded edges are above).
TEST_P(PackedProductsTest, WholeBlocksAgainstDoubleSums) {
  const DType t = GetParam();
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const int64_t M = 16, C = 128, OC = 192;
  const std::vector<char> x = RandomOf(t, M * C, 5), dy = RandomOf(t, M * OC, 6),
                          w = RandomOf(t, OC * C, 7);
  std::vector<char> fwd_copy(PackedCopyBytes(C, OC, t)), bwd_copy(PackedCopyBytes(OC, C, t));
  const bool packed =
      be->PackGemmB(fwd_copy.data(), static_cast<int64_t>(fwd_copy.size()), w.data(), true, C, OC,
                    C, t) &&
      be->PackGemmB(bwd_copy.data(), static_cast<int64_t>(bwd_copy.size()), w.data(), false, OC, C,
                    C, t);
  EXPECT_EQ(packed, be->PackedGemmBBytes(C, OC, t) > 0);
  std::vector<float> fwd(M * OC), dinp(M * C);
  be->Gemm(false, true, M, OC, C, 1.0f, x.data(), C, w.data(), C, 0.0f, fwd.data(), OC, t,
           DType::kF32);
  be->Gemm(false, false, M, C, OC, 1.0f, dy.data(), OC, w.data(), C, 0.0f, dinp.data(), C, t,
           DType::kF32);
  const WorstDiffs worst = AgainstDoubleSums(t, x, w, dy, fwd.data(), dinp.data(), M, C, OC);
  EXPECT_LT(worst.fwd, 1e-4);
  EXPECT_LT(worst.dinp, 1e-4);
  be->ForgetPackedGemmB(w.data(), w.data() + w.size());
}

// The weight gradient with the layer input packed for it (nn::GemmPrecision::pack): dW += dy^T x
// equals the plain product (within fp32 reassociation) and double sums; the packed copy is
// dropped right after, so a later GEMM on the same input buffer reads its new values; a room
// smaller than the layout is not used. Rows (K) and widths off and on the layout's blocks.
TEST(PackedWeightsTest, WeightGradientWithThePackedInputEqualsThePlainOne) {
  const DType t = DType::kBF16;  // the models pack inputs for bf16 weight gradients only
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  using Dims = std::tuple<int64_t, int64_t, int64_t>;  // N rows, C inputs, OC outputs
  for (const auto& [N, C, OC] : {Dims{37, 72, 100}, Dims{128, 128, 192}}) {
    std::vector<char> x = RandomOf(t, N * C, 8);
    const std::vector<char> dy = RandomOf(t, N * OC, 9);
    std::vector<float> start(OC * C);
    for (int64_t i = 0; i < OC * C; ++i) start[i] = 0.001f * static_cast<float>(i % 97);
    const int64_t need = be->PackedGemmBBytes(N, C, t);
    ASSERT_GT(need, 0) << "the cpu backend packs bf16 B";
    EXPECT_LE(need, PackedCopyBytes(N, C, t));
    std::vector<char> room(static_cast<size_t>(PackedCopyBytes(N, C, t)));
    nn::GemmPrecision plain_gp{t};
    nn::GemmPrecision packed_gp{t, nullptr, 0, room.data(), static_cast<int64_t>(room.size())};
    nn::GemmPrecision small_gp{t, nullptr, 0, room.data(), need - 1};
    std::vector<float> plain = start, packed = start, small = start;
    nn::LinearBackwardRounded(*be, nullptr, plain.data(), dy.data(), x.data(), nullptr, N, C, OC,
                              plain_gp);
    nn::LinearBackwardRounded(*be, nullptr, small.data(), dy.data(), x.data(), nullptr, N, C, OC,
                              small_gp);
    std::memset(room.data(), 0x7f, room.size());  // any stale contents are overwritten
    nn::LinearBackwardRounded(*be, nullptr, packed.data(), dy.data(), x.data(), nullptr, N, C, OC,
                              packed_gp);
    EXPECT_LT(MaxRelDiff(packed, plain), 1e-6) << N << "x" << C;
    EXPECT_LT(MaxRelDiff(small, plain), 1e-6) << N << "x" << C;
    double worst = 0;
    for (int64_t o = 0; o < OC; ++o) {
      for (int64_t c = 0; c < C; ++c) {
        double s = start[o * C + c];
        for (int64_t n = 0; n < N; ++n) {
          s += double(ValueAt(t, dy, n * OC + o)) * ValueAt(t, x, n * C + c);
        }
        worst = std::max(worst, std::abs(s - packed[o * C + c]));
      }
    }
    EXPECT_LT(worst, 1e-4) << N << "x" << C;
    // The next micro-batch's input in the same buffer: the product reads it, not the old copy.
    const std::vector<char> x2 = RandomOf(t, N * C, 10);
    std::memcpy(x.data(), x2.data(), x2.size());
    std::vector<float> again(OC * C, 0.0f);
    be->Gemm(true, false, OC, C, N, 1.0f, dy.data(), OC, x.data(), C, 0.0f, again.data(), C, t,
             DType::kF32);
    double worst2 = 0;
    for (int64_t o = 0; o < OC; ++o) {
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t n = 0; n < N; ++n) {
          s += double(ValueAt(t, dy, n * OC + o)) * ValueAt(t, x, n * C + c);
        }
        worst2 = std::max(worst2, std::abs(s - again[o * C + c]));
      }
    }
    EXPECT_LT(worst2, 1e-4) << "a packed copy of the old input outlived its product";
  }
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> grads;
};

// Forward + backward, then new master weights (ParamsChanged, as after an optimizer step) and
// forward + backward again: the losses and the last gradients. B sequences of 16 tokens; 3 of
// them: 48 rows, 3 logits chunks (fp32 packs the lm head only then); 128: 2048 rows, so bf16 also
// packs each layer input for its weight gradient (kMinPackedActivationRows), 4 chunks.
TrainRun TwoWeightVersions(const ModelConfig& c, DType type, bool pack, int64_t B = 3) {
  ModelOptions o = testing::TinyOptions(B, 16);
  o.compute_type = type;
  o.pack_weights = pack;
  o.logits_chunk_rows = B * 16 / (B == 3 ? 3 : 4);
  TestModel t = TestModel::Make(c, o);
  TrainRun r;
  if (t.model == nullptr) return r;
  t.model->InitRandom(7);
  testing::SetBatch(t, testing::MakeBatch(B * 16, c.vocab_size, 3));
  for (int version = 0; version < 2; ++version) {
    if (version == 1) {
      std::vector<float> p = testing::ToHost(*t.backend, t.model->param_data(), t.model->num_params());
      for (size_t i = 0; i < p.size(); ++i) p[i] *= 1.0f + 0.25f * std::sin(static_cast<float>(i));
      t.backend->CopyHostToDevice(t.model->param_data(), p.data(), p.size() * sizeof(float));
      // bf16 needs the call (its 16-bit copy); fp32 reads param_data() at every forward, told or
      // not (the optimizer and data parallel write it without telling the model).
      if (o.compute_type != DType::kF32) t.model->ParamsChanged();
    }
    t.model->ZeroGrad();
    r.losses.push_back(t.model->Forward(true, 1.0f));
    t.model->Backward();
  }
  r.grads = testing::ToHost(*t.backend, t.model->grad_data(), t.model->num_trainable());
  return r;
}

TEST_P(PackedProductsTest, ModelsWithPackedWeightsTrainAsWithout) {
  const DType t = GetParam();
  for (const ModelConfig& c : {testing::TinyGpt2(), testing::TinyLlama(false), testing::TinyLlama(true)}) {
    for (int64_t B : {3, 128}) {
      if (B == 128) {
        ModelOptions o = testing::TinyOptions(B, 16);
        o.compute_type = t;
        o.pack_weights = true;
        // bf16 at 2048 rows packs the inputs too; fp32 never does.
        EXPECT_EQ(PackedActivationBytes(MakeArchDims(c), o) > 0, t == DType::kBF16) << c.arch;
      }
      const TrainRun plain = TwoWeightVersions(c, t, false, B);
      const TrainRun packed = TwoWeightVersions(c, t, true, B);
      ASSERT_EQ(plain.losses.size(), 2u);
      ASSERT_EQ(packed.losses.size(), 2u);
      EXPECT_NE(plain.losses[0], plain.losses[1]);  // the weights did change
      for (int i = 0; i < 2; ++i) {
        EXPECT_NEAR(packed.losses[i], plain.losses[i], 1e-6 * std::abs(plain.losses[i]))
            << c.arch << " B " << B << " weights " << i;
      }
      EXPECT_LT(testing::RelErr(packed.grads, plain.grads), 1e-6) << c.arch << " B " << B;
    }
  }
}

// The plan, on the small gpt2 of the benches (d384, vocab 50304) as a hand count: bf16 both
// copies of every block's and the lm head's weight and the packed-input room; fp32 the lm head's
// forward copy when the logits run in chunks; fp16 nothing.
TEST(PackedWeightsTest, ThePlanCountsBothCopiesOfEveryPackedWeight) {
  const ModelConfig c = testing::SmallGpt2();
  ModelOptions o = testing::TinyOptions(8, 256);
  o.compute_type = DType::kBF16;
  const MemoryBytes plain = Model::PlanBytes(c, o);
  o.pack_weights = true;
  const MemoryBytes packed = Model::PlanBytes(c, o);
  // Per block: qkv 384 -> 1152, proj 384 -> 384, fc 384 -> 1536, fc2 1536 -> 384 (every
  // dimension already a multiple of the layout's blocks); the lm head 384 -> 50304; two copies
  // of two bytes each.
  const int64_t per_block = 384 * 1152 + 384 * 384 + 384 * 1536 + 1536 * 384;
  const int64_t hand = 2 * 2 * (6 * per_block + 384 * 50304);
  EXPECT_EQ(PackedWeightBytes(MakeArchDims(c), o), hand);
  EXPECT_EQ(packed.weights - plain.weights, hand);
  // And a temporary room for one layer input packed for its weight gradient: N = 8 * 256 rows
  // of the widest input (the MLP's 1536), two bytes each.
  const int64_t room = 2048 * 1536 * 2;
  EXPECT_EQ(PackedActivationBytes(MakeArchDims(c), o), room);
  EXPECT_EQ(packed.temporary - plain.temporary, room);
  EXPECT_EQ(packed.total() - plain.total(), hand + room);
  // LoRA (a frozen base: no weight-gradient GEMM) plans no room.
  ModelOptions lora = o;
  lora.lora.r = 4;
  EXPECT_EQ(PackedActivationBytes(MakeArchDims(c), lora), 0);
  // Below 2048 rows (4 x 256) no room: the weights' copies only.
  ModelOptions fewer = o;
  fewer.micro_batch = 4;
  EXPECT_EQ(PackedActivationBytes(MakeArchDims(c), fewer), 0);
  EXPECT_EQ(Model::PlanBytes(c, fewer).temporary, [&] {
    fewer.pack_weights = false;
    return Model::PlanBytes(c, fewer).temporary;
  }());
  // fp32: the lm head's forward copy only (4 chunks of 512 rows), four bytes each; none when
  // one chunk covers every row.
  o.compute_type = DType::kF32;
  const MemoryBytes packed32 = Model::PlanBytes(c, o);
  o.pack_weights = false;
  const MemoryBytes plain32 = Model::PlanBytes(c, o);
  EXPECT_EQ(packed32.total() - plain32.total(), 4 * 384 * 50304);
  o.logits_chunk_rows = 2048;
  const MemoryBytes one_chunk = Model::PlanBytes(c, o);
  o.pack_weights = true;
  EXPECT_EQ(Model::PlanBytes(c, o).total(), one_chunk.total());
  o.pack_weights = false;
  o.logits_chunk_rows = 0;
  // fp16 (the CPU has no fast f16 GEMM to pack for): nothing.
  o.compute_type = DType::kF16;
  const MemoryBytes plain16 = Model::PlanBytes(c, o);
  o.pack_weights = true;
  EXPECT_EQ(Model::PlanBytes(c, o).total(), plain16.total());
}

// Where the CPU has no bf16 arithmetic (cpu::Bf16GemmNative false: oneDNN would emulate it at a
// fifth of sgemm's rate), bf16 products widen to fp32 and run sgemm: the backend packs no bf16 B
// and the plan has no room for packed copies, and the products are the oneDNN kernels' (both sum
// the exact products of the same bf16 values in fp32: within reassociation) and double sums'.
TEST(Bf16WithoutBf16Arithmetic, ProductsWidenToFp32AndNothingIsPacked) {
  const DType t = DType::kBF16;
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const std::vector<char> x = RandomOf(t, kM * kC, 11), dy = RandomOf(t, kM * kOC, 12),
                          w = RandomOf(t, kOC * kC, 13);
  std::vector<float> bias(kOC);
  for (int64_t i = 0; i < kOC; ++i) bias[i] = 0.02f * static_cast<float>(i % 13) - 0.1f;
  const LinearProducts onednn = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());
  const ModelConfig small = testing::SmallGpt2();
  ModelOptions o = testing::TinyOptions(8, 256);
  o.compute_type = t;
  o.pack_weights = true;
  ASSERT_TRUE(CpuPacksGemmB(t)) << "oneDNN's bf16 kernels (forced by the environment)";
  EXPECT_GT(PackedWeightBytes(MakeArchDims(small), o), 0);

  testing::ScopedBf16GemmNative widen(false);
  EXPECT_FALSE(CpuPacksGemmB(t));
  EXPECT_TRUE(CpuPacksGemmB(DType::kF32)) << "fp32 still packs";
  EXPECT_EQ(be->PackedGemmBBytes(kC, kOC, t), 0);
  std::vector<char> room(static_cast<size_t>(PackedCopyBytes(kC, kOC, t)));
  EXPECT_FALSE(be->PackGemmB(room.data(), static_cast<int64_t>(room.size()), w.data(), true, kC,
                             kOC, kC, t));
  EXPECT_EQ(PackedWeightBytes(MakeArchDims(small), o), 0);
  EXPECT_EQ(PackedActivationBytes(MakeArchDims(small), o), 0);
  ModelOptions plain = o;
  plain.pack_weights = false;
  EXPECT_EQ(Model::PlanBytes(small, o).total(), Model::PlanBytes(small, plain).total());

  const LinearProducts widened = Products(*be, t, x.data(), w.data(), dy.data(), bias.data());
  EXPECT_LT(MaxRelDiff(widened.fwd_bias, onednn.fwd_bias), 1e-6);
  EXPECT_LT(MaxRelDiff(widened.fwd, onednn.fwd), 1e-6);
  EXPECT_LT(MaxRelDiff(widened.dinp, onednn.dinp), 1e-6);
  const WorstDiffs worst = AgainstDoubleSums(t, x, w, dy, widened.fwd.data(),
                                             widened.dinp.data(), kM, kC, kOC);
  EXPECT_LT(worst.fwd, 1e-4);
  EXPECT_LT(worst.dinp, 1e-4);
  EXPECT_LT(AgainstDoubleSums(t, x, w, dy, widened.fwd_bias.data(), nullptr, kM, kC, kOC,
                              bias.data()).fwd, 1e-4);
}

// A bf16 model trains the same through either route: gpt2 and llama, the two weight versions of
// TwoWeightVersions, at 48 and 2048 rows (where oneDNN's route also packs each layer input). The
// GEMMs differ only in their fp32 summation order, but a bf16 model rounds every activation to
// bf16, and a last-bit difference that moves one across a rounding boundary changes it by 2^-8
// of itself: hence looser bounds than the 1e-6 of packed against plain (same kernels). Measured
// on a Cascade Lake VM: losses equal to 7 digits, gradients within 4e-8..1.3e-5 relative.
TEST(Bf16WithoutBf16Arithmetic, ModelsTrainAsWithOneDnnBf16) {
  for (const ModelConfig& c : {testing::TinyGpt2(), testing::TinyLlama(false)}) {
    for (int64_t B : {3, 128}) {
      const TrainRun onednn = TwoWeightVersions(c, DType::kBF16, true, B);
      TrainRun widened;
      {
        testing::ScopedBf16GemmNative widen(false);
        widened = TwoWeightVersions(c, DType::kBF16, true, B);
      }
      ASSERT_EQ(onednn.losses.size(), 2u);
      ASSERT_EQ(widened.losses.size(), 2u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_NEAR(widened.losses[i], onednn.losses[i], 1e-5 * std::abs(onednn.losses[i]))
            << c.arch << " B " << B << " weights " << i;
      }
      EXPECT_LT(testing::RelErr(widened.grads, onednn.grads), 1e-4) << c.arch << " B " << B;
      std::printf("%s B %lld: losses %.7f / %.7f against %.7f / %.7f, gradients rel. err %.2e\n",
                  ArchName(c.arch), static_cast<long long>(B), widened.losses[0], widened.losses[1],
                  onednn.losses[0], onednn.losses[1], testing::RelErr(widened.grads, onednn.grads));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PackedProductsTest, ::testing::Values(DType::kBF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

}  // namespace
}  // namespace traind::engine
