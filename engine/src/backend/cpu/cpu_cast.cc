// Storage-type conversions (f32 <-> bf16 <-> f16), round to nearest even, done with integer bit
// manipulation so the results do not depend on the ISA or on compiler flags.
#include <bit>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

namespace traind::engine::cpu {

uint16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {  // normal half: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits
    uint32_t r = a - 0x38000000u;  // (127-15) << 23
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
  // Subnormal half: value = m * 2^-24 with m = a_mantissa_with_hidden_bit >> shift.
  uint32_t e = a >> 23;
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - e;  // 14..24 (e in 102..112)
  uint32_t m = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

namespace {

template <typename Dst, typename Src, typename F>
void Convert(Dst* dst, const Src* src, int64_t n, int nt, F f) {
#pragma omp parallel for num_threads(nt) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = f(src[i]);
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
      Convert(d16, s32, n, nt, FloatToBf16);
    else
      Convert(d16, s32, n, nt, FloatToF16);
  } else if (dst_type == DType::kF32) {
    if (src_type == DType::kBF16)
      Convert(d32, s16, n, nt, Bf16ToFloat);
    else
      Convert(d32, s16, n, nt, F16ToFloat);
  } else if (src_type == DType::kBF16) {  // bf16 -> f16: the f32 step is exact, one rounding
    Convert(d16, s16, n, nt, [](uint16_t h) { return FloatToF16(Bf16ToFloat(h)); });
  } else {  // f16 -> bf16
    Convert(d16, s16, n, nt, [](uint16_t h) { return FloatToBf16(F16ToFloat(h)); });
  }
}

}  // namespace traind::engine::cpu
