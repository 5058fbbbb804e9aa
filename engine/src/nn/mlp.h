// The transformer MLP: up-projection, activation, down-projection.
//   gelu   (gpt2):  h (N,H) = inp W_fc^T + b;       a = gelu_tanh(h);       out = a W_proj^T + b
//   gelu_erf (bert): the same with the exact GELU (HF "gelu")
//   swiglu (llama): h (N,2H) = inp W_gu^T ([gate|up] rows, gate first); a = silu(gate)*up (N,H);
//                   out = a W_down^T
//   geglu (gemma):  the same with a = gelu_tanh(gate)*up
// Gradient contract: parameter gradients +=; dinp = (overwritten).
// Precision (linear.h): inp, a and the two weights are in the GEMM type; h, out, biases and every
// gradient are fp32; the activation runs in fp32.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "nn/linear.h"
#include "nn/lora.h"

namespace traind::engine::nn {

struct MlpShape {
  int64_t N = 0;
  int64_t C = 0;
  int64_t H = 0;        // hidden size after the activation
  bool swiglu = false;  // false: GELU (tanh, or erf with gelu_erf) with biases
  bool gelu_erf = false;  // exact GELU (HF "gelu": bert) instead of the tanh approximation
  bool geglu = false;     // gated tanh GELU (gemma): [gate|up] as swiglu, gelu_tanh for silu
  bool gated() const { return swiglu || geglu; }
  int64_t up_width() const { return gated() ? 2 * H : H; }
};

struct MlpWeights {
  const void* w_up = nullptr;     // (up_width, C) GEMM type
  const float* b_up = nullptr;    // (up_width) or null
  const void* w_down = nullptr;   // (C, H) GEMM type
  const float* b_down = nullptr;  // (C) or null
};

struct MlpGrads {
  float* w_up = nullptr;
  float* b_up = nullptr;
  float* w_down = nullptr;
  float* b_down = nullptr;
};

// h (N, up_width) and a (N, H) are kept for backward; out (N,C). With a 16-bit `type` the
// activation is computed into act_scratch (N,H floats, overwritten) and rounded into a.
// LoRA: `up` adapters add into h before the activation, `down` adapters into out (they read inp
// and a, the 16-bit ones included, see lora.h).
struct MlpLora {
  LoraSite up;
  LoraSite down;
};
void MlpForward(Backend& be, const MlpShape& s, const MlpWeights& w, float* out, float* h, void* a,
                const void* inp, DType type = DType::kF32, float* act_scratch = nullptr,
                const MlpLora* lora = nullptr);
// scratch_a (N,H) and scratch_h (N,up_width) are overwritten. For GELU they may be the same
// buffer (the activation backward runs in place). gp.scratch is overwritten (16-bit types).
void MlpBackward(Backend& be, const MlpShape& s, const MlpWeights& w, const MlpGrads& g,
                 float* dinp, const float* dout, const float* h, const void* a, const void* inp,
                 float* scratch_a, float* scratch_h, const GemmPrecision& gp = {},
                 const MlpLora* lora = nullptr);

}  // namespace traind::engine::nn
