// Device capabilities (traind/engine/devices.h): the cpu backend answers from the registry's
// table, the table says what each device's policy is, and a device name is looked up (auto
// resolved, a bad name refused). And the engine's one reader of environment variables
// (core/environment.h), through a fake environment.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "backend/backend.h"
#include "backend/device_registry.h"
#include "core/environment.h"
#include "traind/engine/devices.h"

namespace traind::engine {
namespace {

TEST(DeviceCapabilities, CpuBackendAnswersFromTheTable) {
  const DeviceCapabilities cpu = MakeCpuBackend(1)->capabilities();
  const DeviceCapabilities table = DeviceCapabilitiesOf(DeviceKind::kCpu);
  EXPECT_EQ(cpu.ops_complete_on_return, table.ops_complete_on_return);
  EXPECT_EQ(cpu.has_own_memory, table.has_own_memory);
  EXPECT_EQ(cpu.packs_gemm_weights, table.packs_gemm_weights);
  EXPECT_EQ(cpu.tensor_cores, table.tensor_cores);
  EXPECT_EQ(cpu.device_collective, table.device_collective);
  // The policies the trainer took from the name "cpu" before: updates overlap backward, no
  // memory of its own (offload updates on the device, any host communicator reduces it), packed
  // GEMM weights, no TF32.
  EXPECT_TRUE(cpu.ops_complete_on_return);
  EXPECT_TRUE(cpu.update_overlaps_backward());
  EXPECT_FALSE(cpu.has_own_memory);
  EXPECT_TRUE(cpu.packs_gemm_weights);
  EXPECT_FALSE(cpu.tensor_cores);
  EXPECT_TRUE(cpu.data_parallel());
}

TEST(DeviceCapabilities, TableByDevice) {
  const DeviceCapabilities cuda = DeviceCapabilitiesOf(DeviceKind::kCuda);
  EXPECT_FALSE(cuda.ops_complete_on_return);
  EXPECT_TRUE(cuda.has_own_memory);
  EXPECT_FALSE(cuda.packs_gemm_weights);
  EXPECT_TRUE(cuda.tensor_cores);
  EXPECT_EQ(cuda.device_collective, "nccl");
  EXPECT_TRUE(cuda.data_parallel());

  // simt: the CUDA kernels on host memory, but a device of its own to the trainer; no NCCL, so
  // no data parallel, and no TF32.
  const DeviceCapabilities simt = DeviceCapabilitiesOf(DeviceKind::kSimt);
  EXPECT_FALSE(simt.ops_complete_on_return);
  EXPECT_FALSE(simt.update_overlaps_backward());
  EXPECT_TRUE(simt.has_own_memory);
  EXPECT_FALSE(simt.tensor_cores);
  EXPECT_FALSE(simt.data_parallel());

  // A backend that does not say (a test double) gets the cautious default: async ops, its own
  // memory, no data parallel.
  const DeviceCapabilities none;
  EXPECT_FALSE(none.update_overlaps_backward());
  EXPECT_TRUE(none.has_own_memory);
  EXPECT_FALSE(none.data_parallel());
}

TEST(DeviceCapabilities, ByName) {
  Result<DeviceCapabilities> cpu = DeviceCapabilitiesOf("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_FALSE(cpu->has_own_memory);
  Result<DeviceCapabilities> cuda = DeviceCapabilitiesOf("cuda:3");  // no device needed
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  EXPECT_EQ(cuda->device_collective, "nccl");
  Result<DeviceCapabilities> simt = DeviceCapabilitiesOf("simt");
  ASSERT_TRUE(simt.ok());
  EXPECT_FALSE(simt->data_parallel());
  // auto: as RunJob resolves it (this test binary registers no CUDA backend: the CPU).
  Result<DeviceCapabilities> automatic = DeviceCapabilitiesOf("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_FALSE(automatic->has_own_memory);
  Result<DeviceCapabilities> bad = DeviceCapabilitiesOf("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
}

// A fake environment for ReadEngineEnvironment.
std::map<std::string, std::string>* g_env = nullptr;
const char* FakeGetenv(const char* name) {
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

TEST(EngineEnvironment, ReadsEveryVariable) {
  std::map<std::string, std::string> env;
  g_env = &env;
  EngineEnvironment e = ReadEngineEnvironment(FakeGetenv);  // nothing set: the defaults
  EXPECT_FALSE(e.dist_bucket_mb.has_value());
  EXPECT_FALSE(e.cuda_graphs_off);
  EXPECT_FALSE(e.cpu_gemm_openblas);
  EXPECT_FALSE(e.cublaslt_epilogues_off);
  EXPECT_EQ(e.sentencepiece_shim, "");
  EXPECT_EQ(e.token_cache_dir, "");
  EXPECT_FALSE(e.simt_seed.has_value());

  env = {{"TRAIND_DIST_BUCKET_MB", "0.5"}, {"TRAIND_CUDA_GRAPHS", "0"},
         {"TRAIND_CPU_GEMM", "openblas"}, {"TRAIND_CUBLASLT_EPILOGUES", "0"},
         {"TRAIND_SENTENCEPIECE_SHIM", "/x/shim.so"}, {"HOME", "/home/u"},
         {"TRAIND_SIMT_SEED", "7"}, {"TRAIND_SIMT_WORKERS", "3"}, {"TRAIND_SIMT_STACK_KB", "128"}};
  e = ReadEngineEnvironment(FakeGetenv);
  EXPECT_EQ(e.dist_bucket_mb.value_or(""), "0.5");
  EXPECT_TRUE(e.cuda_graphs_off);
  EXPECT_TRUE(e.cpu_gemm_openblas);
  EXPECT_TRUE(e.cublaslt_epilogues_off);
  EXPECT_EQ(e.sentencepiece_shim, "/x/shim.so");
  EXPECT_EQ(e.token_cache_dir, "/home/u/.cache/traind/tokens");
  EXPECT_EQ(e.simt_seed.value_or(0), 7u);
  EXPECT_EQ(e.simt_workers.value_or(0), 3u);
  EXPECT_EQ(e.simt_stack_kb.value_or(0), 128u);

  // The token cache: TRAIND_TOKEN_CACHE_DIR over XDG_CACHE_HOME over HOME; an empty value is
  // unset. Only "0" turns graphs or epilogues off; only "openblas" picks OpenBLAS.
  env = {{"XDG_CACHE_HOME", "/xdg"}, {"HOME", "/home/u"}, {"TRAIND_CUDA_GRAPHS", "1"},
         {"TRAIND_CPU_GEMM", "dnnl"}, {"TRAIND_DIST_BUCKET_MB", ""}};
  e = ReadEngineEnvironment(FakeGetenv);
  EXPECT_EQ(e.token_cache_dir, "/xdg/traind/tokens");
  EXPECT_FALSE(e.cuda_graphs_off);
  EXPECT_FALSE(e.cpu_gemm_openblas);
  EXPECT_FALSE(e.dist_bucket_mb.has_value());
  env["TRAIND_TOKEN_CACHE_DIR"] = "/cache";
  EXPECT_EQ(ReadEngineEnvironment(FakeGetenv).token_cache_dir, "/cache");
  g_env = nullptr;
}

}  // namespace
}  // namespace traind::engine
