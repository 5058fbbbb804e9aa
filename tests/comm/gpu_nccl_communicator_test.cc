// The NCCL communicator on a real GPU (label gpu; registered only with -DTRAIND_GPU_TESTS=ON, on
// a machine with a CUDA device): a world of one in one process (NCCL refuses two ranks on one
// device), every collective on fp32, bf16 and f16 device buffers and on host buffers (staged)
// against host-computed expectations; the 16-bit cast kernels against a host round-to-nearest-even
// reference on values that need rounding.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "nccl_cast.h"
#include "traind/comm/nccl_communicator.h"
#include "free_port.h"

namespace traind::comm {
namespace {

using engine::CommDType;
using engine::Communicator;

using comm_test::FreePort;

std::unique_ptr<Communicator> OpenWorldOfOne() {
  DistributedOptions o;
  o.world_size = 1;
  o.rank = 0;
  o.master_port = FreePort();
  o.prefix = "gpu-nccl-test/" + std::to_string(o.master_port) + "/0/";
  o.rendezvous_timeout = std::chrono::milliseconds(30000);
  o.collective_timeout = std::chrono::milliseconds(30000);
  auto comm = OpenNcclCommunicator(o, 0);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

// Host references: round to nearest even, NaN stays NaN.
float Bf16ToF32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// f16 through the host's _Float16 (GCC on x86-64: IEEE binary16, round to nearest even).
uint16_t F32ToF16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float F16ToF32(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(d);
}
template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// n values per type: fp32 as is, 16-bit as bits (exact in their type).
std::vector<float> F32Values(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
std::vector<uint16_t> HalfValues(size_t n, CommDType t) {
  std::vector<uint16_t> v;
  for (float x : F32Values(n)) v.push_back(t == CommDType::kBF16 ? F32ToBf16(x) : F32ToF16(x));
  return v;
}

TEST(GpuNcclCommunicator, WorldOfOneEveryCollectiveEveryTypeDeviceAndHostBuffers) {
  auto comm = OpenWorldOfOne();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->name(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  const int64_t n = 100003;  // odd, more than one block of the cast kernels
  // fp32: with one rank every sum is the input itself, bit for bit.
  {
    const std::vector<float> x = F32Values(static_cast<size_t>(n));
    float* d = ToDevice(x);
    ASSERT_TRUE(comm->AllReduceSum(d, n, CommDType::kF32).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    float* out = ToDevice(std::vector<float>(x.size(), 0.f));
    ASSERT_TRUE(comm->ReduceScatterSum(d, out, n, CommDType::kF32).ok());
    EXPECT_EQ(ToHost(out, x.size()), x);
    ASSERT_TRUE(comm->AllGather(d, out, n, CommDType::kF32).ok());
    EXPECT_EQ(ToHost(out, x.size()), x);
    ASSERT_TRUE(comm->Broadcast(d, x.size() * 4, 0).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    // In place with a count per rank (one ncclReduce rooted at rank 0, in a group); an empty
    // range is nothing to do; a wrong number of counts is refused.
    ASSERT_TRUE(comm->ReduceScatterSumInPlace(d, {n}, CommDType::kF32).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    ASSERT_TRUE(comm->ReduceScatterSumInPlace(d, {0}, CommDType::kF32).ok());
    ASSERT_TRUE(comm->AllGatherInPlace(d, {n}, CommDType::kF32).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    EXPECT_EQ(comm->ReduceScatterSumInPlace(d, {n, 0}, CommDType::kF32).code(),
              Status::Code::kInvalidArgument);
    cudaFree(d);
    cudaFree(out);
  }
  // 16-bit: widened, summed in fp32, rounded back: values of the type come back unchanged.
  for (const CommDType t : {CommDType::kBF16, CommDType::kF16}) {
    SCOPED_TRACE(t == CommDType::kBF16 ? "bf16" : "f16");
    const std::vector<uint16_t> x = HalfValues(static_cast<size_t>(n), t);
    uint16_t* d = ToDevice(x);
    ASSERT_TRUE(comm->AllReduceSum(d, n, t).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    uint16_t* out = ToDevice(std::vector<uint16_t>(x.size(), 0));
    ASSERT_TRUE(comm->ReduceScatterSum(d, out, n, t).ok());
    EXPECT_EQ(ToHost(out, x.size()), x);
    ASSERT_TRUE(comm->AllGather(d, out, n, t).ok());
    EXPECT_EQ(ToHost(out, x.size()), x);
    ASSERT_TRUE(comm->ReduceScatterSumInPlace(d, {n}, t).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    ASSERT_TRUE(comm->AllGatherInPlace(d, {n}, t).ok());
    EXPECT_EQ(ToHost(d, x.size()), x);
    cudaFree(d);
    cudaFree(out);
  }
  // Host buffers (the trainer's scalar gathers) are staged through the device.
  {
    const double mine[2] = {1.25, -3.5};
    double all[2] = {0, 0};
    ASSERT_TRUE(comm->AllGather(mine, all, 4, CommDType::kF32).ok());
    EXPECT_EQ(all[0], 1.25);
    EXPECT_EQ(all[1], -3.5);
    std::vector<float> h = {1.f, 2.f, 3.f};
    ASSERT_TRUE(comm->AllReduceSum(h.data(), 3, CommDType::kF32).ok());
    EXPECT_EQ(h, (std::vector<float>{1.f, 2.f, 3.f}));
    ASSERT_TRUE(comm->ReduceScatterSumInPlace(h.data(), {3}, CommDType::kF32).ok());
    EXPECT_EQ(h, (std::vector<float>{1.f, 2.f, 3.f}));
    ASSERT_TRUE(comm->AllGatherInPlace(h.data(), {3}, CommDType::kF32).ok());
    EXPECT_EQ(h, (std::vector<float>{1.f, 2.f, 3.f}));
    std::vector<uint16_t> b = {F32ToBf16(0.5f), F32ToBf16(-2.f)};
    ASSERT_TRUE(comm->AllReduceSum(b.data(), 2, CommDType::kBF16).ok());
    EXPECT_EQ(Bf16ToF32(b[0]), 0.5f);
    EXPECT_EQ(Bf16ToF32(b[1]), -2.f);
  }
  EXPECT_TRUE(comm->Barrier().ok());
  const Status bad_root = comm->Broadcast(nullptr, 4, 1);
  EXPECT_EQ(bad_root.code(), Status::Code::kInvalidArgument) << bad_root.ToString();
}

TEST(GpuNcclCommunicator, CastKernelsRoundToNearestEven) {
  // fp32 values between representable 16-bit values (ties included), subnormals, inf, NaN.
  std::vector<float> x = F32Values(4096);
  for (float& v : x) v *= 1.0001f;
  const float specials[] = {0.f, -0.f, 1.f + 1.f / 256, 1.f + 3.f / 256, 1.f + 1.f / 2048,
                            1.f + 3.f / 2048, 6e-8f, 3e-5f, 70000.f, 65520.f, 1e38f,
                            INFINITY, -INFINITY, NAN};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(x.size());
  float* d = ToDevice(x);
  uint16_t* h = ToDevice(std::vector<uint16_t>(x.size(), 0));
  float* back = ToDevice(std::vector<float>(x.size(), 0.f));
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    ASSERT_EQ(NarrowFromF32(d, h, n, bf16, nullptr), cudaSuccess);
    ASSERT_EQ(WidenToF32(h, back, n, bf16, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> got = ToHost(h, x.size());
    const std::vector<float> widened = ToHost(back, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = bf16 ? F32ToBf16(x[i]) : F32ToF16(x[i]);
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(widened[i])) << i;
        continue;
      }
      ASSERT_EQ(got[i], want) << "element " << i << " = " << x[i];
      ASSERT_EQ(widened[i], bf16 ? Bf16ToF32(want) : F16ToF32(want)) << i;
    }
  }
  cudaFree(d);
  cudaFree(h);
  cudaFree(back);
}

}  // namespace
}  // namespace traind::comm
