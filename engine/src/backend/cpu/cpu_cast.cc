// Storage-type conversions (f32 <-> bf16 <-> f16), round to nearest even, done with integer bit
// manipulation so the results do not depend on the ISA or on compiler flags. The array loops are
// branch-free selects of the scalar formulas, compiled per ISA (TRAIND_CPU_CLONES) so they
// vectorise, OpenMP-threaded over contiguous chunks for large n; bit-identical to the scalars.
#include <algorithm>
#include <bit>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

namespace traind::engine::cpu {

// Same bits as F32ToBF16, as selects.
TRAIND_CPU_CLONES void F32ToBf16Span(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = std::bit_cast<uint32_t>(src[i]);
    uint32_t quiet = (u >> 16) | 0x0040u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

// Same bits as F32ToF16. The subnormal branch is done in floating point: for |f| < 2^-14,
// |f| + 0.5f lies in [0.5, 0.5 + 2^-14] where one ulp is 2^-24, so the IEEE add (default rounding,
// round to nearest even) rounds |f| to a multiple of 2^-24 exactly as the integer code does, and
// bits(sum) - bits(0.5f) is the half's mantissa (0x400 when it rounds up to the smallest normal).
TRAIND_CPU_CLONES void F32ToF16Span(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = std::bit_cast<uint32_t>(src[i]);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t nan = sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    uint32_t r = a - 0x38000000u;
    uint32_t normal = sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    float sum = std::bit_cast<float>(a) + 0.5f;
    uint32_t sub = sign | (std::bit_cast<uint32_t>(sum) - 0x3f000000u);
    uint32_t h = a >= 0x38800000u ? normal : sub;
    h = a >= 0x477ff000u ? (sign | 0x7c00u) : h;
    h = a > 0x7f800000u ? nan : h;
    dst[i] = static_cast<uint16_t>(h);
  }
}

void F32To16Span(uint16_t* dst, const float* src, int64_t n, DType type) {
  if (type == DType::kBF16) {
    F32ToBf16Span(dst, src, n);
  } else {
    F32ToF16Span(dst, src, n);
  }
}

namespace {

TRAIND_CPU_CLONES void Bf16ToF32Span(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
}

// Same bits as F16ToF32 (signalling NaNs stay signalling, unlike vcvtph2ps).
TRAIND_CPU_CLONES void F16ToF32Span(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t h = src[i];
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t special = sign | 0x7f800000u | (m << 13);
    uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    // m * 2^-24 (exact): (0.5 + m * 2^-24) - 0.5, avoiding an int -> float conversion.
    float sv = std::bit_cast<float>(0x3f000000u | m) - 0.5f;
    uint32_t sub = sign | std::bit_cast<uint32_t>(sv);
    uint32_t is_special = 0u - static_cast<uint32_t>(e == 0x1fu);  // all ones or zero
    uint32_t is_sub = 0u - static_cast<uint32_t>(e == 0u);
    uint32_t r = (special & is_special) | (normal & ~is_special);
    r = (sub & is_sub) | (r & ~is_sub);
    dst[i] = std::bit_cast<float>(r);
  }
}

// Elements below which threading costs more than it saves.
constexpr int64_t kMinParallel = 1 << 16;

// Runs span(dst + b, src + b, e - b) over contiguous chunks of [0, n), threaded for large n.
template <typename Dst, typename Src, typename Span>
void Convert(Dst* dst, const Src* src, int64_t n, int nt, Span span) {
  if (n < kMinParallel || nt <= 1) {
    span(dst, src, n);
    return;
  }
  int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int t = 0; t < nt; ++t) {
    int64_t b = std::min(n, per * t);
    int64_t e = std::min(n, b + per);
    if (e > b) span(dst + b, src + b, e - b);
  }
}

// 16-bit to 16-bit goes through an exact f32 step, in blocks that stay in L1.
template <typename Widen, typename Narrow>
void Convert16(uint16_t* dst, const uint16_t* src, int64_t n, Widen widen, Narrow narrow) {
  constexpr int64_t kBlock = 1024;
  float tmp[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t len = std::min(kBlock, n - b);
    widen(tmp, src + b, len);
    narrow(dst + b, tmp, len);
  }
}

}  // namespace

void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, int nt) {
  if (n <= 0) return;
  if (dst_type == src_type) {
    std::memcpy(dst, src, static_cast<size_t>(n) * DTypeSize(dst_type));
    return;
  }
  auto* d16 = static_cast<uint16_t*>(dst);
  auto* s16 = static_cast<const uint16_t*>(src);
  auto* d32 = static_cast<float*>(dst);
  auto* s32 = static_cast<const float*>(src);
  if (src_type == DType::kF32) {
    if (dst_type == DType::kBF16)
      Convert(d16, s32, n, nt, F32ToBf16Span);
    else
      Convert(d16, s32, n, nt, F32ToF16Span);
  } else if (dst_type == DType::kF32) {
    if (src_type == DType::kBF16)
      Convert(d32, s16, n, nt, Bf16ToF32Span);
    else
      Convert(d32, s16, n, nt, F16ToF32Span);
  } else if (src_type == DType::kBF16) {  // bf16 -> f16: the f32 step is exact, one rounding
    Convert(d16, s16, n, nt, [](uint16_t* d, const uint16_t* s, int64_t len) {
      Convert16(d, s, len, Bf16ToF32Span, F32ToF16Span);
    });
  } else {  // f16 -> bf16
    Convert(d16, s16, n, nt, [](uint16_t* d, const uint16_t* s, int64_t len) {
      Convert16(d, s, len, F16ToF32Span, F32ToBf16Span);
    });
  }
}

}  // namespace traind::engine::cpu
