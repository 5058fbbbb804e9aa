// Linear forward/backward as GEMMs on the backend (see linear.h for the contract).
#include "nn/linear.h"

namespace traind::engine::nn {

void LinearForward(Backend& be, float* out, const float* inp, const float* weight,
                   const float* bias, int64_t N, int64_t C, int64_t OC) {
  // out(N,OC) = inp(N,C) * weight(OC,C)^T
  be.Gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  if (bias != nullptr) be.AddBias(out, bias, N, OC);
}

void LinearBackward(Backend& be, float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  // dinp(N,C) = dout(N,OC) * weight(OC,C)
  if (dinp != nullptr) be.Gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  // dweight(OC,C) += dout(N,OC)^T * inp(N,C)
  be.Gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) be.BiasBackward(dbias, dout, N, OC);
}

}  // namespace traind::engine::nn
