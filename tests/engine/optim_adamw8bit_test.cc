// 8-bit AdamW and its block-wise quantization: (1) the code tables are bitsandbytes' (regenerated
// by reference/quant8_reference.py in torch, bit for bit); (2) quantize/dequantize: every element
// is the nearest code (or, for the signed map, the nearest code of its sign) and its error is
// within half the local code spacing, per block; (3) state bytes per parameter <= 2.1 on a GPT-2
// shaped parameter list of ~7M parameters (PlanBytes = arena bytes); (4) 200 AdamW steps on a
// noisy least-squares problem: the 8-bit loss stays within 2% of fp32 AdamW's; (5) state round
// trip; (6) a padded vocabulary table steps bit-identically to the unpadded tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "backend/arena.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/step_scalars.h"
#include "optim/adamw.h"
#include "optim/adamw_8bit.h"
#include "optim/quant8.h"
#include "optim_test_util.h"

namespace traind::engine {
namespace {

TEST(Quant8, CodeTablesAreBitsandbytes) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  std::string out;
  ASSERT_EQ(testing::RunPython("quant8_reference.py", "", &out), 0) << out;
  std::istringstream lines(out);
  const float* tables[2] = {DynamicCodeSigned(), DynamicCodeUnsigned()};
  for (int t = 0; t < 2; ++t) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::istringstream vals(line);
    std::string hex;
    int i = 0;
    for (; vals >> hex; ++i) {
      ASSERT_LT(i, 256);
      EXPECT_EQ(tables[t][i], static_cast<float>(std::strtod(hex.c_str(), nullptr)))
          << (t == 0 ? "signed" : "unsigned") << " code " << i;
    }
    EXPECT_EQ(i, 256);
  }
  EXPECT_EQ(DynamicCodeSigned()[127], 0.0f);
  EXPECT_EQ(DynamicCodeSigned()[255], 1.0f);
  EXPECT_EQ(DynamicCodeUnsigned()[0], 0.0f);
  for (int i = 1; i < 256; ++i) {
    EXPECT_LT(DynamicCodeSigned()[i - 1], DynamicCodeSigned()[i]);
    EXPECT_LT(DynamicCodeUnsigned()[i - 1], DynamicCodeUnsigned()[i]);
  }
}

// Per block: absmax is the block's max |x|; each code is the nearest one to x/absmax (ties and
// the sign rule aside), so |dequant - x| <= absmax * half the spacing of the two codes around
// x/absmax (a full spacing for the sign rule, which only applies next to 0).
TEST(Quant8, BlockwiseErrorWithinHalfCodeSpacing) {
  const int64_t n = 3 * kQuant8Block + 77;  // ragged last block
  for (int dist = 0; dist < 4; ++dist) {
    for (int is_signed = 0; is_signed < 2; ++is_signed) {
      std::vector<float> x = testing::RandomVector(n, 11 + dist, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        if (dist == 1) v = v * v * v * 1e-3f;                                    // heavy tails
        if (dist == 2) v = std::exp(6.0f * v) * (v < 0 ? -1.0f : 1.0f) * 1e-4f;  // log-normal
        if (dist == 3 && (i / kQuant8Block) == 1) v = 0.0f;  // an all-zero block
        x[i] = is_signed ? v : v * v;
      }
      std::vector<uint8_t> codes(n);
      std::vector<float> absmax(Quant8Blocks(n)), back(n);
      QuantizeBlockwise(x.data(), n, is_signed != 0, codes.data(), absmax.data());
      DequantizeBlockwise(codes.data(), absmax.data(), n, is_signed != 0, back.data());
      const float* code = is_signed ? DynamicCodeSigned() : DynamicCodeUnsigned();
      double worst_ratio = 0.0;  // error / allowed
      for (int64_t b = 0; b < Quant8Blocks(n); ++b) {
        const int64_t lo = b * kQuant8Block, hi = std::min(n, lo + kQuant8Block);
        float mx = 0.0f;
        for (int64_t i = lo; i < hi; ++i) mx = std::max(mx, std::fabs(x[i]));
        ASSERT_EQ(absmax[b], mx) << "block " << b;
        for (int64_t i = lo; i < hi; ++i) {
          if (mx == 0.0f) {
            EXPECT_EQ(back[i], 0.0f);
            continue;
          }
          const float y = x[i] / mx;
          const int up = static_cast<int>(std::lower_bound(code, code + 256, y) - code);
          const int hi_c = std::min(up, 255), lo_c = std::max(up - 1, 0);
          const double gap = static_cast<double>(code[hi_c]) - code[lo_c];
          const bool near_zero = is_signed && code[lo_c] <= 0.0f && code[hi_c] >= 0.0f;
          // Below the lowest signed code (-0.99297; -1 itself is not in the map) the nearest is
          // code 0.
          const double allowed =
              mx * (up == 0 ? double(code[0]) - y : (near_zero ? gap : 0.5 * gap)) * (1 + 1e-5) +
              1e-30;
          const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
          ASSERT_LE(err, allowed) << "block " << b << " element " << i << " x " << x[i];
          worst_ratio = std::max(worst_ratio, err / allowed);
          // Nearest code (ties to either neighbour), except the sign rule next to 0.
          if (!near_zero) {
            double best = INFINITY;
            for (int c = 0; c < 256; ++c) best = std::min(best, std::fabs(double(code[c]) - y));
            EXPECT_LE(std::fabs(double(code[codes[i]]) - y), best * (1 + 1e-6) + 1e-12) << i;
          }
        }
      }
      std::printf("[quant8] dist %d %s: worst error / bound %.3f\n", dist,
                  is_signed ? "signed" : "unsigned", worst_ratio);
    }
  }
}

// The CPU update's table-driven nearest-code search gives QuantizeToCode's codes: on every code,
// every midpoint between neighbours and the floats next to them, and 2M random values per map.
TEST(Quant8, FastSearchMatchesBinarySearch) {
  for (int is_signed = 0; is_signed < 2; ++is_signed) {
    const float* code = is_signed ? DynamicCodeSigned() : DynamicCodeUnsigned();
    std::vector<float> x;
    for (int c = 0; c < 256; ++c) {
      std::vector<float> centres = {code[c]};
      if (c > 0) centres.push_back((code[c - 1] + code[c]) * 0.5f);
      for (float v : centres) {
        float lo = v, hi = v;
        for (int k = 0; k < 4; ++k) {
          x.push_back(lo);
          x.push_back(hi);
          lo = std::nextafter(lo, -2.0f);
          hi = std::nextafter(hi, 2.0f);
        }
      }
    }
    for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, 1e-45f, -1e-45f}) x.push_back(v);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(is_signed ? -1.0f : 0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-40.0f, 0.0f);
    for (int i = 0; i < 1000000; ++i) {
      x.push_back(u(rng));
      const float m = std::pow(10.0f, e(rng));  // every decade of the dynamic map
      x.push_back(is_signed && (i & 1) ? -m : m);
    }
    std::vector<uint8_t> fast(x.size());
    cpu::QuantizeCodes(code, is_signed != 0, x.data(), static_cast<int64_t>(x.size()), fast.data());
    int64_t mismatches = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (fast[i] != QuantizeToCode(code, x[i], is_signed != 0)) {
        if (++mismatches < 10) ADD_FAILURE() << "x " << x[i] << " signed " << is_signed;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// A GPT-2-shaped list (6 layers, d256, vocab 8192, 1024 positions): ~7.1M parameters.
std::vector<ParamInfo> Gpt2Shaped(int64_t* n) {
  std::vector<std::vector<int64_t>> shapes = {{8192, 256}, {1024, 256}};
  for (int l = 0; l < 6; ++l) {
    for (auto s : std::vector<std::vector<int64_t>>{{256},
                                                    {256},
                                                    {768, 256},
                                                    {768},
                                                    {256, 256},
                                                    {256},
                                                    {256},
                                                    {256},
                                                    {1024, 256},
                                                    {1024},
                                                    {256, 1024},
                                                    {256}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({256});
  shapes.push_back({256});
  return testing::MakeParams(shapes, n);
}

TEST(AdamW8bit, StateBytesPerParameter) {
  int64_t n = 0;
  std::vector<ParamInfo> params = Gpt2Shaped(&n);
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  AdamW8bitOptions o;
  auto opt = AdamW8bitOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  const int64_t bytes = arena.used_by_category().optimizer;
  EXPECT_EQ(bytes, AdamW8bitOptimizer::PlanBytes(params, o));
  const double per = static_cast<double>(bytes) / static_cast<double>(n);
  std::printf(
      "[adamw8bit] %lld parameters, %lld state bytes: %.4f bytes/parameter (fp32 AdamW: 8)\n",
      static_cast<long long>(n), static_cast<long long>(bytes), per);
  EXPECT_LE(per, 2.1);
  EXPECT_GT(n, 5000000);
}

// Least squares: X (N, K) W^T (K -> M) + b ~ Y with noise; W is (M, K) (8-bit state), b is (M)
// (fp32 state). Gradients of the mean squared error computed here in double.
struct LeastSquares {
  static constexpr int64_t N = 512, K = 128, M = 48;
  std::vector<float> X, Y;
  LeastSquares() {
    X = testing::RandomVector(N * K, 5, 1.0f);
    std::vector<float> Wt = testing::RandomVector(M * K, 6, 0.3f),
                       noise = testing::RandomVector(N * M, 8, 0.3f);
    Y.resize(N * M);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < M; ++j) {
        double s = 0.5 + noise[i * M + j];
        for (int64_t k = 0; k < K; ++k) s += double(X[i * K + k]) * Wt[j * K + k];
        Y[i * M + j] = static_cast<float>(s);
      }
  }
  // Returns the loss at p = [W (M*K) | b (M)] and writes its gradient.
  double LossAndGrad(const std::vector<float>& p, std::vector<float>* g) const {
    g->assign(p.size(), 0.0f);
    std::vector<double> gw(M * K, 0.0), gb(M, 0.0);
    double loss = 0.0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < M; ++j) {
        double r = p[M * K + j] - Y[i * M + j];
        for (int64_t k = 0; k < K; ++k) r += double(X[i * K + k]) * p[j * K + k];
        loss += r * r;
        const double d = 2.0 * r / (N * M);
        gb[j] += d;
        for (int64_t k = 0; k < K; ++k) gw[j * K + k] += d * X[i * K + k];
      }
    for (int64_t i = 0; i < M * K; ++i) (*g)[i] = static_cast<float>(gw[i]);
    for (int64_t j = 0; j < M; ++j) (*g)[M * K + j] = static_cast<float>(gb[j]);
    return loss / (N * M);
  }
};

TEST(AdamW8bit, LeastSquaresTracksFp32AdamW) {
  LeastSquares ls;
  int64_t n = 0;
  std::vector<ParamInfo> params =
      testing::MakeParams({{LeastSquares::M, LeastSquares::K}, {LeastSquares::M}}, &n);
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DeviceArena arena(backend.get(), 0);
  AdamWOptions o32;
  o32.weight_decay = 0.01;
  AdamW8bitOptions o8;
  o8.weight_decay = 0.01;
  auto opt32 = AdamWOptimizer::Create(params, n, o32, &arena);
  auto opt8 = AdamW8bitOptimizer::Create(params, n, o8, &arena);
  ASSERT_TRUE(opt32.ok() && opt8.ok());
  std::vector<float> p32(n, 0.0f), p8(n, 0.0f), g;
  const double lr = 2e-2;
  double first = 0.0, l32 = 0.0, l8 = 0.0;
  for (int s = 0; s < 200; ++s) {
    l32 = ls.LossAndGrad(p32, &g);
    if (s == 0) first = l32;
    (*opt32)->Step(p32.data(), g.data(), lr, 1.0f);
    l8 = ls.LossAndGrad(p8, &g);
    (*opt8)->Step(p8.data(), g.data(), lr, 1.0f);
  }
  l32 = ls.LossAndGrad(p32, &g);
  l8 = ls.LossAndGrad(p8, &g);
  std::printf(
      "[adamw8bit] least squares, 200 steps: loss %.5f -> fp32 AdamW %.5f, 8-bit %.5f "
      "(%+.3f%%)\n",
      first, l32, l8, 100.0 * (l8 - l32) / l32);
  EXPECT_LT(l32, 0.2 * first);  // it did optimise
  EXPECT_LE(std::fabs(l8 - l32), 0.02 * l32);
}

// The StepRunner's device-scalar protocol gives Step's result (8-bit and fp32-state tensors; CPU
// backend: device memory is host memory), and an overflowed fp16 step changes nothing.
// Issue 41 item 8: a padded vocabulary table (Vp rows laid out, V in HF; ParamInfo LiveShape)
// steps exactly as the unpadded tensor HF has: bitsandbytes' 8-bit-or-fp32 rule counts the V
// rows (61 x 64 = 3904 < min_8bit_size 4096 <= 64 x 64: fp32 moments, as bitsandbytes keeps for
// HF's tensor), and a quantized table's padded zeros share its last real block without changing
// the block's absmax. 20 steps: the real elements bit-identical to a run on the unpadded layout,
// the padding 0 (weights and moments).
TEST(AdamW8bit, PaddedVocabularyStepsAsTheUnpaddedTensor) {
  std::vector<ParamInfo> padded(3), plain(3);
  // {name, shape, hf_shape, offset, numel, decay}
  padded[0] = {"wte", {64, 64}, {61, 64}, 0, 4096, true};            // the 8-bit rule's edge
  padded[1] = {"lm_head", {320, 32}, {300, 32}, 4096, 10240, true};  // 8-bit, a mixed block
  padded[2] = {"bias", {64}, {61}, 14336, 64, false};
  int64_t off = 0;
  for (size_t i = 0; i < padded.size(); ++i) {
    plain[i] = padded[i];
    plain[i].shape = padded[i].hf_shape;
    plain[i].numel = testing::HfNumel(padded[i]);
    plain[i].offset = off;
    off += plain[i].numel;
  }
  const int64_t n_padded = 14400, n_plain = off;
  // Padded layout -> plain layout (the real elements).
  auto real = [&](const std::vector<float>& v) {
    std::vector<float> out(static_cast<size_t>(n_plain));
    for (size_t i = 0; i < padded.size(); ++i) {
      std::copy(v.begin() + padded[i].offset, v.begin() + padded[i].offset + plain[i].numel,
                out.begin() + plain[i].offset);
    }
    return out;
  };
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DeviceArena arena(backend.get(), 0);
  AdamW8bitOptions o;
  o.weight_decay = 0.01;
  auto a = AdamW8bitOptimizer::Create(padded, n_padded, o, &arena);
  auto b = AdamW8bitOptimizer::Create(plain, n_plain, o, &arena);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(AdamW8bitOptimizer::PlanBytes(padded, o),
            AdamW8bitOptimizer::PlanBytes(plain, o) + 3 * 64 * 8 + 20 * 32 * 2 + 2 * 2 * 4 + 3 * 8)
      << "the padding's state: wte's 3 rows of fp32 moments, lm_head's 20 rows of codes and 2 "
         "more blocks' absmax pairs (40 blocks, 38), the bias's 3 fp32 moments";
  std::vector<float> pa = testing::ZeroPadding(testing::RandomVector(n_padded, 41, 0.2f), padded);
  std::vector<float> pb = real(pa);
  for (int step = 0; step < 20; ++step) {
    const std::vector<float> g =
        testing::ZeroPadding(testing::RandomVector(n_padded, 500 + step, 1.0f, 0.05f), padded);
    (*a)->Step(pa.data(), g.data(), 1e-2, 0.5f);
    (*b)->Step(pb.data(), real(g).data(), 1e-2, 0.5f);
  }
  EXPECT_EQ(real(pa), pb) << "the real elements differ from the unpadded run";
  EXPECT_EQ(testing::ZeroPadding(pa, padded), pa) << "the padding moved";
  const SafetensorsFile sa = (*a)->SaveState(), sb = (*b)->SaveState();
  EXPECT_EQ(sa.tensors.at("wte.exp_avg").dtype, "F32") << "3904 live elements: fp32 moments";
  EXPECT_EQ(sa.tensors.at("lm_head.exp_avg").dtype, "U8");
  for (const char* name : {"wte.exp_avg", "wte.exp_avg_sq", "bias.exp_avg_sq"}) {
    const std::vector<float> v = sa.tensors.at(name).ToF32().value();
    const int64_t live = sb.tensors.at(name).numel();
    for (size_t i = static_cast<size_t>(live); i < v.size(); ++i) {
      ASSERT_EQ(v[i], 0.0f) << name << " element " << i;
    }
  }
  // lm_head's padded codes decode to 0: the signed map's 0 (code 127) and the unsigned one's (0).
  const std::vector<uint8_t>& m = sa.tensors.at("lm_head.exp_avg").data;
  const std::vector<uint8_t>& v = sa.tensors.at("lm_head.exp_avg_sq").data;
  for (size_t i = 300 * 32; i < m.size(); ++i) {
    ASSERT_EQ(DynamicCodeSigned()[m[i]], 0.0f) << "lm_head.exp_avg element " << i;
    ASSERT_EQ(DynamicCodeUnsigned()[v[i]], 0.0f) << "lm_head.exp_avg_sq element " << i;
  }
}

TEST(AdamW8bit, IssueStepFromScalarsMatchesStep) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DeviceArena arena(backend.get(), 0);
  int64_t n = 0;
  std::vector<ParamInfo> params = testing::MakeParams({{64, 80}, {80}}, &n);
  AdamW8bitOptions o;
  o.weight_decay = 0.1;
  auto a = AdamW8bitOptimizer::Create(params, n, o, &arena);
  auto b = AdamW8bitOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(a.ok() && b.ok());
  testing::ExpectIssueStepMatchesStep(a->get(), b->get(), n);
  EXPECT_EQ((*a)->SaveState().tensors["p0.exp_avg"].data,
            (*b)->SaveState().tensors["p0.exp_avg"].data);
}

TEST(AdamW8bit, StateRoundTripAndNonFiniteGradient) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  int64_t n = 0;
  std::vector<ParamInfo> params = testing::MakeParams({{40, 110}, {30}}, &n);  // 4400: 8-bit
  AdamW8bitOptions o;
  o.weight_decay = 0.1;
  auto opt = AdamW8bitOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = testing::RandomVector(n, 3, 1.0f), g = testing::RandomVector(n, 4, 1.0f);
  (*opt)->Step(p.data(), g.data(), 1e-2, 1.0f);
  SafetensorsFile st = (*opt)->SaveState();
  EXPECT_EQ(st.metadata["format"], "traind-adamw8bit-v1");
  EXPECT_EQ(st.tensors["p0.exp_avg"].dtype, "U8");
  EXPECT_EQ(st.tensors["p0.exp_avg_sq_absmax"].shape, (std::vector<int64_t>{18}));
  EXPECT_EQ(st.tensors["p1.exp_avg"].dtype, "F32");
  auto opt2 = AdamW8bitOptimizer::Create(params, n, o, &arena);
  ASSERT_TRUE((*opt2)->LoadState(st).ok());
  std::vector<float> p2 = p;
  g[5] = NAN;  // element 5 keeps its value; the others update
  const float before = p[5];
  (*opt)->Step(p.data(), g.data(), 1e-2, 1.0f);
  (*opt2)->Step(p2.data(), g.data(), 1e-2, 1.0f);
  EXPECT_EQ(p, p2);
  EXPECT_EQ(p[5], before);
  st.tensors.erase("p0.exp_avg_absmax");
  Status bad = (*opt2)->LoadState(st);
  EXPECT_EQ(bad.code(), Status::Code::kDataLoss);
  EXPECT_NE(bad.message().find("p0.exp_avg_absmax"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine
