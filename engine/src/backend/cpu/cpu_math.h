// Branch-free float math for the CPU kernels' inner loops, written so that GCC vectorises them
// (no -ffast-math needed). ExpF: Cephes-style range reduction + degree-6 polynomial, max relative
// error ~2 ulp over the float range (tested against std::exp in tests/engine/cpu_ops_test.cc).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace traind::engine::cpu {

inline float ExpF(float x) {
  // Clamp so that 2^n stays a normal float: exp(-87.3) ~ 1.2e-38; x > 88 saturates at exp(88).
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.0f ? 88.0f : x;  // keeps 2^n finite (n <= 127)
  // n = round(x / ln2) via the 1.5*2^23 trick (exact for |t| < 2^22).
  const float kShift = 12582912.0f;
  float t = x * 1.44269504088896341f + kShift;
  float n = t - kShift;
  float r = x - n * 0.693359375f;  // ln2 high part (exact product)
  r = r - n * -2.12194440e-4f;     // ln2 low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from the integer sitting in t's low mantissa bits (no float->int conversion, so a NaN
  // input is no undefined behaviour: it propagates through p).
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift) + 127;
  return p * std::bit_cast<float>(e << 23);
}

// Returns 0 for x below -87.3 (true exp underflows towards 0 there).
inline float ExpFlushF(float x) {
  float y = ExpF(x);
  return x < -87.33654f ? 0.0f : y;
}

inline float SigmoidF(float x) { return 1.0f / (1.0f + ExpF(-x)); }

// erfc(z) for z >= 0, with relative error ~1.2e-7 over the whole range in exact arithmetic (the
// Chebyshev fit of Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2)),
// a few float ulps more here; 0 past z ~ 9.3. Relative accuracy of erfc is what 1 + erf(x) needs
// for x < 0, where computing 1 + erf cancels. Branch-free, so the loops using it vectorise.
inline float ErfcNonNegF(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  return t * ExpFlushF(-z * z - 1.26551223f + t * p);
}

// Phi(x) = (1 + erf(x / sqrt 2)) / 2, the standard normal CDF (exact GELU is x Phi(x)), through
// erfc of |x| / sqrt 2 on both sides, so it keeps its relative accuracy for x << 0.
inline float NormalCdfF(float x) {
  const float half_erfc = 0.5f * ErfcNonNegF((x < 0.0f ? -x : x) * 0.70710678118654752f);
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

// The largest of value(i) over i in [0, n), -inf when n == 0; NaNs are passed over, as
// std::max(m, v) passes them. Thirty-two running maxima so that the loop vectorises: one
// accumulator through std::max (even under `omp simd reduction(max)`) stayed a scalar loop, ~2
// cycles per element, 27x slower on a 50304-element row. Only the sign of a zero maximum can
// differ from the single-accumulator order.
template <class Value>
inline float LaneMaxF(int64_t n, Value value) {
  constexpr int kLanes = 32;
  float lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = value(i + j);
      lane[j] = v > lane[j] ? v : lane[j];
    }
  }
  float m = -INFINITY;
  for (; i < n; ++i) {
    const float v = value(i);
    m = v > m ? v : m;
  }
  for (int j = 0; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

// The largest of x[0, n) (LaneMaxF).
inline float MaxF(const float* x, int64_t n) {
  return LaneMaxF(n, [x](int64_t i) { return x[i]; });
}

// The largest of the x[i] with keep[i] != 0 (LaneMaxF).
inline float MaxWhereF(const float* x, const int32_t* keep, int64_t n) {
  return LaneMaxF(n, [x, keep](int64_t i) { return keep[i] != 0 ? x[i] : -INFINITY; });
}

}  // namespace traind::engine::cpu
