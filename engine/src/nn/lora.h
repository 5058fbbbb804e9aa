// LoRA adapters on a Linear layer (HF PEFT semantics, lora_dropout 0):
//   y[:, col:col+out] += scale * (x A^T) B^T,   A (r, in), B (out, r), scale = lora_alpha / r
// over fp32 inputs, as plain backend GEMMs (every backend runs them; no op of its own).
// A site is one Linear layer's output (width ld_out) carrying one or more adapters on column
// ranges (llama's fused q|k|v and gate|up weights carry one adapter per HF module).
// Gradient contract: dA and dB +=; dx += (the base layer's backward wrote it first).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

struct LoraAdapter {
  const float* A = nullptr;  // (r, in)
  const float* B = nullptr;  // (out, r)
  float* dA = nullptr;       // (r, in)
  float* dB = nullptr;       // (out, r)
  float* u = nullptr;        // (N, r) x A^T, kept from forward for backward
  int64_t in = 0, out = 0;
  int64_t col = 0;           // first output column of this adapter in the site's output
};

struct LoraSite {
  const LoraAdapter* adapters = nullptr;  // null or n == 0: no adapter here
  int n = 0;
  int64_t r = 0;
  float scale = 0.0f;
  int64_t ld_out = 0;     // row stride of the site's output (and its gradient)
  float* du = nullptr;    // (N, r) scratch for backward, overwritten
  bool active() const { return adapters != nullptr && n > 0; }
};

// y (N, ld_out) += the adapters' outputs; fills each adapter's u. FLOPs 2*N*r*(in+out) each.
void LoraForward(Backend& be, const LoraSite& s, float* y, const float* x, int64_t N);
// dy (N, ld_out): gradient of the site's output. dx (N, in) += its adapters' input gradients
// (skipped when null); dA, dB += . FLOPs 4*N*r*(in+out) each.
void LoraBackward(Backend& be, const LoraSite& s, float* dx, const float* dy, const float* x,
                  int64_t N);

}  // namespace traind::engine::nn
