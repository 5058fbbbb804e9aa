// LoRA adapters on a Linear layer (HF PEFT semantics):
//   y[:, col:col+out] += scale * (dropout(x) A^T) B^T,   A (r, in), B (out, r), scale = alpha / r
// as plain fp32 backend GEMMs over fp32 adapter weights, whatever the base layer's compute type.
// A site is one Linear layer's output (width ld_out) carrying one or more adapters on column
// ranges (llama's fused q|k|v and gate|up weights carry one adapter per HF module).
// Input: x (N, in) is the base layer's saved GEMM input, in `x_type` (fp32, or the 16-bit compute
// type in mixed precision). With a 16-bit x or with dropout the adapters read x through `xs`, an
// fp32 (N, in) scratch: x widened (exact), or dropout(x) (inverted dropout, Backend::Dropout, each
// adapter its own mask: (key, adapter stream)), so the adapter GEMMs stay fp32. Backward
// regenerates dropout(x) from x and the same key (nothing is stored) and passes dx through the same
// mask. The base layer's input is never dropped.
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
  float* u = nullptr;        // (N, r) dropout(x) A^T, kept from forward for backward
  int64_t in = 0, out = 0;
  int64_t col = 0;           // first output column of this adapter in the site's output
  uint64_t stream = 0;       // dropout stream: unique per adapter of the model
};

struct LoraSite {
  const LoraAdapter* adapters = nullptr;  // null or n == 0: no adapter here
  int n = 0;
  int64_t r = 0;
  float scale = 0.0f;
  int64_t ld_out = 0;     // row stride of the site's output (and its gradient)
  float* du = nullptr;    // (N, r) scratch for backward, overwritten
  DType x_type = DType::kF32;  // storage type of x
  float dropout = 0.0f;        // lora_dropout p in [0, 1); 0 (eval, no dropout): none
  const uint64_t* key = nullptr;  // device: the micro-batch's dropout key (dropout > 0)
  float* xs = nullptr;    // (N, in) fp32 scratch, overwritten; needed when x_type != f32 or dropout
  bool active() const { return adapters != nullptr && n > 0; }
};

// y (N, ld_out) += the adapters' outputs; fills each adapter's u. FLOPs 2*N*r*(in+out) each.
void LoraForward(Backend& be, const LoraSite& s, float* y, const void* x, int64_t N);
// dy (N, ld_out): gradient of the site's output. dx (N, in) += its adapters' input gradients
// (skipped when null); dA, dB += . FLOPs 4*N*r*(in+out) each. With dropout, as in the forward.
void LoraBackward(Backend& be, const LoraSite& s, float* dx, const float* dy, const void* x,
                  int64_t N);

}  // namespace traind::engine::nn
