// Every GPU-backend kernel, run through the simt emulator, against the CPU backend (the reference)
// on random inputs of several shapes, ragged ones included (not multiples of the block sizes).
// Tolerances (absolute + relative, per element): fp32 elementwise 1e-6 + 1e-5; reductions and
// norms 1e-5 + 1e-4; attention 2e-5 + 2e-4 (different summation orders over T); casts exact;
// SumSquares 1e-10 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_backend.h"
#include "optim/adamw.h"
#include "device_under_test.h"

namespace traind::engine {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A buffer on a backend, filled from and read back to host vectors.
class Buf {
 public:
  Buf(Backend* be, size_t bytes) : be_(be), bytes_(bytes), p_(be->Alloc(bytes)) {}
  template <typename T>
  Buf(Backend* be, const std::vector<T>& v) : Buf(be, v.size() * sizeof(T)) {
    be_->CopyHostToDevice(p_, v.data(), bytes_);
  }
  ~Buf() { be_->Free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename T>
  T* as() {
    return static_cast<T*>(p_);
  }
  float* f() { return as<float>(); }
  template <typename T = float>
  std::vector<T> get() {
    std::vector<T> v(bytes_ / sizeof(T));
    be_->CopyDeviceToHost(v.data(), p_, bytes_);
    return v;
  }

 private:
  Backend* be_;
  size_t bytes_;
  void* p_;
};

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float atol,
                 float rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = atol + rtol * std::fabs(want[i]);
    const bool same_nonfinite =
        !std::isfinite(want[i]) && std::isnan(got[i]) == std::isnan(want[i]) && got[i] == want[i];
    if (!(std::fabs(got[i] - want[i]) <= tol) && !same_nonfinite) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": element " << i << " simt " << got[i] << " cpu " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

class SimtKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = MakeCpuBackend(1);
    auto simt = testing::MakeDeviceUnderTest();
    ASSERT_TRUE(simt.ok()) << simt.status().ToString();
    simt_ = std::move(simt).value();
  }
  void TearDown() override {
    auto* gpu = dynamic_cast<gpu::GpuBackend*>(simt_.get());
    ASSERT_NE(gpu, nullptr);
    EXPECT_TRUE(gpu->status().ok()) << gpu->status().ToString();
  }
  Backend* cpu() { return cpu_.get(); }
  Backend* simt() { return simt_.get(); }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> simt_;
};

TEST_F(SimtKernels, EmbeddingForwardBackward) {
  for (auto [N, C, V] :
       {std::tuple<int64_t, int64_t, int64_t>{13, 37, 50}, {64, 256, 9}, {1, 1, 1}}) {
    std::vector<int32_t> ids(N);
    std::mt19937 rng(N);
    for (auto& i : ids) i = static_cast<int32_t>(rng() % V);
    const auto table = Random(V * C, 1), out0 = Random(N * C, 2), dout = Random(N * C, 3);
    const auto dtable0 = Random(V * C, 4);
    for (bool acc : {false, true}) {
      Buf ci(cpu(), ids), ct(cpu(), table), co(cpu(), out0);
      Buf si(simt(), ids), st(simt(), table), so(simt(), out0);
      cpu()->EmbeddingForward(co.f(), ci.as<int32_t>(), ct.f(), N, C, acc);
      simt()->EmbeddingForward(so.f(), si.as<int32_t>(), st.f(), N, C, acc);
      ExpectClose(so.get(), co.get(), 0, 0, "EmbeddingForward N=" + std::to_string(N));
    }
    Buf ci(cpu(), ids), cd(cpu(), dout), cdt(cpu(), dtable0);
    Buf si(simt(), ids), sd(simt(), dout), sdt(simt(), dtable0);
    cpu()->EmbeddingBackward(cdt.f(), cd.f(), ci.as<int32_t>(), N, C);
    simt()->EmbeddingBackward(sdt.f(), sd.f(), si.as<int32_t>(), N, C);
    ExpectClose(sdt.get(), cdt.get(), 1e-6f, 1e-5f, "EmbeddingBackward N=" + std::to_string(N));
  }
}

TEST_F(SimtKernels, BiasAddScale) {
  for (auto [N, OC] : {std::pair<int64_t, int64_t>{5, 70}, {33, 32}, {1, 1}, {100, 3}}) {
    const auto x = Random(N * OC, 1), b = Random(OC, 2), y = Random(N * OC, 3), db0 = Random(OC, 4);
    Buf cx(cpu(), x), cb(cpu(), b), cy(cpu(), y), cdb(cpu(), db0);
    Buf sx(simt(), x), sb(simt(), b), sy(simt(), y), sdb(simt(), db0);
    cpu()->AddBias(cx.f(), cb.f(), N, OC);
    simt()->AddBias(sx.f(), sb.f(), N, OC);
    ExpectClose(sx.get(), cx.get(), 1e-6f, 1e-5f, "AddBias");
    cpu()->BiasBackward(cdb.f(), cy.f(), N, OC);
    simt()->BiasBackward(sdb.f(), sy.f(), N, OC);
    ExpectClose(sdb.get(), cdb.get(), 1e-5f, 1e-5f, "BiasBackward");
    cpu()->Add(cx.f(), cx.f(), cy.f(), N * OC);  // out aliases a
    simt()->Add(sx.f(), sx.f(), sy.f(), N * OC);
    ExpectClose(sx.get(), cx.get(), 1e-6f, 1e-5f, "Add");
    cpu()->Scale(cx.f(), -0.37f, N * OC);
    simt()->Scale(sx.f(), -0.37f, N * OC);
    ExpectClose(sx.get(), cx.get(), 1e-6f, 1e-5f, "Scale");
  }
}

TEST_F(SimtKernels, SumSquaresAndNonFinite) {
  for (int64_t n : {1, 255, 1000, 70001}) {
    auto x = Random(n, n, -3.0f, 3.0f);
    Buf cx(cpu(), x), sx(simt(), x);
    const double want = cpu()->SumSquares(cx.f(), n), got = simt()->SumSquares(sx.f(), n);
    EXPECT_NEAR(got, want, 1e-10 * want) << "n=" << n;
    EXPECT_FALSE(simt()->HasNonFinite(sx.f(), n));
    EXPECT_FALSE(cpu()->HasNonFinite(cx.f(), n));
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      x[n / 2] = bad;
      Buf cb(cpu(), x), sb(simt(), x);
      EXPECT_TRUE(simt()->HasNonFinite(sb.f(), n)) << bad;
      EXPECT_TRUE(cpu()->HasNonFinite(cb.f(), n)) << bad;
    }
  }
}

// The device-resident accumulations of a captured step: *acc += sum of squares, and
// *acc += weight * sum (the weight read from device memory), on top of what *acc held.
TEST_F(SimtKernels, AccumulateSumAndSumSquares) {
  for (int64_t n : {1, 255, 1000, 70001}) {
    const auto x = Random(n, n + 1, -3.0f, 3.0f);
    const std::vector<float> weight = {0.25f};
    for (Backend* be : {cpu(), simt()}) {
      SCOPED_TRACE(be->name());
      Buf bx(be, x), bw(be, weight), acc(be, std::vector<double>{1.5, -2.0});
      be->AccumulateSumSquares(acc.as<double>(), bx.f(), n);
      be->AccumulateSum(acc.as<double>() + 1, bx.f(), n, bw.f());
      be->Synchronize();
      double sq = 0.0, sum = 0.0;
      for (float v : x) {
        sq += double{v} * v;
        sum += v;
      }
      const auto got = acc.get<double>();
      EXPECT_NEAR(got[0], 1.5 + sq, 1e-10 * sq) << "n=" << n;
      EXPECT_NEAR(got[1], -2.0 + 0.25 * sum, 1e-9 * (1.0 + std::fabs(sum))) << "n=" << n;
    }
  }
}

TEST_F(SimtKernels, CastsAllPairsExact) {
  const int64_t n = 1003;
  auto x = Random(n, 7, -70000.0f, 70000.0f);  // past the f16 range: overflow to inf
  auto small = Random(n, 8, -1e-3f, 1e-3f);    // f16 subnormals
  x.insert(x.end(), small.begin(), small.end());
  const int64_t m = static_cast<int64_t>(x.size());
  for (DType src : {DType::kF32, DType::kBF16, DType::kF16}) {
    // Source values of type `src`, made by the CPU backend's cast from f32.
    Buf cx(cpu(), x);
    Buf csrc(cpu(), m * DTypeSize(src));
    cpu()->Cast(csrc.as<void>(), src, cx.f(), DType::kF32, m);
    const auto src_bytes = csrc.get<uint8_t>();
    for (DType dst : {DType::kF32, DType::kBF16, DType::kF16}) {
      Buf cs(cpu(), src_bytes), ss(simt(), src_bytes);
      Buf cd(cpu(), m * DTypeSize(dst)), sd(simt(), m * DTypeSize(dst));
      cpu()->Cast(cd.as<void>(), dst, cs.as<void>(), src, m);
      simt()->Cast(sd.as<void>(), dst, ss.as<void>(), src, m);
      EXPECT_EQ(sd.get<uint8_t>(), cd.get<uint8_t>()) << DTypeName(src) << " -> " << DTypeName(dst);
    }
  }
}

TEST_F(SimtKernels, LayerNormForwardBackward) {
  // C=5200 does not fit the shared dweight/dbias accumulators: the global-atomics path.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{9, 77}, {33, 640}, {1, 1}, {3, 5200}}) {
    const auto x = Random(N * C, 1, -2, 2), w = Random(C, 2), b = Random(C, 3);
    const auto dout = Random(N * C, 4), dinp0 = Random(N * C, 5), dw0 = Random(C, 6),
               db0 = Random(C, 7);
    Buf cx(cpu(), x), cw(cpu(), w), cb(cpu(), b), co(cpu(), N * C * 4), cm(cpu(), N * 4),
        cr(cpu(), N * 4);
    Buf sx(simt(), x), sw(simt(), w), sb(simt(), b), so(simt(), N * C * 4), sm(simt(), N * 4),
        sr(simt(), N * 4);
    cpu()->LayerNormForward(co.f(), cm.f(), cr.f(), cx.f(), cw.f(), cb.f(), N, C, 1e-5f);
    simt()->LayerNormForward(so.f(), sm.f(), sr.f(), sx.f(), sw.f(), sb.f(), N, C, 1e-5f);
    const std::string tag = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    ExpectClose(so.get(), co.get(), 1e-5f, 1e-4f, "LayerNorm out" + tag);
    ExpectClose(sm.get(), cm.get(), 1e-6f, 1e-5f, "LayerNorm mean" + tag);
    ExpectClose(sr.get(), cr.get(), 1e-5f, 1e-4f, "LayerNorm rstd" + tag);
    Buf cdo(cpu(), dout), cdi(cpu(), dinp0), cdw(cpu(), dw0), cdb(cpu(), db0);
    Buf sdo(simt(), dout), sdi(simt(), dinp0), sdw(simt(), dw0), sdb(simt(), db0);
    cpu()->LayerNormBackward(cdi.f(), cdw.f(), cdb.f(), cdo.f(), cx.f(), cw.f(), cm.f(), cr.f(), N,
                             C);
    simt()->LayerNormBackward(sdi.f(), sdw.f(), sdb.f(), sdo.f(), sx.f(), sw.f(), sm.f(), sr.f(), N,
                              C);
    ExpectClose(sdi.get(), cdi.get(), 1e-5f, 1e-4f, "LayerNorm dinp" + tag);
    ExpectClose(sdw.get(), cdw.get(), 1e-5f, 1e-4f, "LayerNorm dweight" + tag);
    ExpectClose(sdb.get(), cdb.get(), 1e-5f, 1e-4f, "LayerNorm dbias" + tag);
  }
}

TEST_F(SimtKernels, RmsNormForwardBackward) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{9, 77}, {33, 640}, {1, 1}, {3, 10300}}) {
    const auto x = Random(N * C, 1, -2, 2), w = Random(C, 2);
    const auto dout = Random(N * C, 4), dinp0 = Random(N * C, 5), dw0 = Random(C, 6);
    Buf cx(cpu(), x), cw(cpu(), w), co(cpu(), N * C * 4), cr(cpu(), N * 4);
    Buf sx(simt(), x), sw(simt(), w), so(simt(), N * C * 4), sr(simt(), N * 4);
    cpu()->RmsNormForward(co.f(), cr.f(), cx.f(), cw.f(), N, C, 1e-6f);
    simt()->RmsNormForward(so.f(), sr.f(), sx.f(), sw.f(), N, C, 1e-6f);
    const std::string tag = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    ExpectClose(so.get(), co.get(), 1e-5f, 1e-4f, "RmsNorm out" + tag);
    ExpectClose(sr.get(), cr.get(), 1e-5f, 1e-4f, "RmsNorm rstd" + tag);
    Buf cdo(cpu(), dout), cdi(cpu(), dinp0), cdw(cpu(), dw0);
    Buf sdo(simt(), dout), sdi(simt(), dinp0), sdw(simt(), dw0);
    cpu()->RmsNormBackward(cdi.f(), cdw.f(), cdo.f(), cx.f(), cw.f(), cr.f(), N, C);
    simt()->RmsNormBackward(sdi.f(), sdw.f(), sdo.f(), sx.f(), sw.f(), sr.f(), N, C);
    ExpectClose(sdi.get(), cdi.get(), 1e-5f, 1e-4f, "RmsNorm dinp" + tag);
    ExpectClose(sdw.get(), cdw.get(), 1e-5f, 1e-4f, "RmsNorm dweight" + tag);
  }
}

TEST_F(SimtKernels, GeluSwiGlu) {
  for (int64_t n : {1, 300, 4099}) {
    const auto x = Random(n, 1, -5, 5), dout = Random(n, 2);
    Buf cx(cpu(), x), co(cpu(), n * 4), cd(cpu(), dout), cdi(cpu(), n * 4);
    Buf sx(simt(), x), so(simt(), n * 4), sd(simt(), dout), sdi(simt(), n * 4);
    cpu()->GeluForward(co.f(), cx.f(), n);
    simt()->GeluForward(so.f(), sx.f(), n);
    ExpectClose(so.get(), co.get(), 1e-6f, 1e-5f, "GeluForward");
    cpu()->GeluBackward(cdi.f(), cx.f(), cd.f(), n);
    simt()->GeluBackward(sdi.f(), sx.f(), sd.f(), n);
    ExpectClose(sdi.get(), cdi.get(), 1e-6f, 1e-5f, "GeluBackward");
  }
  for (auto [N, H] : {std::pair<int64_t, int64_t>{7, 45}, {1, 1}, {16, 256}}) {
    const auto x = Random(N * 2 * H, 3, -6, 6), dout = Random(N * H, 4);
    Buf cx(cpu(), x), co(cpu(), N * H * 4), cd(cpu(), dout), cdi(cpu(), N * 2 * H * 4);
    Buf sx(simt(), x), so(simt(), N * H * 4), sd(simt(), dout), sdi(simt(), N * 2 * H * 4);
    cpu()->SwiGluForward(co.f(), cx.f(), N, H);
    simt()->SwiGluForward(so.f(), sx.f(), N, H);
    ExpectClose(so.get(), co.get(), 1e-6f, 1e-5f, "SwiGluForward");
    cpu()->SwiGluBackward(cdi.f(), cx.f(), cd.f(), N, H);
    simt()->SwiGluBackward(sdi.f(), sx.f(), sd.f(), N, H);
    ExpectClose(sdi.get(), cdi.get(), 1e-6f, 1e-5f, "SwiGluBackward");
  }
}

TEST_F(SimtKernels, RopeForwardInverse) {
  struct Case {
    int64_t B, T, NH, HS, stride;
  };
  for (const Case c :
       {Case{2, 5, 3, 8, 3 * 8 + 5}, Case{1, 40, 2, 64, 128 * 3}, Case{3, 1, 1, 2, 2}}) {
    const auto x = Random(c.B * c.T * c.stride, 1);
    for (bool inverse : {false, true}) {
      Buf cx(cpu(), x), sx(simt(), x);
      cpu()->Rope(cx.f(), c.B, c.T, c.NH, c.HS, c.stride, 10000.0f, inverse);
      simt()->Rope(sx.f(), c.B, c.T, c.NH, c.HS, c.stride, 10000.0f, inverse);
      ExpectClose(sx.get(), cx.get(), 1e-6f, 1e-5f, "Rope HS=" + std::to_string(c.HS));
    }
  }
}

TEST_F(SimtKernels, AttentionForwardBackward) {
  struct Case {
    int64_t B, T, NH, NKV, HS;
    bool fused;
  };
  // fused: q, k, v are thirds of one (B*T, (NH+2*NKV)*HS) row, as in a qkv projection.
  for (const Case c :
       {Case{2, 37, 4, 2, 16, true}, Case{1, 70, 2, 1, 40, false}, Case{1, 5, 1, 1, 160, false},
        Case{1, 1, 3, 3, 8, true}, Case{1, 130, 4, 1, 64, true}}) {
    const int64_t rows = c.B * c.T;
    const int64_t qs = c.fused ? (c.NH + 2 * c.NKV) * c.HS : c.NH * c.HS + 3;  // +3: a gap
    const int64_t kvs = c.fused ? qs : c.NKV * c.HS + 5;
    const int64_t koff = c.fused ? c.NH * c.HS : 0, voff = c.fused ? (c.NH + c.NKV) * c.HS : 0;
    const auto qbuf = Random(rows * qs, 1), kbuf = Random(rows * kvs, 2),
               vbuf = Random(rows * kvs, 3);
    const auto dout = Random(rows * c.NH * c.HS, 4);
    const std::vector<float> sentinel_q(rows * qs, 7.0f), sentinel_kv(rows * kvs, 7.0f);
    const std::string tag = " T=" + std::to_string(c.T) + " HS=" + std::to_string(c.HS);
    std::vector<std::vector<float>> results[2];
    int which = 0;
    for (Backend* be : {cpu(), simt()}) {
      Buf q(be, qbuf), k(be, c.fused ? qbuf : kbuf), v(be, c.fused ? qbuf : vbuf);
      Buf out(be, rows * c.NH * c.HS * 4), lse(be, c.B * c.NH * c.T * 4), dO(be, dout);
      Buf dq(be, sentinel_q), dk(be, c.fused ? sentinel_q : sentinel_kv),
          dv(be, c.fused ? sentinel_q : sentinel_kv);
      const float* kp = k.f() + koff;
      const float* vp = v.f() + voff;
      be->AttentionForward(out.f(), lse.f(), q.f(), kp, vp, c.B, c.T, c.NH, c.NKV, c.HS, qs, kvs);
      // Fused: dq, dk, dv all point into one buffer (dq) at their offsets; else separate buffers.
      float* dkp = c.fused ? dq.f() + koff : dk.f();
      float* dvp = c.fused ? dq.f() + voff : dv.f();
      be->AttentionBackward(dq.f(), dkp, dvp, dO.f(), out.f(), lse.f(), q.f(), kp, vp, c.B, c.T,
                            c.NH, c.NKV, c.HS, qs, kvs);
      results[which++] = {out.get(), lse.get(), dq.get(), dk.get(), dv.get()};
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i)
      ExpectClose(results[1][i], results[0][i], 2e-5f, 2e-4f,
                  std::string("Attention ") + names[i] + tag);
  }
}

TEST_F(SimtKernels, SoftmaxCrossEntropy) {
  for (auto [N, V, Vp] :
       {std::tuple<int64_t, int64_t, int64_t>{6, 37, 48}, {3, 1000, 1000}, {1, 1, 8}}) {
    const auto logits = Random(N * Vp, 1, -8, 8);
    std::vector<int32_t> targets(N);
    std::mt19937 rng(V);
    for (auto& t : targets) t = static_cast<int32_t>(rng() % V);
    if (N > 1) targets[1] = -1;  // an ignored row
    for (bool grad : {false, true}) {
      Buf cl(cpu(), logits), ct(cpu(), targets), closs(cpu(), N * 4);
      Buf sl(simt(), logits), st(simt(), targets), sloss(simt(), N * 4);
      cpu()->SoftmaxCrossEntropy(cl.f(), closs.f(), ct.as<int32_t>(), N, V, Vp, 0.5f, grad, nullptr);
      simt()->SoftmaxCrossEntropy(sl.f(), sloss.f(), st.as<int32_t>(), N, V, Vp, 0.5f, grad, nullptr);
      const std::string tag = " V=" + std::to_string(V) + (grad ? " grad" : "");
      ExpectClose(sloss.get(), closs.get(), 1e-5f, 1e-5f, "CE losses" + tag);
      ExpectClose(sl.get(), cl.get(), 1e-6f, 1e-4f, "CE logits/dlogits" + tag);
    }
  }
}

TEST_F(SimtKernels, AdamW) {
  for (int64_t n : {1, 1000, 5000}) {
    const auto p = Random(n, 1), g = Random(n, 2), m = Random(n, 3, -0.1f, 0.1f),
               v = Random(n, 4, 0, 0.01f);
    Buf cp(cpu(), p), cg(cpu(), g), cm(cpu(), m), cv(cpu(), v);
    Buf sp(simt(), p), sg(simt(), g), sm(simt(), m), sv(simt(), v);
    for (int step = 1; step <= 3; ++step) {
      const float bc1 = 1.0f - std::pow(0.9f, step), bc2 = 1.0f - std::pow(0.999f, step);
      cpu()->AdamW(cp.f(), cg.f(), cm.f(), cv.f(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2,
                   0.5f);
      simt()->AdamW(sp.f(), sg.f(), sm.f(), sv.f(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2,
                    0.5f);
    }
    ExpectClose(sp.get(), cp.get(), 1e-6f, 1e-5f, "AdamW param");
    ExpectClose(sm.get(), cm.get(), 1e-6f, 1e-5f, "AdamW m");
    ExpectClose(sv.get(), cv.get(), 1e-7f, 1e-5f, "AdamW v");
  }
}

// The cross-entropy gradient scale may come from device memory: grad_scale * *device_scale.
TEST_F(SimtKernels, SoftmaxCrossEntropyDeviceScale) {
  const int64_t N = 5, V = 300, Vp = 320;
  const auto logits = Random(N * Vp, 11, -8, 8);
  std::vector<int32_t> targets = {3, -1, 299, 0, 150};
  const std::vector<float> scale = {0.125f};
  Buf cl(cpu(), logits), ct(cpu(), targets), closs(cpu(), N * 4);
  cpu()->SoftmaxCrossEntropy(cl.f(), closs.f(), ct.as<int32_t>(), N, V, Vp, 0.5f * 0.125f, true,
                             nullptr);
  for (Backend* be : {cpu(), simt()}) {
    SCOPED_TRACE(be->name());
    Buf l(be, logits), t(be, targets), loss(be, N * 4), s(be, scale);
    be->SoftmaxCrossEntropy(l.f(), loss.f(), t.as<int32_t>(), N, V, Vp, 0.5f, true, s.f());
    ExpectClose(loss.get(), closs.get(), 1e-5f, 1e-5f, "CE losses");
    ExpectClose(l.get(), cl.get(), 1e-7f, 1e-4f, "CE dlogits with a device scale");
  }
}

// AdamW from device scalars equals the host-driven AdamW with the multiplier the host-side
// trainer computes (clip_grad_norm_'s coefficient / loss scale), clipping active or not, and
// leaves everything untouched when an fp16 overflow (non-finite grad_sq) must skip the step.
TEST_F(SimtKernels, AdamWFromScalarsMatchesHostScalars) {
  const int64_t n = 3001;
  const auto p = Random(n, 1), g = Random(n, 2), m = Random(n, 3, -0.1f, 0.1f),
             v = Random(n, 4, 0, 0.01f);
  double grad_sq = 0.0;
  for (float x : g) grad_sq += double{x} * x;
  struct Case {
    float loss_scale, max_norm;
    double grad_sq;
    int skip;
  };
  for (const Case c : {Case{1.0f, 1.0f, grad_sq, 0}, Case{1.0f, 0.0f, grad_sq, 0},
                       Case{1024.0f, 1e9f, grad_sq, 1}, Case{1.0f, 1.0f, INFINITY, 1}}) {
    StepScalars sc;
    sc.grad_sq = c.grad_sq;
    sc.lr = 1e-3f;
    sc.bias_correction1 = 1.0f - 0.9f;
    sc.bias_correction2 = 1.0f - 0.999f;
    sc.loss_scale = c.loss_scale;
    sc.max_grad_norm = c.max_norm;
    sc.skip_nonfinite = c.skip;
    const bool skipped = c.skip != 0 && !std::isfinite(c.grad_sq);
    // The host path: norm, clip coefficient, multiplier as the trainer computed them.
    const double norm = std::sqrt(c.grad_sq) / c.loss_scale;
    const float clip = ClipCoefficient(norm, c.max_norm);
    EXPECT_EQ(StepGradMultiplier(c.grad_sq, c.loss_scale, c.max_norm), clip / c.loss_scale);
    Buf cp(cpu(), p), cg(cpu(), g), cm(cpu(), m), cv(cpu(), v);
    if (!skipped) {
      cpu()->AdamW(cp.f(), cg.f(), cm.f(), cv.f(), n, sc.lr, 0.9f, 0.999f, 1e-8f, 0.1f,
                   sc.bias_correction1, sc.bias_correction2, clip / c.loss_scale);
    }
    for (Backend* be : {cpu(), simt()}) {
      SCOPED_TRACE(be->name() + " loss_scale " + std::to_string(c.loss_scale) + " max_norm " +
                   std::to_string(c.max_norm) + (skipped ? " skipped" : ""));
      Buf bp(be, p), bg(be, g), bm(be, m), bv(be, v), bs(be, sizeof(sc));
      be->CopyHostToDevice(bs.as<void>(), &sc, sizeof(sc));
      be->AdamWFromScalars(bp.f(), bg.f(), bm.f(), bv.f(), n, bs.as<StepScalars>(), 0.9f, 0.999f,
                           1e-8f, 0.1f);
      const float tol = be == cpu() ? 0.0f : 1e-6f;
      ExpectClose(bp.get(), cp.get(), tol, be == cpu() ? 0.0f : 1e-5f, "param");
      ExpectClose(bm.get(), cm.get(), tol, be == cpu() ? 0.0f : 1e-5f, "m");
      ExpectClose(bv.get(), cv.get(), tol * 0.1f, be == cpu() ? 0.0f : 1e-5f, "v");
    }
  }
}

TEST(SimtBackend, BadShapesAreReportedNotFatal) {
  auto made = testing::MakeDeviceUnderTest();
  ASSERT_TRUE(made.ok());
  std::unique_ptr<Backend> simt = std::move(made).value();
  auto* gpu = dynamic_cast<gpu::GpuBackend*>(simt.get());
  ASSERT_NE(gpu, nullptr);
  {
    Buf x(simt.get(), 64 * 4);
    simt->Rope(x.f(), 1, 1, 1, 3, 3, 10000.0f, false);  // odd head size
  }
  EXPECT_EQ(gpu->status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(gpu->status().message().find("head size"), std::string::npos)
      << gpu->status().message();
}

// A captured sequence (norm, GEMM, GELU, add) replays to the same result as running it directly,
// and a replay sees new input values written into the same buffers.
TEST_F(SimtKernels, GraphCaptureReplayMatchesDirectRun) {
  auto* gpu = dynamic_cast<gpu::GpuBackend*>(simt());
  ASSERT_NE(gpu, nullptr);
  const int64_t N = 10, C = 24, OC = 40;
  const auto x1 = Random(N * C, 1), x2 = Random(N * C, 2), w = Random(OC * C, 3), g = Random(C, 4),
             b = Random(C, 5);
  Buf x(simt(), x1), W(simt(), w), gw(simt(), g), gb(simt(), b);
  Buf ln(simt(), N * C * 4), mean(simt(), N * 4), rstd(simt(), N * 4), h(simt(), N * OC * 4),
      y(simt(), N * OC * 4);
  auto sequence = [&] {
    simt()->LayerNormForward(ln.f(), mean.f(), rstd.f(), x.f(), gw.f(), gb.f(), N, C, 1e-5f);
    simt()->Gemm(false, true, N, OC, C, 1.0f, ln.f(), C, W.f(), C, 0.0f, h.f(), OC);
    simt()->GeluForward(y.f(), h.f(), N * OC);
    simt()->Add(y.f(), y.f(), h.f(), N * OC);
  };
  std::vector<float> direct[2];
  for (int i = 0; i < 2; ++i) {
    simt()->CopyHostToDevice(x.f(), i == 0 ? x1.data() : x2.data(), x1.size() * 4);
    sequence();
    direct[i] = y.get();
  }
  simt()->Memset0(y.f(), N * OC * 4);
  ASSERT_TRUE(gpu->BeginCapture().ok());
  sequence();
  const Result<int> graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ(y.get(), std::vector<float>(N * OC, 0.0f)) << "capture must not run the work";
  for (int i = 0; i < 2; ++i) {
    simt()->CopyHostToDevice(x.f(), i == 0 ? x1.data() : x2.data(), x1.size() * 4);
    ASSERT_TRUE(gpu->Replay(*graph).ok());
    EXPECT_EQ(y.get(), direct[i]) << "replay " << i;
  }
}

// The double-buffered upload path (pinned slots and a copy stream on CUDA) delivers each batch
// intact to alternating destinations on both the simt backend and the CPU backend's default, with
// a consumer between uploads as the trainer runs it, and rejects bad slots and oversized uploads.
TEST_F(SimtKernels, BatchUploadDoubleBuffers) {
  const size_t n = 1000;
  for (Backend* be : {simt(), cpu()}) {
    SCOPED_TRACE(be->name());
    auto up = be->MakeBatchUpload(n * sizeof(int32_t));
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    Buf dst0(be, n * 4), dst1(be, n * 4), sum(be, n * 4);
    be->Memset0(sum.f(), n * 4);
    std::vector<float> expect(n, 0.0f);
    for (int step = 0; step < 5; ++step) {
      const int slot = step % 2;
      auto host = (*up)->HostSlot(slot);
      ASSERT_TRUE(host.ok());
      auto* p = static_cast<float*>(host.value());
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(step * 1000 + static_cast<int>(i));
      Buf& dst = slot == 0 ? dst0 : dst1;
      ASSERT_TRUE((*up)->Upload(slot, dst.as<void>(), n * 4).ok());
      be->Add(sum.f(), sum.f(), dst.f(), static_cast<int64_t>(n));  // the consumer
      ASSERT_TRUE((*up)->Consumed(slot).ok());
      for (size_t i = 0; i < n; ++i) expect[i] += static_cast<float>(step * 1000 + static_cast<int>(i));
    }
    be->Synchronize();
    EXPECT_EQ(sum.get(), expect);
    ASSERT_TRUE((*up)->HostSlot(0).ok());
    EXPECT_EQ((*up)->Upload(0, dst0.as<void>(), n * 4 + 4).code(), Status::Code::kInvalidArgument);
    EXPECT_EQ((*up)->HostSlot(2).status().code(), Status::Code::kInvalidArgument);
  }
  auto* gpu = dynamic_cast<gpu::GpuBackend*>(simt());
  ASSERT_NE(gpu, nullptr);
  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_TRUE(gpu->MemoryInfo(&free_bytes, &total_bytes).ok());
  EXPECT_GT(total_bytes, 0u);
}

}  // namespace
}  // namespace traind::engine
