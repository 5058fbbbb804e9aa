// Seeded random inputs for the backend comparisons in this folder.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace traind::engine::testing {

// n floats uniform in [lo, hi), from `seed`.
inline std::vector<float> Random(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace traind::engine::testing
