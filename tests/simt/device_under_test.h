// The device the tests in this folder compare with the CPU backend: the simt emulator (the
// simt_* binaries, run in CI), or CUDA device 0 in the gpu_* binaries built from the same sources
// with TRAIND_TEST_ON_CUDA (registered with ctest, label `gpu`, only when configured with
// -DTRAIND_GPU_TESTS=ON on a machine with a GPU; see tests/simt/CMakeLists.txt).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "traind/engine/status.h"

namespace traind::engine::testing {

#if defined(TRAIND_TEST_ON_CUDA)
inline constexpr const char* kDeviceUnderTest = "cuda:0";
inline Result<std::unique_ptr<Backend>> MakeDeviceUnderTest() { return MakeCudaBackend(0); }
#else
inline constexpr const char* kDeviceUnderTest = "simt";
inline Result<std::unique_ptr<Backend>> MakeDeviceUnderTest() { return MakeSimtBackend(1); }
#endif

}  // namespace traind::engine::testing
