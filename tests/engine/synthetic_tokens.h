// Learnable synthetic training data for tests that train: uint16 tokens following a simple
// pattern with 20% noise, so a tiny model's loss falls within a few steps. Standard library only,
// so tests that do not link the engine (the `traind run` process tests) include it too.
#pragma once

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace traind::test_data {

// Writes `n` uint16 tokens below `vocab` to `path` (the `format: tokens, token_dtype: uint16`
// layout), the same sequence for the same seed.
inline void WriteSyntheticTokens(const std::string& path, int64_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int base = static_cast<int>((i * 7 + (i / 13)) % vocab);
    t[static_cast<size_t>(i)] =
        static_cast<uint16_t>(rng() % 5 == 0 ? rng() % static_cast<uint32_t>(vocab) : base);
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
}

}  // namespace traind::test_data
