// The nvcc-built CUDA backend links, and on a machine without a GPU MakeCudaBackend fails cleanly
// with FAILED_PRECONDITION "no CUDA device". On a machine with a GPU it creates the backend and
// checks one kernel and one cuBLASLt GEMM against hand-computed values.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_backend.h"

namespace traind::engine {
namespace {

TEST(CudaBackend, NoDeviceIsACleanError) {
  auto made = MakeCudaBackend(0);
  if (!made.ok()) {
    EXPECT_EQ(made.status().code(), Status::Code::kFailedPrecondition) << made.status().ToString();
    EXPECT_NE(made.status().message().find("no CUDA device"), std::string::npos)
        << made.status().message();
    std::printf("MakeCudaBackend(0): %s\n", made.status().ToString().c_str());
    return;
  }
  // A device is present: a minimal smoke check (never run in CI: no GPU there).
  Backend& be = *made.value();
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c(4);
  void* da = be.Alloc(16);
  void* db = be.Alloc(16);
  void* dc = be.Alloc(16);
  be.CopyHostToDevice(da, a.data(), 16);
  be.CopyHostToDevice(db, b.data(), 16);
  be.Gemm(false, false, 2, 2, 2, 1.0f, da, 2, db, 2, 0.0f, dc, 2);
  be.Add(static_cast<float*>(dc), static_cast<float*>(dc), static_cast<float*>(da), 4);
  be.CopyDeviceToHost(c.data(), dc, 16);
  EXPECT_EQ(c, (std::vector<float>{20, 24, 46, 54}));
  be.Free(da);
  be.Free(db);
  be.Free(dc);
}

TEST(CudaBackend, BadDeviceIndexIsAnError) {
  auto made = MakeCudaBackend(1 << 20);
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(made.status().code() == Status::Code::kFailedPrecondition ||
              made.status().code() == Status::Code::kInvalidArgument)
      << made.status().ToString();
}

// When the cuBLASLt epilogues may be used (host-side rule, no device needed): bias and GELU-input
// pointers 16-byte aligned and, with GELU, a row stride divisible by 8; otherwise the CUDA
// backend's LinearForward falls back to the separate kernels.
TEST(CublasLtEpilogue, FusionRules) {
  alignas(16) float buf[64] = {};
  gpu::GemmEpilogue none;
  EXPECT_TRUE(gpu::CublasLtGemm::CanFuse(none, 7));
  gpu::GemmEpilogue bias;
  bias.bias = buf;
  EXPECT_TRUE(gpu::CublasLtGemm::CanFuse(bias, 7));  // a bias alone has no stride rule
  bias.bias = buf + 1;                                // a view 4 bytes into the buffer
  EXPECT_FALSE(gpu::CublasLtGemm::CanFuse(bias, 8));
  gpu::GemmEpilogue gelu;
  gelu.bias = buf;
  gelu.gelu_input = buf + 4;
  EXPECT_TRUE(gpu::CublasLtGemm::CanFuse(gelu, 1024));
  EXPECT_FALSE(gpu::CublasLtGemm::CanFuse(gelu, 1020));  // stride not a multiple of 8
  gelu.gelu_input = buf + 2;
  EXPECT_FALSE(gpu::CublasLtGemm::CanFuse(gelu, 1024));  // GELU input not 16-byte aligned
}

}  // namespace
}  // namespace traind::engine
