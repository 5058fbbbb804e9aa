// cuDNN's fused SDPA path (backend/cuda/cudnn_sdpa.h) on a real GPU: its self-check against the
// own tensor-core kernel on the GPT-2 124M attention (bf16, B=8, T=1024, 12 heads of 64, causal,
// fused qkv rows) and the llama-like one (fp16, B=2, T=2048, 16 heads of 128), and both paths
// timed, printed as TIMING lines that bench/gpu_run.sh collects. Device only (run by
// bench/gpu_run.sh; its simt twin of the selection is cudnn_sdpa_select_test). Skips where the
// build has no cuDNN or there is no GPU. Whatever the timings say, the switch stays off by default:
// docs/gpu.md records which path a GPU run showed faster.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_sdpa.h"
#include "backend/cuda/gpu_backend.h"
#include "core/half.h"

namespace traind::engine::gpu {
namespace {

struct Case {
  DType type;
  int64_t B, T, NH, HS;
};

// Milliseconds per call of AttentionForward16 on `be` (median of 5 batches of 10 calls).
double TimeForward(Backend& be, void* out, float* lse, const uint16_t* qkv, const Case& c) {
  const int64_t QW = c.NH * c.HS, stride = 3 * QW;
  auto call = [&] {
    be.AttentionForward16(out, lse, qkv, qkv + QW, qkv + 2 * QW, c.type, c.B, c.T, c.NH, c.NH,
                          c.HS, stride, stride, true);
  };
  call();
  be.Synchronize();
  std::vector<double> ms;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) call();
    be.Synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count() / 10.0);
  }
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

TEST(GpuCudnnSdpa, SelfCheckAndTiming) {
  if (MakeCudnnSdpaPath() == nullptr) GTEST_SKIP() << "this build has no cuDNN";
  for (const Case& c : {Case{DType::kBF16, 8, 1024, 12, 64}, Case{DType::kF16, 2, 2048, 16, 128}}) {
    auto made = MakeCudaBackend(0);
    if (!made.ok()) GTEST_SKIP() << made.status().ToString();
    Backend& be = **made;
    auto* gpu = dynamic_cast<GpuBackend*>(&be);
    ASSERT_NE(gpu, nullptr);
    std::vector<std::string> lines;
    gpu->SetSdpaSelectorForTesting(std::make_unique<SdpaSelector>(
        true, MakeCudnnSdpaPath(), [&](const std::string& l) {
          lines.push_back(l);
          std::printf("LOG %s\n", l.c_str());
        }));
    const int64_t N = c.B * c.T, QW = c.NH * c.HS;
    std::vector<uint16_t> host(static_cast<size_t>(N * 3 * QW));
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (uint16_t& h : host) h = c.type == DType::kBF16 ? F32ToBF16(d(rng)) : F32ToF16(d(rng));
    auto* qkv = static_cast<uint16_t*>(be.Alloc(host.size() * 2));
    void* out = be.Alloc(static_cast<size_t>(N * QW) * 2);
    auto* lse = static_cast<float*>(be.Alloc(static_cast<size_t>(c.B * c.NH * c.T) * 4));
    be.CopyHostToDevice(qkv, host.data(), host.size() * 2);
    const double cudnn_ms = TimeForward(be, out, lse, qkv, c);  // the first call self-checks
    EXPECT_TRUE(gpu->status().ok()) << gpu->status().ToString();
    // Now the own kernel alone: a selector with the switch off.
    gpu->SetSdpaSelectorForTesting(std::make_unique<SdpaSelector>(false, nullptr));
    const double own_ms = TimeForward(be, out, lse, qkv, c);
    const double flops = 4.0 * c.B * c.NH * c.HS * static_cast<double>(c.T) * c.T / 2;  // causal
    std::printf("TIMING cudnn_sdpa_forward %s B=%lld T=%lld NH=%lld HS=%lld: self-check %s, "
                "cuDNN %.3f ms (%.1f TFLOP/s), own %.3f ms (%.1f TFLOP/s)\n",
                DTypeName(c.type), static_cast<long long>(c.B), static_cast<long long>(c.T),
                static_cast<long long>(c.NH), static_cast<long long>(c.HS),
                lines.empty() ? "passed" : "FAILED (own kernel timed twice)", cudnn_ms,
                flops / cudnn_ms / 1e9, own_ms, flops / own_ms / 1e9);
    EXPECT_TRUE(lines.empty()) << "cuDNN's path fell back: " << (lines.empty() ? "" : lines[0]);
    be.Free(qkv);
    be.Free(out);
    be.Free(lse);
  }
}

}  // namespace
}  // namespace traind::engine::gpu
