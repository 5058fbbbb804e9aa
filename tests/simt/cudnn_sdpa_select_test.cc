// The choice of the cuDNN SDPA path (backend/cuda/cudnn_sdpa.h) without a GPU or cuDNN: the
// selector with stand-in paths (absent library, unsupported shape, a path whose output is wrong,
// a path that errors, a correct path), alone and inside the simt GpuBackend's AttentionForward16.
// Each fallback gives exactly ONE log line however many calls follow, and the output is then the
// own tensor-core kernel's, bit for bit; a path that passes its self-check is used from then on;
// with the switch off (the default) the path is never consulted and nothing is logged.
#include "backend/cuda/cudnn_sdpa.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_tc.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_backend.h"
#include "core/half.h"
#include "random_inputs.h"

namespace traind::engine::gpu {
namespace {

// A stand-in for cuDNN: what Ready/Supports answer, and what Forward writes: the own kernel's
// result (kExact), that plus an error of `offset` on every element of out (kOffset), or an error.
class FakePath final : public SdpaPath {
 public:
  enum class Mode { kExact, kOffset, kError };
  FakePath(Status ready, Status supports, Mode mode, float offset = 0.0f)
      : ready_(std::move(ready)), supports_(std::move(supports)), mode_(mode), offset_(offset) {}
  std::string name() const override { return "fake"; }
  Status Ready() override {
    ++ready_calls;
    return ready_;
  }
  Status Supports(const SdpaShape&) const override { return supports_; }
  Status Forward(void* out, float* lse, const void* q, const void* k, const void* v,
                 const SdpaShape& s, cudaStream_t stream) override {
    ++forward_calls;
    if (mode_ == Mode::kError) return Status::Internal("CUDNN_STATUS_EXECUTION_FAILED");
    TRAIND_RETURN_IF_ERROR(AttentionTcForward(out, lse, q, k, v, s.type, s.B, s.T, s.NH, s.NKV,
                                              s.HS, s.q_stride, s.kv_stride,
                                              {s.causal, nullptr, 0, nullptr}, stream));
    if (mode_ == Mode::kOffset) {
      // simt runs launches synchronously outside capture: the kernel's result is in place.
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < s.B * s.T * s.NH * s.HS; ++i)
        o[i] = F32ToBF16(BF16ToF32(o[i]) + offset_);
    }
    return Status::Ok();
  }
  int ready_calls = 0, forward_calls = 0;

 private:
  Status ready_, supports_;
  Mode mode_;
  float offset_;
};

SdpaShape Shape() {
  SdpaShape s;
  s.type = DType::kBF16;
  s.B = 2, s.T = 40, s.NH = 2, s.NKV = 2, s.HS = 64, s.q_stride = 3 * 128, s.kv_stride = 3 * 128;
  return s;
}

struct Lines {
  std::vector<std::string> v;
  SdpaSelector::Log log() {
    return [this](const std::string& l) { v.push_back(l); };
  }
};

Result<SdpaCheck> Passing() { return SdpaCheck{1e-4, 1.0, 1e-7, 3.0}; }

TEST(CudnnSdpaSelect, SwitchOffNeverConsultsThePath) {
  Lines lines;
  auto path = std::make_unique<FakePath>(Status::Ok(), Status::Ok(), FakePath::Mode::kExact);
  FakePath* fake = path.get();
  SdpaSelector sel(false, std::move(path), lines.log());
  int checks = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(sel.UsePath(Shape(), true, [&] {
      ++checks;
      return Passing();
    }));
  }
  EXPECT_EQ(checks, 0);
  EXPECT_EQ(fake->ready_calls, 0);
  EXPECT_TRUE(lines.v.empty());
}

TEST(CudnnSdpaSelect, AbsentLibraryFallsBackWithOneLine) {
  for (bool null_path : {true, false}) {
    Lines lines;
    std::unique_ptr<SdpaPath> path;
    if (!null_path)
      path = std::make_unique<FakePath>(
          Status::NotFound("libcudnn.so.9: cannot open shared object"), Status::Ok(),
          FakePath::Mode::kExact);
    SdpaSelector sel(true, std::move(path), lines.log());
    SdpaShape other = Shape();
    other.T = 77;
    for (int i = 0; i < 4; ++i) {
      EXPECT_FALSE(sel.UsePath(i % 2 ? other : Shape(), true, Passing));
    }
    ASSERT_EQ(lines.v.size(), 1u);
    EXPECT_NE(lines.v[0].find(null_path ? "this build has no cuDNN" : "libcudnn.so.9"),
              std::string::npos)
        << lines.v[0];
    EXPECT_NE(lines.v[0].find("traind's own kernels"), std::string::npos) << lines.v[0];
  }
}

TEST(CudnnSdpaSelect, UnsupportedShapeAndFailingCheckFallBackOncePerShape) {
  {
    Lines lines;
    SdpaSelector sel(true,
                     std::make_unique<FakePath>(Status::Ok(),
                                                Status::InvalidArgument("grouped-query attention"),
                                                FakePath::Mode::kExact),
                     lines.log());
    int checks = 0;
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(sel.UsePath(Shape(), true, [&] {
      ++checks;
      return Passing();
    }));
    EXPECT_EQ(checks, 0) << "an unsupported shape is not self-checked";
    ASSERT_EQ(lines.v.size(), 1u);
    EXPECT_NE(lines.v[0].find("unsupported shape bf16 B=2 T=40"), std::string::npos) << lines.v[0];
  }
  // Out beyond OutTol(bf16) x max|out|, an lse beyond kLseTol, a NaN, a check that errors.
  const SdpaCheck bad_out{0.011, 1.0, 0.0, 1.0}, bad_lse{0.0, 1.0, 1e-3, 2.0},
      nan_out{NAN, 1.0, 0.0, 1.0};
  for (int variant = 0; variant < 4; ++variant) {
    Lines lines;
    SdpaSelector sel(true,
                     std::make_unique<FakePath>(Status::Ok(), Status::Ok(), FakePath::Mode::kExact),
                     lines.log());
    int checks = 0;
    auto check = [&]() -> Result<SdpaCheck> {
      ++checks;
      if (variant == 0) return bad_out;
      if (variant == 1) return bad_lse;
      if (variant == 2) return nan_out;
      return Status::Internal("CUDNN_STATUS_EXECUTION_FAILED");
    };
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(sel.UsePath(Shape(), true, check)) << variant;
    EXPECT_EQ(checks, 1) << variant;
    ASSERT_EQ(lines.v.size(), 1u) << variant;
    EXPECT_NE(lines.v[0].find("self-check"), std::string::npos) << lines.v[0];
  }
  // Within tolerance: chosen, checked once; during capture an undecided shape is not checked.
  Lines lines;
  SdpaSelector sel(true,
                   std::make_unique<FakePath>(Status::Ok(), Status::Ok(), FakePath::Mode::kExact),
                   lines.log());
  int checks = 0;
  auto ok = [&] {
    ++checks;
    return Result<SdpaCheck>(SdpaCheck{0.0099, 1.0, 0.9e-5, 1.0});
  };
  EXPECT_FALSE(sel.UsePath(Shape(), false, ok));
  EXPECT_EQ(checks, 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(sel.UsePath(Shape(), true, ok));
  EXPECT_EQ(checks, 1);
  EXPECT_TRUE(lines.v.empty());
}

// Through the simt GpuBackend: a wrong path is caught by the self-check against the own
// tensor-core kernel (one line, the own kernel's bits from then on); an erroring path likewise;
// a correct path is taken (its Forward runs for every later call).
TEST(CudnnSdpaSelect, BackendFallsBackToItsOwnKernel) {
  const SdpaShape s = Shape();
  const int64_t N = s.B * s.T, QKV = s.q_stride;
  const auto host = testing::Random(static_cast<size_t>(N * QKV), 7);
  std::vector<uint16_t> qkv16(host.size());
  for (size_t i = 0; i < host.size(); ++i) qkv16[i] = F32ToBF16(host[i]);
  auto run = [&](std::unique_ptr<FakePath> path, Lines* lines, int calls, int* forwards) {
    auto be = MakeSimtBackend(1);
    EXPECT_TRUE(be.ok());
    auto* gpu = dynamic_cast<GpuBackend*>(be->get());
    FakePath* fake = path.get();
    if (path != nullptr) gpu->SetSdpaSelectorForTesting(
        std::make_unique<SdpaSelector>(true, std::move(path), lines->log()));
    Backend& d = **be;
    auto* qkv = static_cast<uint16_t*>(d.Alloc(qkv16.size() * 2));
    auto* out = static_cast<uint16_t*>(d.Alloc(static_cast<size_t>(N * s.NH * s.HS) * 2));
    auto* lse = static_cast<float*>(d.Alloc(static_cast<size_t>(s.B * s.NH * s.T) * 4));
    d.CopyHostToDevice(qkv, qkv16.data(), qkv16.size() * 2);
    for (int i = 0; i < calls; ++i) {
      d.AttentionForward16(out, lse, qkv, qkv + s.NH * s.HS, qkv + 2 * s.NH * s.HS, s.type, s.B,
                           s.T, s.NH, s.NKV, s.HS, s.q_stride, s.kv_stride, true);
    }
    std::vector<uint16_t> o(static_cast<size_t>(N * s.NH * s.HS));
    d.Synchronize();
    d.CopyDeviceToHost(o.data(), out, o.size() * 2);
    EXPECT_TRUE(d.status().ok()) << d.status().ToString();
    if (forwards != nullptr) *forwards = fake != nullptr ? fake->forward_calls : 0;
    d.Free(qkv);
    d.Free(out);
    d.Free(lse);
    return o;
  };
  Lines none;
  const auto own = run(nullptr, &none, 1, nullptr);  // switch off (the test environment's default)
  EXPECT_TRUE(none.v.empty());
  {
    Lines lines;
    int forwards = 0;
    const auto got = run(std::make_unique<FakePath>(Status::Ok(), Status::Ok(),
                                                    FakePath::Mode::kOffset, 0.25f),
                         &lines, 3, &forwards);
    EXPECT_EQ(got, own) << "a wrong path must not reach the output";
    ASSERT_EQ(lines.v.size(), 1u);
    EXPECT_NE(lines.v[0].find("against traind's kernel failed"), std::string::npos) << lines.v[0];
    EXPECT_EQ(forwards, 1) << "only the self-check runs the rejected path";
  }
  {
    Lines lines;
    int forwards = 0;
    const auto got = run(std::make_unique<FakePath>(Status::Ok(), Status::Ok(),
                                                    FakePath::Mode::kError),
                         &lines, 2, &forwards);
    EXPECT_EQ(got, own);
    ASSERT_EQ(lines.v.size(), 1u);
    EXPECT_NE(lines.v[0].find("CUDNN_STATUS_EXECUTION_FAILED"), std::string::npos) << lines.v[0];
  }
  {
    Lines lines;
    int forwards = 0;
    const auto got = run(std::make_unique<FakePath>(Status::Ok(), Status::Ok(),
                                                    FakePath::Mode::kExact),
                         &lines, 3, &forwards);
    EXPECT_EQ(got, own);
    EXPECT_TRUE(lines.v.empty());
    EXPECT_EQ(forwards, 1 + 3) << "the self-check, then every call";
  }
}

}  // namespace
}  // namespace traind::engine::gpu
