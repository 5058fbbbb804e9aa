// Warp-level tensor-core and asynchronous-copy operations for the tensor-core kernels: inline PTX
// under nvcc (sm_80+), the warp-collective emulation of backend/simt/simt_tc.h under simt. The
// fragment layouts are the PTX ISA's (tables in docs/simt.md). Include after gpu_compat.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/gpu_compat.h"

#if defined(TRAIND_SIMT)
#include "backend/simt/simt_tc.h"
#endif

TRAIND_GPU_BEGIN
namespace tc {

// d += a * b for one m16n8k16 tile (T16 = __nv_bfloat16 or __half; fp32 accumulators).
template <typename T16>
__device__ __forceinline__ void Mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  static_assert(std::is_same_v<T16, __nv_bfloat16> || std::is_same_v<T16, __half>,
                "mma operands are bf16 or fp16");
#if defined(TRAIND_SIMT)
  ::simt::tc::Mma16816<T16>(d, a, b, d);
#else
  if constexpr (std::is_same_v<T16, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

#if !defined(TRAIND_SIMT)
__device__ __forceinline__ unsigned SharedAddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l%8 of
// matrix l/8 (16 bytes, 16-byte aligned, in shared memory).
template <bool kTrans>
__device__ __forceinline__ void Ldmatrix4(uint32_t r[4], const void* smem_row) {
#if defined(TRAIND_SIMT)
  ::simt::tc::Ldmatrix<4, kTrans>(r, smem_row);
#else
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddr(smem_row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddr(smem_row)));
  }
#endif
}
// .x2: lanes 0..15 give the rows of matrices 0 and 1 (the others' addresses are ignored).
template <bool kTrans>
__device__ __forceinline__ void Ldmatrix2(uint32_t r[2], const void* smem_row) {
#if defined(TRAIND_SIMT)
  ::simt::tc::Ldmatrix<2, kTrans>(r, smem_row);
#else
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(SharedAddr(smem_row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(SharedAddr(smem_row)));
  }
#endif
}
// .x1: lanes 0..7 give the rows.
template <bool kTrans>
__device__ __forceinline__ void Ldmatrix1(uint32_t r[1], const void* smem_row) {
#if defined(TRAIND_SIMT)
  ::simt::tc::Ldmatrix<1, kTrans>(r, smem_row);
#else
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(SharedAddr(smem_row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(SharedAddr(smem_row)));
  }
#endif
}

// cp.async.cg.shared.global: 16 bytes from global `src` to shared `dst` when `valid`, else 16
// zero bytes (src not read). Lands at the wait_group that retires its group.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(TRAIND_SIMT)
  ::simt::tc::CpAsync(dst, src, 16, valid ? 16 : 0);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
// cp.async.ca.shared.global of 4 bytes (zero when !valid).
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
#if defined(TRAIND_SIMT)
  ::simt::tc::CpAsync(dst, src, 4, valid ? 4 : 0);
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SharedAddr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(TRAIND_SIMT)
  ::simt::tc::CpAsyncCommit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(TRAIND_SIMT)
  ::simt::tc::CpAsyncWait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Two floats rounded to T16 and packed (x in the low half).
template <typename T16>
__device__ __forceinline__ uint32_t Pack2(float x, float y) {
  uint16_t lo, hi;
  if constexpr (std::is_same_v<T16, __nv_bfloat16>) {
    const __nv_bfloat16 a = __float2bfloat16_rn(x), b = __float2bfloat16_rn(y);
    memcpy(&lo, &a, 2);
    memcpy(&hi, &b, 2);
  } else {
    const __half a = __float2half_rn(x), b = __float2half_rn(y);
    memcpy(&lo, &a, 2);
    memcpy(&hi, &b, 2);
  }
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

template <typename T16>
__device__ __forceinline__ float ToFloat(T16 x) {
  if constexpr (std::is_same_v<T16, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

}  // namespace tc
TRAIND_GPU_END
