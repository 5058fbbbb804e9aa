// The optimizer update kernels (cuda/optim_*.cu, launchers in cuda/optim_kernels.h) run on the
// device under test (the simt emulator here) against the CPU kernels of cpu_optim.h on the same
// random inputs, ragged sizes included. Tolerances: parameters and fp32 state within 1e-6 of the
// tensor's scale (max |diff| / max |cpu|; the two compilers may contract to FMAs differently),
// Adafactor's double sums within 1e-9 relative; 8-bit codes equal except where the fp32 value
// sits within rounding of a code midpoint (at most 1 code apart, on <= 0.2% of elements). And the
// optimizer classes run on the device under test against the same classes on the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/cuda/optim_kernels.h"
#include "backend/step_scalars.h"
#include "device_under_test.h"
#include "optim/adafactor.h"
#include "optim/adamw_8bit.h"
#include "optim/quant8.h"
#include "optim/sgd.h"

namespace traind::engine {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = offset + scale * d(rng);
  return v;
}

// A device copy of a host vector that can be read back.
template <typename T>
class Dev {
 public:
  Dev(Backend* be, const std::vector<T>& v) : be_(be), n_(v.size()), p_(be->Alloc(Bytes())) {
    be_->CopyHostToDevice(p_, v.data(), Bytes());
  }
  ~Dev() { be_->Free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* p() { return static_cast<T*>(p_); }
  std::vector<T> get() {
    std::vector<T> v(n_);
    be_->Synchronize();
    be_->CopyDeviceToHost(v.data(), p_, Bytes());
    return v;
  }

 private:
  size_t Bytes() const { return std::max<size_t>(n_ * sizeof(T), 1); }
  Backend* be_;
  size_t n_;
  void* p_;
};

// The double sums of squares: simt runs the CPU's order of float terms (1e-9); on a GPU nvcc
// contracts the float products into FMAs and the blocks add in another order, so each float term
// may differ by an ulp (seen: 1.5e-8 relative on an H100), hence 1e-6 there.
#if defined(TRAIND_TEST_ON_CUDA)
constexpr double kSumTolerance = 1e-6;
#else
constexpr double kSumTolerance = 1e-9;
#endif

double ScaledDiff(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

class SimtOptim : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = testing::MakeDeviceUnderTest();
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    backend_ = std::move(*be);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(SimtOptim, SgdUpdate) {
  for (int64_t n : {1, 255, 1000, 70001}) {
    for (int cfg = 0; cfg < 4; ++cfg) {
      const float momentum = cfg == 0 ? 0.0f : 0.9f, damp = cfg == 2 ? 0.1f : 0.0f;
      const bool nesterov = cfg == 3, wd_on = cfg != 1;
      std::vector<float> p = Random(n, 1 + n), g = Random(n, 2 + n), buf = Random(n, 3 + n);
      std::vector<float> cp = p, cbuf = buf;
      Dev<float> dp(backend_.get(), p), dg(backend_.get(), g), db(backend_.get(), buf);
      for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE(gpu::SgdUpdate(dp.p(), dg.p(), db.p(), n, 0.05f, momentum, damp,
                                   wd_on ? 0.01f : 0.0f, nesterov, step == 0, 0.5f, nullptr,
                                   nullptr)
                        .ok());
        cpu::SgdUpdate(cp.data(), g.data(), cbuf.data(), n, 0.05f, momentum, damp,
                       wd_on ? 0.01f : 0.0f, nesterov, step == 0, 0.5f, nullptr, 2);
      }
      EXPECT_LE(ScaledDiff(dp.get(), cp), 1e-6) << "n " << n << " cfg " << cfg;
      if (momentum != 0.0f) {
        EXPECT_LE(ScaledDiff(db.get(), cbuf), 1e-6) << "n " << n << " cfg " << cfg;
      }
    }
  }
}

TEST_F(SimtOptim, AdafactorPhases) {
  struct Shape {
    int64_t B, R, C;
    bool factored;
  };
  for (Shape s : {Shape{1, 7, 13, true}, Shape{3, 5, 33, true}, Shape{1, 300, 257, true},
                  Shape{1, 1, 1001, false}, Shape{1, 1, 1, false}}) {
    const int64_t n = s.B * s.R * s.C;
    for (int with_m = 0; with_m < 2; ++with_m) {
      std::vector<float> p = Random(n, 10 + n, 0.3f), g = Random(n, 11 + n, 0.5f, 0.01f);
      std::vector<float> m = Random(n, 12 + n, 0.01f);
      std::vector<float> row = Random(s.B * s.R, 13, 0.0f, 0.2f),
                         col = Random(s.B * s.C, 14, 0.0f, 0.3f);
      std::vector<float> v = Random(n, 15, 0.0f, 0.25f);
      std::vector<double> cpu_scr(2 + s.B, 0.0), zero(2 + s.B, 0.0);
      std::vector<float> cp = p, cm = m, crow = row, ccol = col, cv = v;
      Dev<float> dp(backend_.get(), p), dg(backend_.get(), g), dm(backend_.get(), m),
          drow(backend_.get(), row), dcol(backend_.get(), col), dv(backend_.get(), v);
      Dev<double> dscr(backend_.get(), zero);
      float* mptr = with_m ? dm.p() : nullptr;
      const float beta2t = 0.3f, eps1 = 1e-30f, gs = 0.75f;
      // sum p^2 into scratch[0] on both sides (Backend::AccumulateSumSquares on the device).
      for (int64_t i = 0; i < n; ++i) cpu_scr[0] += double(p[i]) * p[i];
      backend_->AccumulateSumSquares(dscr.p(), dp.p(), n);
      if (s.factored) {
        ASSERT_TRUE(gpu::AdafactorFactoredStats(dg.p(), drow.p(), dcol.p(), dscr.p() + 2, s.B, s.R,
                                                s.C, beta2t, eps1, gs, nullptr)
                        .ok());
        cpu::AdafactorFactoredStats(g.data(), crow.data(), ccol.data(), cpu_scr.data() + 2, s.B,
                                    s.R, s.C, beta2t, eps1, gs, 2);
      } else {
        ASSERT_TRUE(gpu::AdafactorSecondMoment(dg.p(), dv.p(), n, beta2t, eps1, gs, nullptr).ok());
        cpu::AdafactorSecondMoment(g.data(), cv.data(), n, beta2t, eps1, gs, 2);
      }
      const float* grow = s.factored ? drow.p() : nullptr;
      const float* gcol = s.factored ? dcol.p() : nullptr;
      const float* gv = s.factored ? nullptr : dv.p();
      ASSERT_TRUE(gpu::AdafactorUpdateSumSquares(dscr.p() + 1, dg.p(), grow, gcol, dscr.p() + 2, gv,
                                                 s.B, s.R, s.C, gs, nullptr)
                      .ok());
      cpu::AdafactorUpdateSumSquares(cpu_scr.data() + 1, g.data(), crow.data(), ccol.data(),
                                     cpu_scr.data() + 2, s.factored ? nullptr : cv.data(), s.B, s.R,
                                     s.C, gs, 2);
      ASSERT_TRUE(gpu::AdafactorApply(dp.p(), mptr, dg.p(), grow, gcol, dscr.p() + 2, gv, dscr.p(),
                                      s.B, s.R, s.C, gs, 1e-2f, 1e-3f, true, 1.0f, 0.9f, 0.1f,
                                      nullptr)
                      .ok());
      cpu::AdafactorApply(cp.data(), with_m ? cm.data() : nullptr, g.data(), crow.data(),
                          ccol.data(), cpu_scr.data() + 2, s.factored ? nullptr : cv.data(),
                          cpu_scr.data(), s.B, s.R, s.C, gs, 1e-2f, 1e-3f, true, 1.0f, 0.9f, 0.1f,
                          2);
      const std::string where = "shape (" + std::to_string(s.B) + "," + std::to_string(s.R) + "," +
                                std::to_string(s.C) + ") m " + std::to_string(with_m);
      const std::vector<double> scr = dscr.get();
      for (int k = 0; k < 2 + (s.factored ? s.B : 0); ++k) {
        EXPECT_NEAR(scr[k], cpu_scr[k], kSumTolerance * std::fabs(cpu_scr[k]))
            << where << " sum " << k;
      }
      if (s.factored) {
        EXPECT_LE(ScaledDiff(drow.get(), crow), 1e-6) << where;
        EXPECT_LE(ScaledDiff(dcol.get(), ccol), 1e-6) << where;
      } else {
        EXPECT_LE(ScaledDiff(dv.get(), cv), 1e-6) << where;
      }
      // The parameters moved by the update (not a comparison of unchanged values).
      EXPECT_GT(ScaledDiff(cp, p), 1e-4) << where;
      EXPECT_LE(ScaledDiff(dp.get(), cp), 1e-6) << where;
      if (with_m) {
        EXPECT_LE(ScaledDiff(dm.get(), cm), 1e-6) << where;
      }
    }
  }
}

TEST_F(SimtOptim, AdamW8bitBlockwise) {
  const std::vector<float> table_m(DynamicCodeSigned(), DynamicCodeSigned() + 256);
  const std::vector<float> table_v(DynamicCodeUnsigned(), DynamicCodeUnsigned() + 256);
  Dev<float> dtm(backend_.get(), table_m), dtv(backend_.get(), table_v);
  for (int64_t n : {1, 256, 4097, 70000}) {
    const int64_t blocks = Quant8Blocks(n);
    std::vector<float> p = Random(n, 20 + n), g = Random(n, 21 + n, 0.1f);
    if (n > 100) g[37] = NAN;  // a non-finite gradient: m = v = 0, p unchanged
    // A state after one quantization of plausible moments.
    std::vector<float> m0 = Random(n, 22, 0.01f), v0 = Random(n, 23, 0.001f);
    for (float& x : v0) x = x * x;
    std::vector<uint8_t> mc(n), vc(n);
    std::vector<float> ma(blocks), va(blocks);
    QuantizeBlockwise(m0.data(), n, true, mc.data(), ma.data());
    QuantizeBlockwise(v0.data(), n, false, vc.data(), va.data());
    std::vector<float> cp = p, cma = ma, cva = va;
    std::vector<uint8_t> cmc = mc, cvc = vc;
    Dev<float> dp(backend_.get(), p), dg(backend_.get(), g), dma(backend_.get(), ma),
        dva(backend_.get(), va);
    Dev<uint8_t> dmc(backend_.get(), mc), dvc(backend_.get(), vc);
    for (int step = 1; step <= 3; ++step) {
      const float bc1 = 1.0f - std::pow(0.9f, float(step)),
                  bc2 = 1.0f - std::pow(0.999f, float(step));
      ASSERT_TRUE(gpu::AdamW8bitBlockwise(dp.p(), dg.p(), dmc.p(), dvc.p(), dma.p(), dva.p(),
                                          dtm.p(), dtv.p(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f,
                                          bc1, bc2, 1.0f, nullptr, nullptr)
                      .ok());
      cpu::AdamW8bitBlockwise(cp.data(), g.data(), cmc.data(), cvc.data(), cma.data(), cva.data(),
                              table_m.data(), table_v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f,
                              bc1, bc2, 1.0f, nullptr, 2);
    }
    const std::vector<float> gp = dp.get();
    EXPECT_LE(ScaledDiff(gp, cp), 1e-6) << "n " << n;
    if (n > 100) {
      EXPECT_EQ(gp[37], p[37]);
    }
    EXPECT_LE(ScaledDiff(dma.get(), cma), 1e-6) << "n " << n;
    EXPECT_LE(ScaledDiff(dva.get(), cva), 1e-6) << "n " << n;
    const std::vector<uint8_t> gmc = dmc.get(), gvc = dvc.get();
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LE(std::abs(int(gmc[i]) - int(cmc[i])), 1) << "n " << n << " m code " << i;
      EXPECT_LE(std::abs(int(gvc[i]) - int(cvc[i])), 1) << "n " << n << " v code " << i;
      off += (gmc[i] != cmc[i]) + (gvc[i] != cvc[i]);
    }
    EXPECT_LE(off, std::max<int64_t>(1, n / 250)) << "n " << n;
    std::printf("[simt adamw8bit] n %lld: codes differing from the CPU: %lld of %lld\n",
                static_cast<long long>(n), static_cast<long long>(off),
                static_cast<long long>(2 * n));
  }
}

// The StepScalars forms (the StepRunner's capturable path): lr, bias corrections, the gradient
// multiplier (clip coefficient / loss scale) and the fp16 skip read from device memory, against
// the CPU kernels given the same host scalars; and against the plain forms given the values the
// scalars stand for (bit-identical on the device under test).
TEST_F(SimtOptim, StepScalarsForms) {
  const std::vector<float> table_m(DynamicCodeSigned(), DynamicCodeSigned() + 256);
  const std::vector<float> table_v(DynamicCodeUnsigned(), DynamicCodeUnsigned() + 256);
  Dev<float> dtm(backend_.get(), table_m), dtv(backend_.get(), table_v);
  const int64_t n = 5000;
  for (int overflow = 0; overflow < 2; ++overflow) {
    StepScalars sc;
    sc.lr = 2e-3f;
    sc.bias_correction1 = 0.19f;
    sc.bias_correction2 = 0.002f;
    sc.loss_scale = 1024.0f;
    sc.max_grad_norm = 1.0f;
    sc.skip_nonfinite = 1;
    const std::vector<float> g = Random(n, 31, 100.0f);
    for (float x : g) sc.grad_sq += double{x} * x;
    if (overflow) sc.grad_sq = INFINITY;
    const float mult = StepGradMultiplier(sc.grad_sq, sc.loss_scale, sc.max_grad_norm);
    std::vector<unsigned char> raw(sizeof(sc));
    std::memcpy(raw.data(), &sc, sizeof(sc));
    Dev<unsigned char> dsc(backend_.get(), raw);
    const auto* ds = reinterpret_cast<const StepScalars*>(dsc.p());
    const std::vector<float> p0 = Random(n, 32), buf0 = Random(n, 33);
    // SGD.
    std::vector<float> cp = p0, cbuf = buf0, pp = p0, pbuf = buf0;
    Dev<float> dp(backend_.get(), p0), dg(backend_.get(), g), db(backend_.get(), buf0);
    ASSERT_TRUE(gpu::SgdUpdate(dp.p(), dg.p(), db.p(), n, 0.0f, 0.9f, 0.1f, 0.01f, false, false,
                               1.0f, ds, nullptr)
                    .ok());
    cpu::SgdUpdate(cp.data(), g.data(), cbuf.data(), n, 0.0f, 0.9f, 0.1f, 0.01f, false, false, 1.0f,
                   &sc, 2);
    if (!overflow) {
      cpu::SgdUpdate(pp.data(), g.data(), pbuf.data(), n, sc.lr, 0.9f, 0.1f, 0.01f, false, false,
                     mult, nullptr, 2);
      EXPECT_EQ(cp, pp);
      EXPECT_GT(ScaledDiff(cp, p0), 1e-5);
    } else {
      EXPECT_EQ(cp, p0);
    }
    EXPECT_LE(ScaledDiff(dp.get(), cp), 1e-6) << "sgd overflow " << overflow;
    EXPECT_LE(ScaledDiff(db.get(), cbuf), 1e-6) << "sgd overflow " << overflow;
    // 8-bit AdamW.
    std::vector<float> m0 = Random(n, 34, 0.01f), v0 = Random(n, 35, 0.001f);
    for (float& x : v0) x = x * x;
    std::vector<uint8_t> mc(n), vc(n);
    std::vector<float> ma(Quant8Blocks(n)), va(Quant8Blocks(n));
    QuantizeBlockwise(m0.data(), n, true, mc.data(), ma.data());
    QuantizeBlockwise(v0.data(), n, false, vc.data(), va.data());
    std::vector<float> c8 = p0, cma = ma, cva = va, q8 = p0, qma = ma, qva = va;
    std::vector<uint8_t> cmc = mc, cvc = vc, qmc = mc, qvc = vc;
    Dev<float> d8(backend_.get(), p0), dma(backend_.get(), ma), dva(backend_.get(), va);
    Dev<uint8_t> dmc(backend_.get(), mc), dvc(backend_.get(), vc);
    ASSERT_TRUE(gpu::AdamW8bitBlockwise(d8.p(), dg.p(), dmc.p(), dvc.p(), dma.p(), dva.p(), dtm.p(),
                                        dtv.p(), n, 0.0f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1.0f,
                                        1.0f, ds, nullptr)
                    .ok());
    cpu::AdamW8bitBlockwise(c8.data(), g.data(), cmc.data(), cvc.data(), cma.data(), cva.data(),
                            table_m.data(), table_v.data(), n, 0.0f, 0.9f, 0.999f, 1e-8f, 0.01f,
                            1.0f, 1.0f, 1.0f, &sc, 2);
    if (!overflow) {
      cpu::AdamW8bitBlockwise(q8.data(), g.data(), qmc.data(), qvc.data(), qma.data(), qva.data(),
                              table_m.data(), table_v.data(), n, sc.lr, 0.9f, 0.999f, 1e-8f, 0.01f,
                              sc.bias_correction1, sc.bias_correction2, mult, nullptr, 2);
      EXPECT_EQ(c8, q8);
      EXPECT_EQ(cmc, qmc);
    } else {
      EXPECT_EQ(c8, p0);
      EXPECT_EQ(cmc, mc);
    }
    EXPECT_LE(ScaledDiff(d8.get(), c8), 1e-6) << "8-bit overflow " << overflow;
    EXPECT_EQ(dmc.get(), cmc) << "8-bit overflow " << overflow;
    EXPECT_EQ(dvc.get(), cvc) << "8-bit overflow " << overflow;
  }
}

// The optimizer classes on the device under test (their updates are Backend ops) against the same
// classes on the CPU backend: 5 steps over matrices, a 3-D tensor and vectors (8-bit with a tensor
// above min_8bit_size), parameters within 1e-6 of scale and the saved state equal in name, shape
// and dtype (values within 1e-5 of scale; 8-bit codes exact).
TEST_F(SimtOptim, OptimizerClassesMatchTheCpuBackend) {
  std::vector<ParamInfo> params;
  int64_t n = 0;
  for (std::vector<int64_t> shape :
       std::vector<std::vector<int64_t>>{{70, 90}, {90}, {2, 3, 5}, {7}}) {
    ParamInfo p;
    p.hf_name = std::to_string(params.size());
    p.hf_name.insert(p.hf_name.begin(), 'w');
    p.shape = p.hf_shape = shape;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.offset = n;
    p.weight_decay = shape.size() >= 2;
    n += p.numel;
    params.push_back(p);
  }
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  const std::vector<float> p0 = Random(n, 41, 0.5f);
  for (int which = 0; which < 3; ++which) {
    std::vector<float> results[2];
    SafetensorsFile states[2];
    for (int side = 0; side < 2; ++side) {
      Backend* be = side == 0 ? cpu.get() : backend_.get();
      DeviceArena arena(be, 0);
      Dev<float> dp(be, p0);
      Dev<float> dg(be, Random(n, 42, 0.1f));
      auto run = [&](auto opt) {
        ASSERT_TRUE(opt.ok()) << opt.status().ToString();
        for (int step = 0; step < 5; ++step) (*opt)->Step(dp.p(), dg.p(), 1e-2, 0.5f);
        states[side] = (*opt)->SaveState();
      };
      if (which == 0) {
        SgdOptions o;
        o.momentum = 0.9;
        o.weight_decay = 0.01;
        run(SgdOptimizer::Create(params, n, o, &arena));
      } else if (which == 1) {
        AdafactorOptions o;
        o.beta1 = 0.9;
        o.weight_decay = 0.01;
        run(AdafactorOptimizer::Create(params, n, o, &arena));
      } else {
        AdamW8bitOptions o;
        o.weight_decay = 0.01;
        o.min_8bit_size = 1000;
        run(AdamW8bitOptimizer::Create(params, n, o, &arena));
      }
      ASSERT_TRUE(be->status().ok()) << be->status().ToString();
      results[side] = dp.get();
    }
    EXPECT_GT(ScaledDiff(results[0], p0), 1e-4) << "optimizer " << which;
    EXPECT_LE(ScaledDiff(results[1], results[0]), 1e-6) << "optimizer " << which;
    ASSERT_EQ(states[0].tensors.size(), states[1].tensors.size());
    for (const auto& [name, t] : states[0].tensors) {
      const HostTensor& u = states[1].tensors[name];
      ASSERT_EQ(t.dtype, u.dtype) << name;
      ASSERT_EQ(t.shape, u.shape) << name;
      if (t.dtype == "U8") {
        EXPECT_EQ(t.data, u.data) << name;
      } else {
        EXPECT_LE(ScaledDiff(u.ToF32().value(), t.ToF32().value()), 1e-5) << name;
      }
    }
  }
}

TEST_F(SimtOptim, BadShapesAreErrors) {
  EXPECT_EQ(gpu::SgdUpdate(nullptr, nullptr, nullptr, -1, 0.1f, 0.0f, 0.0f, 0.0f, false, true, 1.0f,
                           nullptr, nullptr)
                .code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(gpu::AdafactorFactoredStats(nullptr, nullptr, nullptr, nullptr, 1, 0, 4, 0.5f, 1e-30f,
                                        1.0f, nullptr)
                .code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(gpu::AdamW8bitBlockwise(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, 10, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.1f, 1.0f,
                                    nullptr, nullptr)
                .code(),
            Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace traind::engine
