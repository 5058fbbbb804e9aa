// Rotary embedding frequencies shared by the CPU backend and the CUDA kernels (nvcc compiles this
// header): HF's inv_freq for plain RoPE and for the rope_scaling variants traind implements
// (transformers' modeling_rope_utils: "linear" and "llama3"), formed in fp32 as PyTorch does.
#pragma once

#include <math.h>

#include <cstdint>

#include "backend/step_scalars.h"  // TRAIND_HOST_DEVICE

namespace traind::engine {

// HF config.json rope_scaling (or rope_parameters). kNone: plain RoPE.
struct RopeScaling {
  enum Kind : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2 };
  int32_t kind = kNone;
  float factor = 1.0f;                     // linear, llama3
  float low_freq_factor = 1.0f;            // llama3
  float high_freq_factor = 4.0f;           // llama3
  float original_max_positions = 8192.0f;  // llama3: original_max_position_embeddings
};
// (nvcc compiles the kernels as C++17: no defaulted comparison)
inline bool operator==(const RopeScaling& a, const RopeScaling& b) {
  return a.kind == b.kind && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_positions == b.original_max_positions;
}

// inv_freq[i] for i < HS/2: base = 1 / theta^(2i/HS) (fp32 pow, as torch's float tensors);
// linear: base / factor; llama3: wavelength 2*pi / base; above original/low_freq_factor the
// frequency is divided by factor, below original/high_freq_factor it is kept, and in between it
// is interpolated with smooth = (original / wavelength - low) / (high - low):
// (1 - smooth) * f / factor + smooth * f (f the frequency after the first rule, as HF writes it).
TRAIND_HOST_DEVICE inline float RopeInvFreq(int64_t i, int64_t HS, float theta,
                                            const RopeScaling& s) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(HS);
  const float base = 1.0f / powf(theta, expo);
  if (s.kind == RopeScaling::kLinear) return base / s.factor;
  if (s.kind != RopeScaling::kLlama3) return base;
  const float two_pi = 6.283185307179586f;
  const float wavelen = two_pi / base;
  const float low_freq_wavelen = s.original_max_positions / s.low_freq_factor;
  const float high_freq_wavelen = s.original_max_positions / s.high_freq_factor;
  const float f = wavelen > low_freq_wavelen ? base / s.factor : base;
  const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  if (!medium) return f;
  const float smooth = (s.original_max_positions / wavelen - s.low_freq_factor) /
                       (s.high_freq_factor - s.low_freq_factor);
  return (1.0f - smooth) * f / s.factor + smooth * f;
}

}  // namespace traind::engine
