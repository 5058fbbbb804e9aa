// LayerNorm / RMSNorm dispatch onto the backend ops (see norm.h for the contract).
#include "nn/norm.h"

namespace traind::engine::nn {

void NormForward(Backend& be, const NormShape& s, float* out, float* mean, float* rstd,
                 const float* inp, const float* weight, const float* bias) {
  if (s.rms) {
    be.RmsNormForward(out, rstd, inp, weight, s.N, s.C, s.eps);
  } else {
    be.LayerNormForward(out, mean, rstd, inp, weight, bias, s.N, s.C, s.eps);
  }
}

void NormForwardRounded(Backend& be, const NormShape& s, void* out16, DType out_type, float* out32,
                        float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias) {
  if (s.rms) {
    be.RmsNormForwardRounded(out16, out_type, out32, rstd, inp, weight, s.N, s.C, s.eps);
  } else {
    be.LayerNormForwardRounded(out16, out_type, out32, mean, rstd, inp, weight, bias, s.N, s.C,
                               s.eps);
  }
}

void ResidualNormForward(Backend& be, const NormShape& s, float* res, void* out, DType out_type,
                         float* scratch, float* mean, float* rstd, const float* a, const float* b,
                         const float* weight, const float* bias) {
  be.ResidualNormForward(res, out, out_type, scratch, mean, rstd, a, b, weight,
                         s.rms ? nullptr : bias, s.N, s.C, s.eps, s.rms);
}

void NormBackward(Backend& be, const NormShape& s, float* dinp, float* dweight, float* dbias,
                  const float* dout, const float* inp, const float* weight, const float* mean,
                  const float* rstd) {
  if (s.rms) {
    be.RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, s.N, s.C);
  } else {
    be.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, s.N, s.C);
  }
}

}  // namespace traind::engine::nn
