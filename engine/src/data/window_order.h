// The exact, library-independent arithmetic behind token batching (JOBSPEC.md "Batching
// semantics"): how a stream is split into train/validation and the window order of an epoch.
// Exposed so tests and reference scripts can reproduce it; BatchLoader uses nothing else.
#pragma once

#include <cstdint>
#include <vector>

namespace traind::engine {

// Tokens in the training stream of an n-token file: int(n * (1 - validation_split)), computed in
// double exactly as Python would; the validation stream is the remaining n - that tokens.
int64_t TrainTokenCount(int64_t n, double validation_split);

// The 64-bit seed of epoch `epoch`'s permutation: splitmix64(splitmix64(seed) ^ epoch).
uint64_t EpochSeed(uint64_t seed, int64_t epoch);

// The window order of one epoch: 0..windows-1 in order without shuffle; with shuffle, a
// Fisher-Yates shuffle (i from windows-1 down to 1, j uniform in [0, i] by rejection sampling of
// std::mt19937_64(EpochSeed(seed, epoch)) outputs below the largest multiple of i + 1, j = r % (i+1)).
std::vector<int64_t> WindowOrder(int64_t windows, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace traind::engine
