// 16 x 16 fp32 block transposes for the CPU kernels (attention's K^T / V^T panels, the GEMM's
// transposed-B repack). Header-only so each caller inlines it into its own ISA clones.
#pragma once

#include <cstdint>

namespace traind::engine::cpu {

// 16 floats in one vector (a zmm register on AVX-512, two ymm on AVX2); unaligned loads/stores.
typedef float Vec16 __attribute__((vector_size(64), aligned(4)));

// The 16 x 16 block at x (row stride sx) transposed into y (row stride sy): four rounds of
// swapping the off-diagonal sub-blocks of 8, 4, 2 and 1 (two-source shuffles: one vpermt2ps each
// on AVX-512; __builtin_shufflevector, which GCC >= 12 and clang both have).
#define TRAIND_SWAP_ROUND(BS, LO, HI)                \
  for (int i = 0; i < 16; ++i) {                     \
    if (i & (BS)) continue;                          \
    const Vec16 a = r[i], b = r[i + (BS)];           \
    r[i] = __builtin_shufflevector(a, b, LO);        \
    r[i + (BS)] = __builtin_shufflevector(a, b, HI); \
  }
#define TRAIND_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define TRAIND_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define TRAIND_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define TRAIND_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define TRAIND_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define TRAIND_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define TRAIND_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define TRAIND_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31

__attribute__((always_inline)) inline void Transpose16(float* y, int64_t sy, const float* x,
                                                       int64_t sx) {
  Vec16 r[16];
  for (int i = 0; i < 16; ++i) __builtin_memcpy(&r[i], x + i * sx, sizeof(Vec16));
  TRAIND_SWAP_ROUND(8, TRAIND_LO8, TRAIND_HI8)
  TRAIND_SWAP_ROUND(4, TRAIND_LO4, TRAIND_HI4)
  TRAIND_SWAP_ROUND(2, TRAIND_LO2, TRAIND_HI2)
  TRAIND_SWAP_ROUND(1, TRAIND_LO1, TRAIND_HI1)
  for (int i = 0; i < 16; ++i) __builtin_memcpy(y + i * sy, &r[i], sizeof(Vec16));
}

// y (cols x rows, row stride sy) = the (rows x cols) block at x (row stride sx) transposed:
// 16 x 16 blocks through Transpose16, the edges element by element.
__attribute__((always_inline)) inline void TransposeBlock(float* y, int64_t sy, const float* x,
                                                          int64_t sx, int64_t rows, int64_t cols) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) Transpose16(y + c * sy + r0, sy, x + r0 * sx + c, sx);
    for (; c < cols; ++c)
      for (int64_t r = r0; r < r0 + 16; ++r) y[c * sy + r] = x[r * sx + c];
  }
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[c * sy + r] = x[r * sx + c];
}

#undef TRAIND_SWAP_ROUND
#undef TRAIND_LO8
#undef TRAIND_HI8
#undef TRAIND_LO4
#undef TRAIND_HI4
#undef TRAIND_LO2
#undef TRAIND_HI2
#undef TRAIND_LO1
#undef TRAIND_HI1

}  // namespace traind::engine::cpu
