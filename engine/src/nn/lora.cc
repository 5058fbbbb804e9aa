// LoRA adapter forward/backward as backend GEMMs (see lora.h).
#include "nn/lora.h"

namespace traind::engine::nn {

void LoraForward(Backend& be, const LoraSite& s, float* y, const float* x, int64_t N) {
  for (int i = 0; i < s.n; ++i) {
    const LoraAdapter& a = s.adapters[i];
    // u(N,r) = x(N,in) A(r,in)^T
    be.Gemm(false, true, N, s.r, a.in, 1.0f, x, a.in, a.A, a.in, 0.0f, a.u, s.r);
    // y[:, col:col+out] += scale * u(N,r) B(out,r)^T
    be.Gemm(false, true, N, a.out, s.r, s.scale, a.u, s.r, a.B, s.r, 1.0f, y + a.col, s.ld_out);
  }
}

void LoraBackward(Backend& be, const LoraSite& s, float* dx, const float* dy, const float* x,
                  int64_t N) {
  for (int i = 0; i < s.n; ++i) {
    const LoraAdapter& a = s.adapters[i];
    const float* g = dy + a.col;  // (N, out) with row stride ld_out
    // dB(out,r) += scale * g^T u
    be.Gemm(true, false, a.out, s.r, N, s.scale, g, s.ld_out, a.u, s.r, 1.0f, a.dB, s.r);
    // du(N,r) = scale * g B
    be.Gemm(false, false, N, s.r, a.out, s.scale, g, s.ld_out, a.B, s.r, 0.0f, s.du, s.r);
    // dA(r,in) += du^T x
    be.Gemm(true, false, s.r, a.in, N, 1.0f, s.du, s.r, x, a.in, 1.0f, a.dA, a.in);
    // dx(N,in) += du A
    if (dx != nullptr) be.Gemm(false, false, N, a.in, s.r, 1.0f, s.du, s.r, a.A, a.in, 1.0f, dx, a.in);
  }
}

}  // namespace traind::engine::nn
