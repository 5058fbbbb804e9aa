// The one definition of the scalar conversions between fp32 and the 16-bit float formats (bf16,
// IEEE f16), rounding to nearest even with integer bit manipulation, so the results depend on
// neither the ISA nor compiler flags. NaN stays NaN (quiet), infinities stay infinite; f16 overflow
// gives +-inf, underflow subnormals or +-0. Used by the safetensors reader/writer and the CPU
// backend's casts (whose vectorised array loops are tested bit-identical to these).
#pragma once

#include <bit>
#include <cstdint>

namespace traind::engine {

inline uint16_t F32ToBF16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // Round to nearest even on the 16 dropped bits; a carry correctly bumps the exponent (to inf).
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float BF16ToF32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

inline uint16_t F32ToF16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // normal f16: rebias exponent 127 -> 15, round 13 dropped bits
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13));
  }
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: +-0
  // Subnormal f16 (units of 2^-24): value = m * 2^(e-150), so q = m >> (126 - e), rounded.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t s = 126 - e;  // 14..24
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float F16ToF32(uint16_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
  const uint32_t exp = (x >> 10) & 0x1Fu;
  const uint32_t mant = x & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// n fp32 values rounded to bf16 (`bf16`) or f16 into out: the scalar conversions above, element by
// element (the bits the backends' casts give).
inline void F32To16Span(bool bf16, const float* in, int64_t n, uint16_t* out) {
  if (bf16) {
    for (int64_t k = 0; k < n; ++k) out[k] = F32ToBF16(in[k]);
  } else {
    for (int64_t k = 0; k < n; ++k) out[k] = F32ToF16(in[k]);
  }
}

}  // namespace traind::engine
