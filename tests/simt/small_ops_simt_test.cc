// The GPU step's fused small ops on the device under test (simt here), each against the unfused
// composition it replaces on the same device (Backend's default bodies, called by qualified name:
// bit for bit) and against the CPU backend (within the op table's tolerances, as
// backend_ops_test): AdamWRunsFromScalars as ONE launch over every run, capture-safe;
// ResidualNormForward (LayerNorm / RMSNorm, fp32 / bf16 / f16 out) and the Rounded norms as one
// launch each;
// BiasBackwardRounded (the bias gradient in the pass that rounds dout) as one launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gpu_backend.h"
#include "backend/step_scalars.h"
#include "core/dtype.h"
#include "core/half.h"
#include "device_under_test.h"
#include "random_inputs.h"

#if !defined(TRAIND_TEST_ON_CUDA)
namespace simt {
uint64_t LaunchCount();  // simt/simt.h (not included: it redefines __shared__)
}  // namespace simt
#endif

namespace traind::engine {
namespace {

using testing::Random;

// Kernel launches issued by `f` (simt counts them; on a GPU: not counted, -1).
template <typename F>
int64_t Launches(Backend* be, F&& f) {
#if defined(TRAIND_TEST_ON_CUDA)
  f();
  be->Synchronize();
  return -1;
#else
  be->Synchronize();
  const uint64_t before = ::simt::LaunchCount();
  f();
  be->Synchronize();
  return static_cast<int64_t>(::simt::LaunchCount() - before);
#endif
}

// Device buffers of one backend, freed with it.
class Bufs {
 public:
  explicit Bufs(Backend* be) : be_(be) {}
  ~Bufs() {
    for (void* p : ptrs_) be_->Free(p);
  }
  template <typename T>
  T* Up(const std::vector<T>& v) {
    T* p = Zeros<T>(v.size());
    be_->CopyHostToDevice(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <typename T = float>
  T* Zeros(size_t n) {
    void* p = be_->Alloc(std::max<size_t>(n * sizeof(T), 1));
    be_->Memset0(p, std::max<size_t>(n * sizeof(T), 1));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Get(const T* p, size_t n) {
    std::vector<T> v(n);
    be_->Synchronize();
    be_->CopyDeviceToHost(v.data(), p, n * sizeof(T));
    return v;
  }

 private:
  Backend* be_;
  std::vector<void*> ptrs_;
};

std::vector<float> Widen(const std::vector<uint16_t>& h, DType t) {
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    out[i] = t == DType::kBF16 ? BF16ToF32(h[i]) : F16ToF32(h[i]);
  }
  return out;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double atol,
                 double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(double(got[i]) - want[i]) > atol + rtol * std::fabs(double(want[i]))) {
      if (++bad <= 3) ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

class SmallOps : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = testing::MakeDeviceUnderTest();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev_ = std::move(*d);
    cpu_ = MakeCpuBackend(1);
  }
  void TearDown() override {
    if (dev_ != nullptr) {
      EXPECT_TRUE(dev_->status().ok()) << dev_->status().ToString();
    }
  }
  std::unique_ptr<Backend> dev_, cpu_;
};

// Runs that cross the chunk size (16384), ragged runs, gaps between runs and a one-element run.
const std::vector<AdamWRun> kRuns = {
    {5000, 40001, 0.0f}, {0, 1, 0.1f}, {1, 4095, 0.0f}, {4100, 900, 0.01f}, {45001, 16384, 0.1f}};
constexpr int64_t kAdamN = 45001 + 16384;

StepScalars Scalars(int step, double grad_sq) {
  StepScalars s;
  s.lr = 1e-3f;
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
  s.grad_sq = grad_sq;
  s.max_grad_norm = 1.0f;
  s.loss_scale = 2.0f;
  s.skip_nonfinite = 1;
  return s;
}

// One launch for all five runs, and the bits of one AdamWFromScalars launch per run (Backend's
// default body) over three steps, the third skipped (grad_sq inf: nothing changes); within the
// op table's tolerance of the CPU backend.
TEST_F(SmallOps, AdamWRunsIsOneLaunchWithThePerRunBits) {
  const auto p0 = Random(kAdamN, 1), g = Random(kAdamN, 2);
  struct State {
    float *p, *g, *m, *v;
    StepScalars* s;
  };
  auto make = [&](Bufs& b) {
    return State{b.Up(p0), b.Up(g), b.Zeros(kAdamN), b.Zeros(kAdamN), b.Zeros<StepScalars>(1)};
  };
  Bufs fb(dev_.get()), rb(dev_.get()), cb(cpu_.get());
  State fused = make(fb), per_run = make(rb), ref = make(cb);
  const double grad_sq[3] = {9.0, 0.25, INFINITY};
  for (int step = 1; step <= 3; ++step) {
    const StepScalars host = Scalars(step, grad_sq[step - 1]);
    for (auto [be, st] : {std::pair{dev_.get(), &fused}, std::pair{dev_.get(), &per_run},
                          std::pair{cpu_.get(), &ref}}) {
      be->CopyHostToDevice(st->s, &host, sizeof(host));
    }
    const int64_t launches = Launches(dev_.get(), [&] {
      dev_->AdamWRunsFromScalars(fused.p, fused.g, fused.m, fused.v, kRuns.data(),
                                 static_cast<int64_t>(kRuns.size()), fused.s, 0.9f, 0.999f, 1e-8f);
    });
    if (launches >= 0) {
      EXPECT_EQ(launches, 1) << "step " << step;
    }
    const int64_t per_run_launches = Launches(dev_.get(), [&] {
      dev_->Backend::AdamWRunsFromScalars(per_run.p, per_run.g, per_run.m, per_run.v,
                                          kRuns.data(), static_cast<int64_t>(kRuns.size()),
                                          per_run.s, 0.9f, 0.999f, 1e-8f);
    });
    if (per_run_launches >= 0) {
      EXPECT_EQ(per_run_launches, static_cast<int64_t>(kRuns.size()));
    }
    cpu_->AdamWRunsFromScalars(ref.p, ref.g, ref.m, ref.v, kRuns.data(),
                               static_cast<int64_t>(kRuns.size()), ref.s, 0.9f, 0.999f, 1e-8f);
  }
  Bufs& F = fb;
  for (auto [name, a, b, c] :
       {std::tuple{"param", fused.p, per_run.p, ref.p}, std::tuple{"m", fused.m, per_run.m, ref.m},
        std::tuple{"v", fused.v, per_run.v, ref.v}}) {
    const auto got = F.Get(a, kAdamN);
    EXPECT_EQ(std::memcmp(got.data(), rb.Get(b, kAdamN).data(), kAdamN * sizeof(float)), 0)
        << name << ": the one launch must give the per-run launches' bits";
    ExpectClose(got, cb.Get(c, kAdamN), 1e-6, 1e-5, name);
  }
  // Elements outside every run (the gap [4096, 4100)) are untouched.
  const auto p = F.Get(fused.p, kAdamN);
  for (int64_t i = 4096; i < 4100; ++i) EXPECT_EQ(p[i], p0[i]) << i;
}

// The runs table's device copy is made outside capture: a captured step replays with new scalars
// and gradients, equal to running it directly; a table first seen while capturing is refused with
// a FAILED_PRECONDITION in status() (not a launch reading a host pointer).
TEST_F(SmallOps, AdamWRunsUnderGraphCapture) {
  auto* gpu = dynamic_cast<gpu::GpuBackend*>(dev_.get());
  ASSERT_NE(gpu, nullptr);
  const auto p0 = Random(kAdamN, 3), g1 = Random(kAdamN, 4), g2 = Random(kAdamN, 5);
  Bufs b(dev_.get());
  float *p = b.Up(p0), *g = b.Up(g1), *m = b.Zeros(kAdamN), *v = b.Zeros(kAdamN);
  float *dp = b.Up(p0), *dm = b.Zeros(kAdamN), *dv = b.Zeros(kAdamN);
  auto* s = b.Zeros<StepScalars>(1);
  const StepScalars s1 = Scalars(1, 4.0), s2 = Scalars(2, 0.5);
  auto step = [&](float* pp, float* mm, float* vv) {
    dev_->AdamWRunsFromScalars(pp, g, mm, vv, kRuns.data(), static_cast<int64_t>(kRuns.size()), s,
                               0.9f, 0.999f, 1e-8f);
  };
  // Directly: two steps.
  dev_->CopyHostToDevice(s, &s1, sizeof(s1));
  step(dp, dm, dv);
  dev_->CopyHostToDevice(g, g2.data(), g2.size() * 4);
  dev_->CopyHostToDevice(s, &s2, sizeof(s2));
  step(dp, dm, dv);
  // Captured once (the table is known from the direct steps), replayed twice with new values.
  dev_->CopyHostToDevice(g, g1.data(), g1.size() * 4);
  ASSERT_TRUE(gpu->BeginCapture().ok());
  step(p, m, v);
  const Result<int> graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ(b.Get(p, kAdamN), p0) << "capture must not run the update";
  dev_->CopyHostToDevice(s, &s1, sizeof(s1));
  ASSERT_TRUE(gpu->Replay(*graph).ok());
  dev_->CopyHostToDevice(g, g2.data(), g2.size() * 4);
  dev_->CopyHostToDevice(s, &s2, sizeof(s2));
  ASSERT_TRUE(gpu->Replay(*graph).ok());
  EXPECT_EQ(b.Get(p, kAdamN), b.Get(dp, kAdamN));
  EXPECT_EQ(b.Get(v, kAdamN), b.Get(dv, kAdamN));
  ASSERT_TRUE(dev_->status().ok()) << dev_->status().ToString();

  // A new table while capturing: refused, named.
  auto fresh = testing::MakeDeviceUnderTest();
  ASSERT_TRUE(fresh.ok());
  auto* fgpu = dynamic_cast<gpu::GpuBackend*>(fresh->get());
  Bufs fb(fresh->get());
  float* fp = fb.Up(p0);
  float *fg = fb.Up(g1), *fm = fb.Zeros(kAdamN), *fv = fb.Zeros(kAdamN);
  auto* fs = fb.Zeros<StepScalars>(1);
  ASSERT_TRUE(fgpu->BeginCapture().ok());
  (*fresh)->AdamWRunsFromScalars(fp, fg, fm, fv, kRuns.data(), static_cast<int64_t>(kRuns.size()),
                                 fs, 0.9f, 0.999f, 1e-8f);
  (void)fgpu->EndCapture();
  EXPECT_EQ((*fresh)->status().code(), Status::Code::kFailedPrecondition);
  EXPECT_NE((*fresh)->status().message().find("AdamWRunsFromScalars"), std::string::npos)
      << (*fresh)->status().ToString();
}

// ResidualNormForward in one launch, the bits of Add + the norm (+ Cast) on the same device, and
// the CPU's values within the norm tests' tolerances (fp32 1e-5 + 1e-4 relative; a 16-bit out
// 4e-3); res aliasing a (the decoder's residual stream updated in place) included.
TEST_F(SmallOps, ResidualNormForwardFusedEqualsTheComposition) {
  const int64_t N = 37, C = 200;
  const auto a = Random(N * C, 11, -2, 3), b = Random(N * C, 12), w = Random(C, 13),
             bias = Random(C, 14);
  for (bool rms : {false, true}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool alias : {false, true}) {
        const std::string what = std::string(rms ? "rms " : "layernorm ") + DTypeName(t) +
                                 (alias ? " res=a" : "");
        const bool f32 = t == DType::kF32;
        struct Out {
          std::vector<float> res, out, mean, rstd;
        };
        auto run = [&](Backend* be, int mode) {  // 0 fused, 1 composition (Backend's default)
          Bufs B(be);
          float *A = B.Up(a), *Bb = B.Up(b), *W = B.Up(w), *Bi = B.Up(bias);
          float* res = alias ? A : B.Zeros(N * C);
          float *mean = B.Zeros(N), *rstd = B.Zeros(N), *scratch = B.Zeros(N * C);
          void* out = f32 ? static_cast<void*>(B.Zeros(N * C)) : B.Zeros<uint16_t>(N * C);
          const int64_t launches = Launches(be, [&] {
            if (mode == 0) {
              be->ResidualNormForward(res, out, t, scratch, mean, rstd, A, Bb, W, Bi, N, C, 1e-5f,
                                      rms);
            } else {
              be->Backend::ResidualNormForward(res, out, t, scratch, mean, rstd, A, Bb, W, Bi, N,
                                               C, 1e-5f, rms);
            }
          });
          if (mode == 0 && be == dev_.get() && launches >= 0) {
            EXPECT_EQ(launches, 1) << what;
          }
          Out o;
          o.res = B.Get(res, N * C);
          o.out = f32 ? B.Get(static_cast<float*>(out), N * C)
                      : Widen(B.Get(static_cast<uint16_t*>(out), N * C), t);
          o.mean = B.Get(mean, N);
          o.rstd = B.Get(rstd, N);
          return o;
        };
        const Out fused = run(dev_.get(), 0), comp = run(dev_.get(), 1), ref = run(cpu_.get(), 0);
        EXPECT_EQ(fused.res, comp.res) << what;
        EXPECT_EQ(fused.out, comp.out) << what;
        EXPECT_EQ(fused.rstd, comp.rstd) << what;
        if (!rms) {
          EXPECT_EQ(fused.mean, comp.mean) << what;
        }
        ExpectClose(fused.res, ref.res, 1e-6, 1e-5, what + " res");
        ExpectClose(fused.out, ref.out, f32 ? 1e-5 : 4e-3, f32 ? 1e-4 : 4e-3, what + " out");
        ExpectClose(fused.rstd, ref.rstd, 1e-5, 1e-4, what + " rstd");
        if (!rms) ExpectClose(fused.mean, ref.mean, 1e-5, 1e-4, what + " mean");
      }
    }
  }
}

// LayerNormForwardRounded / RmsNormForwardRounded in one launch (the residual kernel without the
// add): the bits of the norm followed by Cast on the same device, the CPU's within 4e-3.
TEST_F(SmallOps, RoundedNormsAreOnePass) {
  const int64_t N = 29, C = 72;
  const auto x = Random(N * C, 31, -2, 3), w = Random(C, 32), bias = Random(C, 33);
  for (bool rms : {false, true}) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      const std::string what = std::string(rms ? "rms " : "layernorm ") + DTypeName(t);
      auto run = [&](Backend* be, bool fused) {
        Bufs B(be);
        float *X = B.Up(x), *W = B.Up(w), *Bi = B.Up(bias), *out32 = B.Zeros(N * C);
        float *mean = B.Zeros(N), *rstd = B.Zeros(N);
        auto* out = B.Zeros<uint16_t>(N * C);
        const int64_t launches = Launches(be, [&] {
          if (rms && fused) be->RmsNormForwardRounded(out, t, out32, rstd, X, W, N, C, 1e-6f);
          if (rms && !fused)
            be->Backend::RmsNormForwardRounded(out, t, out32, rstd, X, W, N, C, 1e-6f);
          if (!rms && fused)
            be->LayerNormForwardRounded(out, t, out32, mean, rstd, X, W, Bi, N, C, 1e-5f);
          if (!rms && !fused)
            be->Backend::LayerNormForwardRounded(out, t, out32, mean, rstd, X, W, Bi, N, C, 1e-5f);
        });
        if (fused && be == dev_.get() && launches >= 0) {
          EXPECT_EQ(launches, 1) << what;
        }
        return std::tuple{Widen(B.Get(out, N * C), t), B.Get(mean, N), B.Get(rstd, N)};
      };
      const auto fused = run(dev_.get(), true), comp = run(dev_.get(), false),
                 ref = run(cpu_.get(), true);
      EXPECT_EQ(std::get<0>(fused), std::get<0>(comp)) << what;
      EXPECT_EQ(std::get<1>(fused), std::get<1>(comp)) << what;
      EXPECT_EQ(std::get<2>(fused), std::get<2>(comp)) << what;
      ExpectClose(std::get<0>(fused), std::get<0>(ref), 4e-3, 4e-3, what + " out");
      ExpectClose(std::get<2>(fused), std::get<2>(ref), 1e-5, 1e-4, what + " rstd");
    }
  }
}

// The bias gradient in the pass that rounds dout: one launch, BiasBackward's bits (+=) and Cast's
// bits, the CPU's within the reduction tolerance; GeluBackwardBias then takes two launches.
TEST_F(SmallOps, BiasBackwardRoundedIsOnePass) {
  const int64_t N = 45, OC = 70;  // OC not a multiple of 32: a ragged block of columns
  const auto dout = Random(N * OC, 21, -3, 3), db0 = Random(OC, 22), inp = Random(N * OC, 23);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const std::string what = DTypeName(t);
    auto run = [&](Backend* be, int mode) {  // 0 fused, 1 composition, 2 GeluBackwardBias
      Bufs B(be);
      float *D = B.Up(dout), *db = B.Up(db0), *I = B.Up(inp), *scratch = B.Zeros(N * OC);
      auto* d16 = B.Zeros<uint16_t>(N * OC);
      const int64_t launches = Launches(be, [&] {
        if (mode == 0) be->BiasBackwardRounded(db, D, N, OC, d16, t);
        if (mode == 1) be->Backend::BiasBackwardRounded(db, D, N, OC, d16, t);
        if (mode == 2) be->GeluBackwardBias(scratch, I, D, db, N, OC, d16, t);
      });
      if (be == dev_.get() && mode != 1 && launches >= 0) {
        EXPECT_EQ(launches, mode == 0 ? 1 : 2) << what << " mode " << mode;
      }
      return std::pair{B.Get(db, OC), Widen(B.Get(d16, N * OC), t)};
    };
    const auto fused = run(dev_.get(), 0), comp = run(dev_.get(), 1), ref = run(cpu_.get(), 0);
    EXPECT_EQ(fused.first, comp.first) << what;
    EXPECT_EQ(fused.second, comp.second) << what;
    ExpectClose(fused.first, ref.first, 1e-5, 1e-4, what + " dbias");
    EXPECT_EQ(fused.second, ref.second) << what << ": rounding is exact";
    const auto gelu = run(dev_.get(), 2), gelu_ref = run(cpu_.get(), 2);
    ExpectClose(gelu.first, gelu_ref.first, 1e-5, 1e-4, what + " gelu dbias");
    ExpectClose(gelu.second, gelu_ref.second, 1e-2, 1e-2, what + " gelu dinp16");
  }
}

}  // namespace
}  // namespace traind::engine
