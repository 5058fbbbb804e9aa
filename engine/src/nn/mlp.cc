// MLP forward/backward from Linear layers and the backend activations (see mlp.h).
#include "nn/mlp.h"

#include "nn/linear.h"

namespace traind::engine::nn {

void MlpForward(Backend& be, const MlpShape& s, const MlpWeights& w, float* out, float* h, float* a,
                const float* inp) {
  LinearForward(be, h, inp, w.w_up, w.b_up, s.N, s.C, s.up_width());
  if (s.swiglu) {
    be.SwiGluForward(a, h, s.N, s.H);
  } else {
    be.GeluForward(a, h, s.N * s.H);
  }
  LinearForward(be, out, a, w.w_down, w.b_down, s.N, s.H, s.C);
}

void MlpBackward(Backend& be, const MlpShape& s, const MlpWeights& w, const MlpGrads& g,
                 float* dinp, const float* dout, const float* h, const float* a, const float* inp,
                 float* scratch_a, float* scratch_h) {
  float* da = scratch_a;  // (N,H)
  LinearBackward(be, da, g.w_down, g.b_down, dout, a, w.w_down, s.N, s.H, s.C);
  float* dh = scratch_h;  // (N, up_width); may alias da for GELU
  if (s.swiglu) {
    be.SwiGluBackward(dh, h, da, s.N, s.H);
  } else {
    be.GeluBackward(dh, h, da, s.N * s.H);
  }
  LinearBackward(be, dinp, g.w_up, g.b_up, dh, inp, w.w_up, s.N, s.C, s.up_width());
}

}  // namespace traind::engine::nn
