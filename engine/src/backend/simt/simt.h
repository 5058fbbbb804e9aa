// simt: compiles CUDA kernel source with a host C++ compiler and runs it on CPU fibers.
// Include this (through backend/cuda/gpu_compat.h) instead of the CUDA runtime when not under nvcc.
// One ucontext fiber per CUDA thread, blocks spread over worker threads, barriers and warp
// shuffles/votes as fiber switches, threads resumed in a seeded random order between barriers.
// How it works and what it catches: docs/simt.md.
#pragma once

#if defined(__CUDACC__)
#error "simt.h is for host compilers; under nvcc include the CUDA runtime instead"
#endif

// Outside nvcc, crt/host_defines.h defines __shared__ (as nothing) only when it is not defined
// yet; a CUDA header may already have been included, so it is redefined after them. Per-block
// shared memory is a thread_local of the worker thread that runs the block's fibers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <driver_types.h>
#include <vector_types.h>
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#include <math.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace simt {

// ---- configuration (process-wide; set before launches, not during) ----
// Seed of the thread order between barriers. Default 1, or $TRAIND_SIMT_SEED.
void SetSeed(uint64_t seed);
uint64_t Seed();
// Worker threads that run blocks (default: hardware threads, or $TRAIND_SIMT_WORKERS).
void SetWorkers(int workers);
// Number of kernel launches executed since process start (graph replays count each kernel).
uint64_t LaunchCount();

namespace detail {

// Per-fiber / per-block built-in variables (the worker sets them before resuming a fiber).
extern thread_local uint3 tl_thread_idx;
extern thread_local uint3 tl_block_idx;
extern thread_local dim3 tl_block_dim;
extern thread_local dim3 tl_grid_dim;

void BlockBarrier();
// Warp exchange: publishes `value` for the calling lane, waits for the lanes of `mask` and
// returns the slot array of this exchange (32 entries, indexed by lane).
const uint64_t* WarpExchangeImpl(unsigned mask, uint64_t value);
inline const uint64_t* WarpExchange(unsigned mask, uint64_t value) {
  asm volatile("" ::: "memory");
  const uint64_t* r = WarpExchangeImpl(mask, value);
  asm volatile("" ::: "memory");
  return r;
}
int LaneId();
unsigned char* DynamicShared();

// Emulated stream: launches run synchronously unless the stream is capturing into a graph.
struct StreamState {
  std::vector<std::function<void()>>* capture = nullptr;
};
StreamState* StateOf(cudaStream_t stream);  // nullptr for the legacy default stream

cudaError_t RunGrid(const char* name, dim3 grid, dim3 block, size_t shmem,
                    const std::function<void()>& body);
cudaError_t ValidateLaunch(dim3 grid, dim3 block, size_t shmem);

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "shuffle of a type over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace detail

// Launches `kernel` over grid x block on `stream` (the emulated form of kernel<<<...>>>(args)).
// Runs to completion before returning, unless `stream` is capturing (then it is recorded).
template <typename... P, typename... A>
cudaError_t Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
  cudaError_t err = detail::ValidateLaunch(grid, block, shmem);
  if (err != cudaSuccess) return err;
  std::function<void()> body = [kernel,
                                tup = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)]() {
    std::apply(kernel, tup);
  };
  detail::StreamState* st = detail::StateOf(stream);
  if (st != nullptr && st->capture != nullptr) {
    st->capture->push_back(
        [name, grid, block, shmem, body]() { detail::RunGrid(name, grid, block, shmem, body); });
    return cudaSuccess;
  }
  return detail::RunGrid(name, grid, block, shmem, body);
}

}  // namespace simt

// ---- CUDA built-ins ----
#define threadIdx (static_cast<const uint3&>(::simt::detail::tl_thread_idx))
#define blockIdx (static_cast<const uint3&>(::simt::detail::tl_block_idx))
#define blockDim (static_cast<const dim3&>(::simt::detail::tl_block_dim))
#define gridDim (static_cast<const dim3&>(::simt::detail::tl_grid_dim))
constexpr int warpSize = 32;

// Each sync op is also a compiler memory barrier: __shared__ arrays are function-local statics
// whose address never escapes, so without it GCC may keep them in registers across the switch.
#define SIMT_COMPILER_FENCE() asm volatile("" ::: "memory")
inline void __syncthreads() {
  SIMT_COMPILER_FENCE();
  ::simt::detail::BlockBarrier();
  SIMT_COMPILER_FENCE();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  SIMT_COMPILER_FENCE();
  ::simt::detail::WarpExchange(mask, 0);
  SIMT_COMPILER_FENCE();
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Shuffles: lanes outside [0, width) of the caller's segment read their own value, as on a GPU.
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, ::simt::detail::ToBits(var));
  const int lane = ::simt::detail::LaneId();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return ::simt::detail::FromBits<T>(s[src]);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, ::simt::detail::ToBits(var));
  const int lane = ::simt::detail::LaneId();
  const int src = lane ^ lane_mask;
  const bool inside = (src & ~(width - 1)) == (lane & ~(width - 1));
  return inside ? ::simt::detail::FromBits<T>(s[src]) : var;
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, ::simt::detail::ToBits(var));
  const int lane = ::simt::detail::LaneId();
  const int src = lane + static_cast<int>(delta);
  const bool inside = (src & ~(width - 1)) == (lane & ~(width - 1));
  return inside ? ::simt::detail::FromBits<T>(s[src]) : var;
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, ::simt::detail::ToBits(var));
  const int lane = ::simt::detail::LaneId();
  const int src = lane - static_cast<int>(delta);
  const bool inside = src >= 0 && (src & ~(width - 1)) == (lane & ~(width - 1));
  return inside ? ::simt::detail::FromBits<T>(s[src]) : var;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, pred != 0 ? 1 : 0);
  unsigned out = 0;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && s[l] == 1) out |= 1u << l;
  return out;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
  const uint64_t* s = ::simt::detail::WarpExchange(mask, pred != 0 ? 1 : 0);
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && s[l] == 0) return 0;
  return 1;
}

// Atomics: blocks run concurrently on worker threads, so these are real host atomics.
template <typename T>
T simt_atomic_add_(T* a, T v) {
  return std::atomic_ref<T>(*a).fetch_add(v, std::memory_order_relaxed);
}
inline float atomicAdd(float* a, float v) { return simt_atomic_add_(a, v); }
inline double atomicAdd(double* a, double v) { return simt_atomic_add_(a, v); }
inline int atomicAdd(int* a, int v) { return simt_atomic_add_(a, v); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return simt_atomic_add_(a, v); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return simt_atomic_add_(a, v);
}
template <typename T>
T simt_atomic_max_(T* a, T v) {
  std::atomic_ref<T> r(*a);
  T old = r.load(std::memory_order_relaxed);
  while (old < v && !r.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T simt_atomic_min_(T* a, T v) {
  std::atomic_ref<T> r(*a);
  T old = r.load(std::memory_order_relaxed);
  while (v < old && !r.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
inline int atomicMax(int* a, int v) { return simt_atomic_max_(a, v); }
inline unsigned atomicMax(unsigned* a, unsigned v) { return simt_atomic_max_(a, v); }
inline int atomicMin(int* a, int v) { return simt_atomic_min_(a, v); }
inline unsigned atomicMin(unsigned* a, unsigned v) { return simt_atomic_min_(a, v); }
inline int atomicOr(int* a, int v) {
  return std::atomic_ref<int>(*a).fetch_or(v, std::memory_order_relaxed);
}
inline unsigned atomicOr(unsigned* a, unsigned v) {
  return std::atomic_ref<unsigned>(*a).fetch_or(v, std::memory_order_relaxed);
}
inline int atomicExch(int* a, int v) { return std::atomic_ref<int>(*a).exchange(v); }
inline float atomicExch(float* a, float v) { return std::atomic_ref<float>(*a).exchange(v); }
template <typename T>
T simt_atomic_cas_(T* a, T compare, T v) {
  std::atomic_ref<T>(*a).compare_exchange_strong(compare, v);
  return compare;  // the old value either way
}
inline int atomicCAS(int* a, int c, int v) { return simt_atomic_cas_(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return simt_atomic_cas_(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c,
                                    unsigned long long v) {
  return simt_atomic_cas_(a, c, v);
}

// Device math that has no host libm counterpart.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
