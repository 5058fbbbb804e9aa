// Tests of the simt emulator itself: barriers, a planted missing __syncthreads caught by the
// seeded thread order, warp shuffles and votes, atomics, dynamic shared memory, bf16/fp16 math,
// multi-dimensional indices, deadlock detection and graph capture of the device layer.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/gpu_compat.h"

namespace traind::engine::gpu {
namespace {

// Tree reduction of 256 values in shared memory; `barrier` = false plants the classic race.
__global__ void tree_sum_kernel(const float* x, float* out, bool barrier) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = x[blockIdx.x * 256 + t];
  if (barrier) __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    // Without the barrier a thread may read s[t + stride] before its owner stored its partial.
    float other = 0.0f;
    if (t < stride) other = s[t + stride];
    if (barrier) __syncthreads();
    if (t < stride) s[t] += other;
    // A thread yields at every barrier; without them it runs to the end in one go.
    if (barrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

std::vector<float> RunTreeSum(const std::vector<float>& x, bool barrier) {
  const int blocks = static_cast<int>(x.size() / 256);
  std::vector<float> out(blocks, -1.0f);
  EXPECT_TRUE(
      GPU_LAUNCH(tree_sum_kernel, blocks, 256, 0, nullptr, x.data(), out.data(), barrier).ok());
  return out;
}

// x[i] = i: block b sums 256*b + t over t < 256.
float BlockSumOf(size_t b) { return 65536.0f * static_cast<float>(b) + 32640.0f; }

TEST(SimtEmulator, BarrierReductionIsExactForEverySeed) {
  std::vector<float> x(4 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);  // sums exact in fp32
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    simt::SetSeed(seed);
    const std::vector<float> out = RunTreeSum(x, true);
    for (size_t b = 0; b < out.size(); ++b) EXPECT_EQ(out[b], BlockSumOf(b)) << "seed " << seed;
  }
}

TEST(SimtEmulator, MissingSyncthreadsIsCaught) {
  std::vector<float> x(4 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  int wrong = 0;
  simt::SetWorkers(1);  // a fixed block-to-worker mapping: the outcome depends on the seed only
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    simt::SetSeed(seed);
    const std::vector<float> out = RunTreeSum(x, false);
    for (size_t b = 0; b < out.size(); ++b) wrong += out[b] != BlockSumOf(b);
  }
  simt::SetWorkers(2);
  simt::SetSeed(1);
  // Without barriers each thread runs alone in a random order, so partial sums are missed.
  // (Static __shared__ memory keeps the previous block's values, so inputs differ per block.)
  EXPECT_GT(wrong, 0) << "the planted race went unnoticed";
}

__global__ void shuffle_kernel(int* out) {
  const int lane = threadIdx.x % 32;
  int v = lane;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x * 6 + 0] = v;                                            // 496 everywhere
  out[threadIdx.x * 6 + 1] = __shfl_down_sync(0xffffffffu, lane * 10, 3);  // lane+3 or own
  out[threadIdx.x * 6 + 2] = __shfl_up_sync(0xffffffffu, lane * 10, 2);    // lane-2 or own
  out[threadIdx.x * 6 + 3] = __shfl_sync(0xffffffffu, lane * 10, 5);       // broadcast lane 5
  out[threadIdx.x * 6 + 4] = __shfl_xor_sync(0xffffffffu, lane, 8, 16);    // within 16-lane halves
  out[threadIdx.x * 6 + 5] = __shfl_sync(0xffffffffu, lane, 3, 8);         // lane 3 of each 8
}

TEST(SimtEmulator, WarpShuffles) {
  std::vector<int> out(64 * 6, -1);
  ASSERT_TRUE(GPU_LAUNCH(shuffle_kernel, 1, 64, 0, nullptr, out.data()).ok());
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(out[t * 6 + 0], 496);
    EXPECT_EQ(out[t * 6 + 1], lane + 3 < 32 ? (lane + 3) * 10 : lane * 10);
    EXPECT_EQ(out[t * 6 + 2], lane >= 2 ? (lane - 2) * 10 : lane * 10);
    EXPECT_EQ(out[t * 6 + 3], 50);
    EXPECT_EQ(out[t * 6 + 4], lane ^ 8);
    EXPECT_EQ(out[t * 6 + 5], (lane & ~7) + 3);
  }
}

__global__ void vote_kernel(unsigned* out) {
  const int lane = threadIdx.x % 32;
  out[threadIdx.x * 4 + 0] = __ballot_sync(0xffffffffu, lane % 2 == 0);
  out[threadIdx.x * 4 + 1] = __any_sync(0xffffffffu, lane == 7);
  out[threadIdx.x * 4 + 2] = __all_sync(0xffffffffu, lane < 31);
  out[threadIdx.x * 4 + 3] = __all_sync(0xffffffffu, lane < 32);
}

TEST(SimtEmulator, WarpVotes) {
  std::vector<unsigned> out(32 * 4, 9);
  ASSERT_TRUE(GPU_LAUNCH(vote_kernel, 1, 32, 0, nullptr, out.data()).ok());
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(out[t * 4 + 0], 0x55555555u);
    EXPECT_EQ(out[t * 4 + 1], 1u);
    EXPECT_EQ(out[t * 4 + 2], 0u);
    EXPECT_EQ(out[t * 4 + 3], 1u);
  }
}

// Half-warp masks used by each half separately, a last warp of 8 lanes with a full mask, and a
// __syncwarp between writes and reads of shared memory within a warp.
__global__ void partial_warp_kernel(int* out) {
  __shared__ int s[40];
  const int lane = threadIdx.x % 32;
  int v = lane;
  if (lane < 16) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0x0000ffffu, v, o);
  } else {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffff0000u, v, o);
  }
  s[threadIdx.x] = v;
  __syncwarp();
  out[threadIdx.x] = s[threadIdx.x ^ 1];  // the partner lane's value, written before the sync
}

TEST(SimtEmulator, PartialMasksAndPartialWarps) {
  std::vector<int> out(40, -1);
  ASSERT_TRUE(GPU_LAUNCH(partial_warp_kernel, 1, 40, 0, nullptr, out.data()).ok());
  for (int t = 0; t < 32; ++t) EXPECT_EQ(out[t], t < 16 ? 120 : 376) << t;  // 0+..+15, 16+..+31
  // The last warp has lanes 32..39 (lane ids 0..7): its halves are lanes 0..7 and nothing.
  for (int t = 32; t < 40; ++t) EXPECT_EQ(out[t], 28) << t;  // 0+..+7
}

__global__ void atomics_kernel(float* fsum, int* isum, int* imax, unsigned* cas_count) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(fsum, 1.0f);
  atomicAdd(isum, g);
  atomicMax(imax, g);
  // Increment through a CAS loop.
  unsigned old = *cas_count, assumed;
  do {
    assumed = old;
    old = atomicCAS(cas_count, assumed, assumed + 1);
  } while (old != assumed);
}

TEST(SimtEmulator, AtomicsAcrossConcurrentBlocks) {
  simt::SetWorkers(4);  // more workers than cores: blocks really interleave
  float fsum = 0.0f;
  int isum = 0, imax = -1;
  unsigned cas = 0;
  ASSERT_TRUE(GPU_LAUNCH(atomics_kernel, 64, 128, 0, nullptr, &fsum, &isum, &imax, &cas).ok());
  simt::SetWorkers(2);
  const int n = 64 * 128;
  EXPECT_EQ(fsum, static_cast<float>(n));
  EXPECT_EQ(isum, n * (n - 1) / 2);
  EXPECT_EQ(imax, n - 1);
  EXPECT_EQ(cas, static_cast<unsigned>(n));
}

__global__ void reverse_kernel(const float* x, float* y, int n) {
  GPU_DYNAMIC_SHARED(float, s);
  const int t = threadIdx.x;
  if (t < n) s[t] = x[blockIdx.x * n + t];
  __syncthreads();
  if (t < n) y[blockIdx.x * n + t] = s[n - 1 - t];
}

TEST(SimtEmulator, DynamicSharedMemory) {
  const int n = 100;  // ragged: 128 threads, 100 used
  std::vector<float> x(3 * n), y(3 * n, 0.0f);
  for (int i = 0; i < 3 * n; ++i) x[i] = static_cast<float>(i);
  ASSERT_TRUE(
      GPU_LAUNCH(reverse_kernel, 3, 128, n * sizeof(float), nullptr, x.data(), y.data(), n).ok());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < n; ++t) EXPECT_EQ(y[b * n + t], x[b * n + n - 1 - t]);
}

TEST(SimtEmulator, RejectsBadLaunchConfigurations) {
  std::vector<float> x(256), y(256);
  EXPECT_FALSE(GPU_LAUNCH(reverse_kernel, 1, 2048, 0, nullptr, x.data(), y.data(), 1).ok());
  EXPECT_FALSE(GPU_LAUNCH(reverse_kernel, 1, 32, 64 * 1024, nullptr, x.data(), y.data(), 1).ok());
  EXPECT_FALSE(GPU_LAUNCH(reverse_kernel, 0, 32, 0, nullptr, x.data(), y.data(), 1).ok());
}

__global__ void half_math_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __nv_bfloat16 a = __float2bfloat16_rn(x[i]);
  const __nv_bfloat16 b = __float2bfloat16_rn(2.0f);
  y[3 * i + 0] = __bfloat162float(a * b + a);  // bf16 arithmetic (rounded per op)
  y[3 * i + 1] = __bfloat162float(a);
  y[3 * i + 2] = __half2float(__float2half_rn(x[i]));
}

TEST(SimtEmulator, Bf16AndHalfMath) {
  const std::vector<float> x = {1.0f,     1.00390625f, 1.005859375f, -3.14159f,
                                65504.0f, 1e-3f,       70000.0f};
  std::vector<float> y(3 * x.size());
  ASSERT_TRUE(GPU_LAUNCH(half_math_kernel, 1, 32, 0, nullptr, x.data(), y.data(),
                         static_cast<int>(x.size()))
                  .ok());
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[3 * 1 + 1], 1.0f);        // 1 + 2^-8: tie, rounds to even (1.0)
  EXPECT_EQ(y[3 * 2 + 1], 1.0078125f);  // 1 + 1.5*2^-8 rounds up
  EXPECT_EQ(y[3 * 0 + 0], 3.0f);
  EXPECT_NEAR(y[3 * 3 + 1], -3.140625f, 0.0f);
  EXPECT_EQ(y[3 * 4 + 2], 65504.0f);      // largest half
  EXPECT_TRUE(std::isinf(y[3 * 6 + 2]));  // overflows half
  EXPECT_NEAR(y[3 * 5 + 2], 1e-3f, 1e-6f);
}

__global__ void index_kernel(int* out) {
  const int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

TEST(SimtEmulator, MultiDimensionalIndices) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  std::vector<int> out(12 * 24, -1);
  ASSERT_TRUE(GPU_LAUNCH(index_kernel, grid, block, 0, nullptr, out.data()).ok());
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) EXPECT_EQ(out[b * 24 + t], b * 1000 + t);
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();  // half the block never arrives... and never exits first
  if (threadIdx.x >= 16) __shfl_sync(0xffffffffu, 1, 0);
  out[threadIdx.x] = 1;
}

TEST(SimtEmulatorDeathTest, DeadlockIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(32);
  EXPECT_DEATH((void)GPU_LAUNCH(divergent_barrier_kernel, 1, 32, 0, nullptr, out.data()),
               "deadlock");
}

__global__ void deep_stack_kernel(int* out) {
  volatile char big[256 * 1024];  // past the 64 KiB fiber stack
  for (int i = 0; i < 256 * 1024; i += 4096) big[i] = static_cast<char>(i);
  out[threadIdx.x] = big[threadIdx.x * 4096];
}

TEST(SimtEmulatorDeathTest, StackOverflowFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(1);
  EXPECT_DEATH((void)GPU_LAUNCH(deep_stack_kernel, 1, 1, 0, nullptr, out.data()), "");
}

__global__ void axpy_kernel(float* y, const float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

TEST(SimtEmulator, GraphCaptureRecordsAndReplays) {
  cudaStream_t s = nullptr;
  ASSERT_TRUE(dev::StreamCreate(&s).ok());
  const int n = 1000;
  void* xp = nullptr;
  void* yp = nullptr;
  ASSERT_TRUE(dev::Malloc(&xp, n * sizeof(float)).ok());
  ASSERT_TRUE(dev::Malloc(&yp, n * sizeof(float)).ok());
  float* x = static_cast<float*>(xp);
  float* y = static_cast<float*>(yp);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  ASSERT_TRUE(dev::BeginCapture(s).ok());
  ASSERT_TRUE(dev::MemsetAsync(y, 0, n * sizeof(float), s).ok());
  ASSERT_TRUE(GPU_LAUNCH(axpy_kernel, 4, 256, 0, s, y, x, 2.0f, n).ok());
  ASSERT_TRUE(GPU_LAUNCH(axpy_kernel, 4, 256, 0, s, y, x, 1.0f, n).ok());
  y[10] = -5.0f;  // capture records, it does not run
  cudaGraphExec_t g = nullptr;
  ASSERT_TRUE(dev::EndCapture(s, &g).ok());
  EXPECT_EQ(y[10], -5.0f);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_TRUE(dev::GraphLaunch(g, s).ok());
    ASSERT_TRUE(dev::StreamSynchronize(s).ok());
    for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], 3.0f * i);
  }
  EXPECT_TRUE(dev::GraphDestroy(g).ok());
  EXPECT_TRUE(dev::Free(xp).ok());
  EXPECT_TRUE(dev::Free(yp).ok());
  EXPECT_TRUE(dev::StreamDestroy(s).ok());
}

}  // namespace
}  // namespace traind::engine::gpu
