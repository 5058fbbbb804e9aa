// The device the tests in this folder compare with the CPU backend: the simt emulator (the
// simt_* binaries, run in CI), or CUDA device 0 in the gpu_* binaries built from the same sources
// with TRAIND_TEST_ON_CUDA (registered with ctest, label `gpu`, only when configured with
// -DTRAIND_GPU_TESTS=ON on a machine with a GPU; see tests/simt/CMakeLists.txt).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "traind/engine/status.h"

namespace traind::engine::testing {

// The CUDA kernels compute attention in fp32 whatever the operand type. The CPU backend they are
// compared with rounds attention's operands to bf16 under bf16 compute where its CPU can (as
// PyTorch autocast does; checked against its fp32 kernels in cpu_attention_test), which moves a
// tiny model's gradients by a few percent through the softmax: here the CPU reference computes
// attention in fp32 as the device does, so the comparisons keep their 16-bit GEMM tolerances.
inline const bool kCpuAttentionInFp32 = [] {
  cpu::SetBf16AttentionTilesForTesting(false);
  return true;
}();

#if defined(TRAIND_TEST_ON_CUDA)
inline constexpr const char* kDeviceUnderTest = "cuda:0";
inline Result<std::unique_ptr<Backend>> MakeDeviceUnderTest() { return MakeCudaBackend(0); }
#else
inline constexpr const char* kDeviceUnderTest = "simt";
inline Result<std::unique_ptr<Backend>> MakeDeviceUnderTest() { return MakeSimtBackend(1); }
#endif

}  // namespace traind::engine::testing
