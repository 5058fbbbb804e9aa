// Normalisation layers over the channel dimension: LayerNorm (gpt2) and RMSNorm (llama, HF
// LlamaRMSNorm). Gradient contract: dinp, dweight and dbias all use += — dinp accumulates because
// a norm always reads the residual stream, whose gradient it adds to.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

// One norm of either kind. mean is unused (may be null) for RMSNorm; bias null for RMSNorm.
struct NormShape {
  int64_t N = 0;
  int64_t C = 0;
  bool rms = false;
  float eps = 1e-5f;
};

// out (N,C), mean (N), rstd (N) saved for backward, inp (N,C), weight (C), bias (C).
void NormForward(Backend& be, const NormShape& s, float* out, float* mean, float* rstd,
                 const float* inp, const float* weight, const float* bias);
// NormForward with out rounded to out_type (bf16/f16) into out16; out32 (N,C) is scratch the
// backend may use (it holds nothing afterwards the caller may read).
void NormForwardRounded(Backend& be, const NormShape& s, void* out16, DType out_type, float* out32,
                        float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias);
// res (N,C) = a + b, then NormForward (out_type f32) or NormForwardRounded of res into out;
// scratch (N,C floats, may be b) as NormForwardRounded's out32.
void ResidualNormForward(Backend& be, const NormShape& s, float* res, void* out, DType out_type,
                         float* scratch, float* mean, float* rstd, const float* a, const float* b,
                         const float* weight, const float* bias);
// dinp (N,C) +=, dweight (C) +=, dbias (C) += (ignored for RMSNorm).
void NormBackward(Backend& be, const NormShape& s, float* dinp, float* dweight, float* dbias,
                  const float* dout, const float* inp, const float* weight, const float* mean,
                  const float* rstd);

}  // namespace traind::engine::nn
