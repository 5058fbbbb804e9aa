// The GPU backend beyond single ops (each op against the CPU backend is the op table,
// backend_ops_test.cc): AdamW from device scalars against the host-side clip/loss-scale
// arithmetic, bad shapes reported without aborting, graph capture and replay, and the
// double-buffered batch upload; run through the simt emulator (or cuda:0 in gpu_kernels_test).
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
#include "random_inputs.h"

namespace traind::engine {
namespace {

using testing::Random;

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

// A negative sliding window is refused with an error naming the op and the value.
TEST(SimtBackend, NegativeAttentionWindowIsReported) {
  auto made = testing::MakeDeviceUnderTest();
  ASSERT_TRUE(made.ok());
  std::unique_ptr<Backend> simt = std::move(made).value();
  auto* gpu = dynamic_cast<gpu::GpuBackend*>(simt.get());
  ASSERT_NE(gpu, nullptr);
  {
    Buf x(simt.get(), 3 * 8 * 4), o(simt.get(), 8 * 4), l(simt.get(), 4);
    simt->AttentionForward(o.f(), l.f(), x.f(), x.f() + 8, x.f() + 16, 1, 1, 1, 1, 8, 24, 24, true,
                           nullptr, DType::kF32, -2);
  }
  EXPECT_EQ(gpu->status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(gpu->status().message().find("AttentionForward: sliding window -2"),
            std::string::npos)
      << gpu->status().message();
}

// Generation with a sliding window on the device: decoding position t against a cache of t + 1
// rows equals row t of the device's own windowed forward over the same rows, for t before, at and
// past the window (GQA; cache rows [k | v] wider than the heads), head sizes of the lane-group
// kernels (64) and of the one-thread-per-row ones (160); and differs from the unwindowed decode
// once t >= window.
TEST_F(SimtKernels, WindowedDecodeEqualsTheForwardRow) {
  for (const int64_t HS : {64, 160}) {
    const int64_t T = 24, NH = 4, NKV = 2, qs = NH * HS, kvs = 2 * NKV * HS + 4, window = 7;
    SCOPED_TRACE("HS " + std::to_string(HS));
    Buf q(simt(), Random(T * qs, 81)), kv(simt(), Random(T * kvs, 82));
    Buf out(simt(), T * NH * HS * 4), lse(simt(), NH * T * 4), dec(simt(), NH * HS * 4),
        full(simt(), NH * HS * 4);
    const float* k = kv.f();
    const float* v = kv.f() + NKV * HS;
    simt()->AttentionForward(out.f(), lse.f(), q.f(), k, v, 1, T, NH, NKV, HS, qs, kvs, true,
                             nullptr, DType::kF32, window);
    const std::vector<float> rows = out.get();
    for (int64_t t = 0; t < T; t += 3) {
      simt()->AttentionDecode(dec.f(), q.f() + t * qs, k, v, 1, t + 1, T, NH, NKV, HS, qs, kvs,
                              window);
      simt()->AttentionDecode(full.f(), q.f() + t * qs, k, v, 1, t + 1, T, NH, NKV, HS, qs, kvs);
      const std::vector<float> got = dec.get();
      ExpectClose(got,
                  std::vector<float>(rows.begin() + t * NH * HS, rows.begin() + (t + 1) * NH * HS),
                  1e-6f, 1e-5f, "decode t=" + std::to_string(t));
      if (t >= window) {
        EXPECT_NE(got, full.get()) << "t=" << t << ": the window changed nothing";
      }
    }
  }
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
// HostStaging as the offloaded AdamW's host update drives it: two slots of [gradients | weights];
// each round a compute op writes the "gradients", they come down behind it, the host updates the
// weights in the slot, they go up into a device buffer that compute work issued before the upload
// still reads (write-after-read) and compute work issued after reads (read-after-write).
TEST_F(SimtKernels, HostStagingOrdersCopiesWithTheComputeWork) {
  const size_t n = 777;
  for (Backend* be : {simt(), cpu()}) {
    SCOPED_TRACE(be->name());
    EXPECT_EQ(be->MakeHostStaging(0, 16).status().code(), Status::Code::kInvalidArgument);
    auto staging = be->MakeHostStaging(2, 2 * n * 4);
    ASSERT_TRUE(staging.ok()) << staging.status().ToString();
    HostStaging& st = **staging;
    EXPECT_EQ(st.slots(), 2);
    EXPECT_EQ(st.slot_bytes(), 2 * n * 4);
    std::vector<float> base(n), w(n, 0.0f), acc_expect(n, 0.0f);
    for (size_t i = 0; i < n; ++i) base[i] = 0.25f * static_cast<float>(i % 97) - 3.0f;
    Buf grads(be, base), weights(be, n * 4), acc(be, n * 4);
    be->Memset0(weights.f(), n * 4);
    be->Memset0(acc.f(), n * 4);
    for (int round = 0; round < 6; ++round) {
      const int slot = round % 2;
      be->Scale(grads.f(), 2.0f, static_cast<int64_t>(n));  // the compute op the download must see
      ASSERT_TRUE(st.Download(slot, 0, grads.f(), n * 4).ok());
      auto host = st.Host(slot);
      ASSERT_TRUE(host.ok()) << host.status().ToString();
      auto* g = static_cast<float*>(host.value());
      auto* hw = g + n;
      const std::vector<float> w_prev = w;
      for (size_t i = 0; i < n; ++i) {
        const float expect_g = base[i] * static_cast<float>(1 << (round + 1));
        ASSERT_EQ(g[i], expect_g) << "round " << round << " element " << i;
        w[i] -= 0.125f * g[i];
        hw[i] = w[i];
      }
      be->Add(acc.f(), acc.f(), weights.f(), static_cast<int64_t>(n));  // reads the old weights
      ASSERT_TRUE(st.Upload(slot, n * 4, weights.f(), n * 4).ok());
      be->Add(acc.f(), acc.f(), weights.f(), static_cast<int64_t>(n));  // reads the new ones
      for (size_t i = 0; i < n; ++i) acc_expect[i] = (acc_expect[i] + w_prev[i]) + w[i];
    }
    be->Synchronize();
    EXPECT_EQ(weights.get(), w);
    EXPECT_EQ(acc.get(), acc_expect);
    EXPECT_EQ(st.Host(2).status().code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(st.Download(0, n * 4 + 4, grads.f(), n * 4).code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(st.Upload(1, 0, weights.f(), 2 * n * 4 + 4).code(), Status::Code::kInvalidArgument);
  }
}


}  // namespace
}  // namespace traind::engine
