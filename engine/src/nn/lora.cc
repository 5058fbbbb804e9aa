// LoRA adapter forward/backward as backend GEMMs (see lora.h).
#include "nn/lora.h"

namespace traind::engine::nn {
namespace {

// The adapters' input without dropout: x itself (fp32) or x widened into the scratch (once per
// site: every adapter of a site reads the same x).
const float* PlainInput(Backend& be, const LoraSite& s, const void* x, int64_t N) {
  if (s.x_type == DType::kF32) return static_cast<const float*>(x);
  be.Cast(s.xs, DType::kF32, x, s.x_type, N * s.adapters[0].in);
  return s.xs;
}

}  // namespace

void LoraForward(Backend& be, const LoraSite& s, float* y, const void* x, int64_t N) {
  if (!s.active()) return;
  const bool drop = s.dropout > 0.0f;
  const float* xin = drop ? s.xs : PlainInput(be, s, x, N);
  for (int i = 0; i < s.n; ++i) {
    const LoraAdapter& a = s.adapters[i];
    if (drop) be.Dropout(s.xs, x, s.x_type, N * a.in, s.dropout, s.key, a.stream, false);
    // u(N,r) = xin(N,in) A(r,in)^T
    be.Gemm(false, true, N, s.r, a.in, 1.0f, xin, a.in, a.A, a.in, 0.0f, a.u, s.r);
    // y[:, col:col+out] += scale * u(N,r) B(out,r)^T
    be.Gemm(false, true, N, a.out, s.r, s.scale, a.u, s.r, a.B, s.r, 1.0f, y + a.col, s.ld_out);
  }
}

void LoraBackward(Backend& be, const LoraSite& s, float* dx, const float* dy, const void* x,
                  int64_t N) {
  if (!s.active()) return;
  const bool drop = s.dropout > 0.0f;
  const float* xin = drop ? s.xs : PlainInput(be, s, x, N);
  for (int i = 0; i < s.n; ++i) {
    const LoraAdapter& a = s.adapters[i];
    const float* g = dy + a.col;  // (N, out) with row stride ld_out
    // dB(out,r) += scale * g^T u
    be.Gemm(true, false, a.out, s.r, N, s.scale, g, s.ld_out, a.u, s.r, 1.0f, a.dB, s.r);
    // du(N,r) = scale * g B
    be.Gemm(false, false, N, s.r, a.out, s.scale, g, s.ld_out, a.B, s.r, 0.0f, s.du, s.r);
    // dA(r,in) += du^T xin, xin = dropout(x) regenerated with the forward's mask
    if (drop) be.Dropout(s.xs, x, s.x_type, N * a.in, s.dropout, s.key, a.stream, false);
    be.Gemm(true, false, s.r, a.in, N, 1.0f, s.du, s.r, xin, a.in, 1.0f, a.dA, a.in);
    if (dx == nullptr) continue;
    if (drop) {
      // dx(N,in) += dropout'(du A): the same mask and 1/(1-p) on the gradient
      be.Gemm(false, false, N, a.in, s.r, 1.0f, s.du, s.r, a.A, a.in, 0.0f, s.xs, a.in);
      be.Dropout(dx, s.xs, DType::kF32, N * a.in, s.dropout, s.key, a.stream, true);
    } else {
      // dx(N,in) += du A
      be.Gemm(false, false, N, a.in, s.r, 1.0f, s.du, s.r, a.A, a.in, 1.0f, dx, a.in);
    }
  }
}

}  // namespace traind::engine::nn
