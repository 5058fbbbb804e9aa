// The real cuDNN SDPA path of the nvcc build (backend/cuda/cudnn_sdpa.cc) on a machine without a
// GPU: it is built (MakeCudnnSdpaPath is not null where CMake found cuDNN), it says which shapes it
// takes, and Ready() fails cleanly (libcudnn not found, or cudnnCreate without a device), so the
// selector falls back to the own kernels with one log line naming why. On a machine with a GPU
// Ready() succeeds (gpu_cudnn_sdpa_test then checks and times the path itself).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_sdpa.h"

namespace traind::engine::gpu {
namespace {

SdpaShape Gpt2() {
  SdpaShape s;
  s.type = DType::kBF16;
  s.B = 8, s.T = 1024, s.NH = 12, s.NKV = 12, s.HS = 64, s.q_stride = 2304, s.kv_stride = 2304;
  return s;
}

TEST(CudnnProbe, ShapesItTakes) {
  std::unique_ptr<SdpaPath> path = MakeCudnnSdpaPath();
  if (path == nullptr) GTEST_SKIP() << "built without cuDNN";
  EXPECT_EQ(path->name(), "cudnn");
  EXPECT_TRUE(path->Supports(Gpt2()).ok());
  SdpaShape s = Gpt2();
  s.NKV = 4;
  EXPECT_NE(path->Supports(s).message().find("grouped-query"), std::string::npos);
  s = Gpt2();
  s.HS = 256;
  EXPECT_FALSE(path->Supports(s).ok());
  s = Gpt2();
  s.type = DType::kF32;
  EXPECT_FALSE(path->Supports(s).ok());
  for (int m = 0; m < 3; ++m) {
    s = Gpt2();
    (m == 0 ? s.key_mask : m == 1 ? s.window : s.doc_start) = true;
    EXPECT_FALSE(path->Supports(s).ok()) << m;
  }
}

TEST(CudnnProbe, NoDeviceFallsBackWithOneLine) {
  std::unique_ptr<SdpaPath> path = MakeCudnnSdpaPath();
  if (path == nullptr) GTEST_SKIP() << "built without cuDNN";
  if (MakeCudaBackend(0).ok()) GTEST_SKIP() << "a GPU is present (gpu_cudnn_sdpa_test covers it)";
  std::vector<std::string> lines;
  SdpaSelector sel(true, std::move(path), [&](const std::string& l) { lines.push_back(l); });
  int checks = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(sel.UsePath(Gpt2(), true, [&]() -> Result<SdpaCheck> {
      ++checks;
      return SdpaCheck{};
    }));
  }
  EXPECT_EQ(checks, 0);
  ASSERT_EQ(lines.size(), 1u);
  std::printf("%s\n", lines[0].c_str());
  EXPECT_NE(lines[0].find("cuDNN SDPA not used"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine::gpu
