// The dropout mask of Backend::Dropout: a counter-based hash (SplitMix64's finalizer), so element
// i of a call is kept or dropped as a pure function of (key, stream, i), the same on every backend
// and in every order of evaluation: nothing is stored, backward regenerates the mask, a resumed run
// draws the same masks, and a replayed CUDA graph draws new ones when the device key changes.
// Plain code shared by the CPU kernels and the CUDA kernels (nvcc compiles this header).
#pragma once

#include <cstdint>

#include "backend/step_scalars.h"  // TRAIND_HOST_DEVICE

namespace traind::engine {

TRAIND_HOST_DEVICE inline uint64_t DropoutMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The per-call base of a (key, stream) pair: one hash per call (per thread on the GPU).
TRAIND_HOST_DEVICE inline uint64_t DropoutBase(uint64_t key, uint64_t stream) {
  return DropoutMix64(key ^ DropoutMix64(stream + 0x632BE59BD9B4E019ull));
}

// True when element i is kept: u = the top 24 bits of the hash times 2^-24 (exact in fp32), kept
// when u >= p (so P(kept) = 1 - p up to 2^-24).
TRAIND_HOST_DEVICE inline bool DropoutKeep(uint64_t base, uint64_t i, float p) {
  const uint64_t r = DropoutMix64(base + (i + 1) * 0x9E3779B97F4A7C15ull);
  const float u = static_cast<float>(static_cast<uint32_t>(r >> 40)) * 5.9604644775390625e-8f;
  return u >= p;
}

// The key of one training micro-batch: the job seed and the micro-batch's global index
// (step * accumulation_steps + micro-batch). The step runner writes it to the model's device key.
inline uint64_t DropoutMicroBatchKey(uint64_t seed, uint64_t micro_batch_index) {
  return DropoutMix64(DropoutMix64(seed ^ 0x6C6F7261446F7030ull) + micro_batch_index);
}

}  // namespace traind::engine
