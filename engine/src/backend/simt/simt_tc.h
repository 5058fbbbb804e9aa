// simt emulation of the warp-level tensor-core and asynchronous-copy instructions that the
// tensor-core kernels use through backend/cuda/tc_ops.cuh: mma.sync m16n8k16 (bf16/fp16 in, fp32
// accumulate), ldmatrix m8n8 .x1/.x2/.x4 (.trans) .b16, and cp.async with commit/wait groups.
// Each is a warp-collective operation with the fragment layouts of the PTX ISA (docs/simt.md has
// the tables): every lane publishes the address of its operands through a warp exchange, reads the
// other lanes' operands, and a second exchange keeps any lane from changing them before all have
// read. Each cp.async copy lands either at once or only when the thread's cp.async.wait_group
// retires its group (drawn from the seed), so a read before the wait sees stale data (NaN in fresh
// dynamic shared memory), as it can on a GPU.
#pragma once

#if !defined(TRAIND_SIMT)
#error "simt_tc.h is the emulation of tc_ops.cuh under TRAIND_SIMT"
#endif

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <type_traits>
#include <vector>

#include "backend/simt/simt.h"

namespace simt::tc {

// Test-only: a planted fragment-layout mistake in the emulation (kNone in every real run), to show
// that the tests comparing kernels with the CPU catch a kernel written against a wrong layout.
enum class LayoutFault : int {
  kNone = 0,
  kMmaASwap = 1,       // mma reads A's registers 1 and 2 swapped (rows 8-15 vs columns 8-15)
  kLdmatrixTrans = 2,  // ldmatrix .trans delivers the untransposed fragment
};
inline std::atomic<int>& LayoutFaultFlag() {
  static std::atomic<int> flag{0};
  return flag;
}
inline void SetLayoutFault(LayoutFault f) { LayoutFaultFlag().store(static_cast<int>(f)); }
inline LayoutFault CurrentLayoutFault() {
  return static_cast<LayoutFault>(LayoutFaultFlag().load(std::memory_order_relaxed));
}

namespace detail {

[[noreturn]] inline void TcFatal(const char* what) {
  std::fprintf(stderr, "simt: thread (%u,%u,%u) of block (%u,%u,%u): %s\n", threadIdx.x,
               threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
  std::abort();
}

// Publishes `p` for this lane (all 32 lanes must take part, as .aligned requires) and copies the
// 32 published pointers (the exchange's slot array is reused by the next exchange).
inline void ExchangePointers(const void* p, const void* out[32]) {
  const uint64_t* s = ::simt::detail::WarpExchange(0xffffffffu, reinterpret_cast<uintptr_t>(p));
  for (int l = 0; l < 32; ++l) out[l] = reinterpret_cast<const void*>(static_cast<uintptr_t>(s[l]));
}

template <typename T16>
inline float HalfOf(uint32_t reg, int which) {
  const uint16_t bits = static_cast<uint16_t>(which == 0 ? reg & 0xffffu : reg >> 16);
  if constexpr (std::is_same_v<T16, __nv_bfloat16>) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  } else {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
}

}  // namespace detail

// D = A * B + C for one m16n8k16 tile of the warp (A row-major 16x16, B column-major 16x8, C and
// D 16x8 fp32), each lane holding its fragments as in the PTX ISA:
//   g = lane / 4, t = lane % 4
//   A: a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..2t+1)  a[2] = (g, 2t+8..2t+9)  a[3] = (g+8, 2t+8..)
//   B: b[0] = (k 2t..2t+1, n g)  b[1] = (k 2t+8..2t+9, n g)
//   C, D: c[0..1] = (g, 2t..2t+1)  c[2..3] = (g+8, 2t..2t+1)
// (the lower 16 bits of a register hold the lower column/k index). Products are summed in double
// and rounded once to fp32 (the hardware's order is unspecified; this is the exact sum rounded).
template <typename T16>
inline void Mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  struct Frag {
    uint32_t a[4];
    uint32_t b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  const void* lanes[32];
  detail::ExchangePointers(&mine, lanes);
  const bool swap = CurrentLayoutFault() == LayoutFault::kMmaASwap;
  const int lane = ::simt::detail::LaneId();
  const int g = lane >> 2, t = lane & 3;
  auto a_at = [&](int row, int k) {
    int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    if (swap && (reg == 1 || reg == 2)) reg = 3 - reg;
    const Frag* f = static_cast<const Frag*>(lanes[(row & 7) * 4 + ((k & 7) >> 1)]);
    return detail::HalfOf<T16>(f->a[reg], k & 1);
  };
  auto b_at = [&](int k, int n) {
    const Frag* f = static_cast<const Frag*>(lanes[n * 4 + ((k & 7) >> 1)]);
    return detail::HalfOf<T16>(f->b[k >> 3], k & 1);
  };
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0);
    const int col = 2 * t + (i & 1);
    double acc = c[i];
    for (int k = 0; k < 16; ++k)
      acc += static_cast<double>(a_at(row, k)) * static_cast<double>(b_at(k, col));
    out[i] = static_cast<float>(acc);
  }
  __syncwarp();  // every lane has read every fragment before any lane goes on
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ldmatrix.sync.aligned.m8n8.xN(.trans).shared.b16: lanes 8i..8i+7 give the addresses of rows
// 0..7 of matrix i (16 bytes each, 16-byte aligned); register i of lane l receives
//   plain : M_i[l/4][2(l%4)], M_i[l/4][2(l%4)+1]
//   .trans: M_i[2(l%4)][l/4], M_i[2(l%4)+1][l/4]
template <int N, bool kTrans>
inline void Ldmatrix(uint32_t r[N], const void* row_addr) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix .x1, .x2 or .x4");
  if ((reinterpret_cast<uintptr_t>(row_addr) & 15u) != 0 && ::simt::detail::LaneId() < 8 * N)
    detail::TcFatal("ldmatrix row address not 16-byte aligned");
  const void* lanes[32];
  detail::ExchangePointers(row_addr, lanes);
  const bool trans = kTrans && CurrentLayoutFault() != LayoutFault::kLdmatrixTrans;
  const int lane = ::simt::detail::LaneId();
  uint32_t out[N];
  for (int i = 0; i < N; ++i) {
    uint16_t h[2];
    for (int e = 0; e < 2; ++e) {
      const int row = trans ? 2 * (lane & 3) + e : lane >> 2;
      const int col = trans ? lane >> 2 : 2 * (lane & 3) + e;
      std::memcpy(&h[e], static_cast<const char*>(lanes[8 * i + row]) + 2 * col, 2);
    }
    out[i] = static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
  }
  __syncwarp();  // the rows are read before any lane may write them
  for (int i = 0; i < N; ++i) r[i] = out[i];
}

// ---- cp.async: per-thread queues of pending copies, performed at wait_group ----
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;      // copied from src
  int zero_fill;  // then zeroed up to the copy size
};
struct ThreadAsyncState {
  uint64_t block = ~0ull;  // the block these copies belong to (a new block starts empty)
  uint64_t issued = 0;     // copies issued by this thread in this block
  std::vector<PendingCopy> open;
  std::deque<std::vector<PendingCopy>> committed;
};

inline ThreadAsyncState& AsyncStateOfThisThread() {
  // The fibers of a block all run on one worker thread, one block at a time.
  static thread_local std::vector<ThreadAsyncState> states;
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  if (states.size() <= tid) states.resize(tid + 1);
  ThreadAsyncState& s = states[tid];
  const uint64_t block = blockIdx.x +
                         static_cast<uint64_t>(gridDim.x) * (blockIdx.y + gridDim.y * blockIdx.z) +
                         (::simt::LaunchCount() << 40);
  if (s.block != block) {
    s.block = block;
    s.issued = 0;
    s.open.clear();
    s.committed.clear();
  }
  return s;
}

inline void PerformCopy(const PendingCopy& c) {
  if (c.bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
  if (c.zero_fill > 0) std::memset(static_cast<char*>(c.dst) + c.bytes, 0, c.zero_fill);
}

// cp.async.{ca,cg}.shared.global [dst], [src], size, src_size: size bytes land in dst, the first
// src_size of them from src and the rest zero (src_size 0: zero fill, src not read). A copy lands
// either at once or at the wait that retires its group, drawn per copy from the seed (as a GPU
// may land it any time in between): a read before the wait sees stale data for about half the
// copies.
inline void CpAsync(void* dst, const void* src, int size, int src_size) {
  if ((reinterpret_cast<uintptr_t>(dst) % static_cast<uintptr_t>(size)) != 0 ||
      (src_size > 0 && reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(size)) != 0)
    detail::TcFatal("cp.async address not aligned to the copy size");
  ThreadAsyncState& s = AsyncStateOfThisThread();
  const PendingCopy c{dst, src, src_size, size - src_size};
  uint64_t h = ::simt::Seed() * 0x9E3779B97F4A7C15ull ^ s.block * 0xBF58476D1CE4E5B9ull ^
               (static_cast<uint64_t>(threadIdx.x) << 32) ^ s.issued++;
  h = (h ^ (h >> 31)) * 0x94D049BB133111EBull;
  if (((h ^ (h >> 29)) & 1u) != 0) {
    PerformCopy(c);
  } else {
    s.open.push_back(c);
  }
}
inline void CpAsyncCommit() {
  ThreadAsyncState& s = AsyncStateOfThisThread();
  s.committed.push_back(std::move(s.open));
  s.open.clear();
}
// Completes all but the newest `n` committed groups of this thread.
inline void CpAsyncWait(int n) {
  ThreadAsyncState& s = AsyncStateOfThisThread();
  while (static_cast<int>(s.committed.size()) > n) {
    for (const PendingCopy& c : s.committed.front()) PerformCopy(c);
    s.committed.pop_front();
  }
  SIMT_COMPILER_FENCE();
}

}  // namespace simt::tc
