// MLP forward/backward from Linear layers and the backend activations (see mlp.h).
#include "nn/mlp.h"

namespace traind::engine::nn {

void MlpForward(Backend& be, const MlpShape& s, const MlpWeights& w, float* out, float* h, void* a,
                const void* inp, DType type, float* act_scratch, const MlpLora* lora) {
  const bool up_lora = lora != nullptr && lora->up.active();
  const bool down_lora = lora != nullptr && lora->down.active();
  float* af = type == DType::kF32 ? static_cast<float*>(a) : act_scratch;  // fp32 activation
  if (s.swiglu) {
    LinearForward(be, h, inp, w.w_up, w.b_up, s.N, s.C, s.up_width(), type);
    if (up_lora) LoraForward(be, lora->up, h, inp, s.N);
    if (type == DType::kF32) {
      be.SwiGluForward(af, h, s.N, s.H);
    } else {  // the 16-bit activation directly (the CPU never writes the fp32 one)
      be.SwiGluForwardRounded(a, type, act_scratch, h, s.N, s.H);
      af = nullptr;
    }
  } else if (s.geglu) {  // the fp32 activation, rounded below (no fused 16-bit op)
    LinearForward(be, h, inp, w.w_up, w.b_up, s.N, s.C, s.up_width(), type);
    if (up_lora) LoraForward(be, lora->up, h, inp, s.N);
    be.GeGluForward(af, h, s.N, s.H);
  } else if (s.gelu_erf) {
    LinearForward(be, h, inp, w.w_up, w.b_up, s.N, s.C, s.H, type);
    if (up_lora) LoraForward(be, lora->up, h, inp, s.N);
    be.GeluErfForward(af, h, s.N * s.H);
  } else if (up_lora) {
    be.LinearForward(h, nullptr, inp, w.w_up, w.b_up, s.N, s.C, s.H, type);
    LoraForward(be, lora->up, h, inp, s.N);
    be.GeluForward(af, h, s.N * s.H);
  } else if (type == DType::kF32) {
    // h = pre-activation (kept for backward), af = GELU(h): one fused GEMM on CUDA.
    be.LinearForward(h, af, inp, w.w_up, w.b_up, s.N, s.C, s.H, type);
  } else {
    // The same with a = GELU(h) rounded to 16 bits (the CPU never writes the fp32 activation).
    be.LinearForwardRoundedAct(h, a, type, act_scratch, inp, w.w_up, w.b_up, s.N, s.C, s.H, type);
    af = nullptr;
  }
  if (af != nullptr && type != DType::kF32) be.Cast(a, type, af, DType::kF32, s.N * s.H);
  LinearForward(be, out, a, w.w_down, w.b_down, s.N, s.H, s.C, type);
  if (down_lora) LoraForward(be, lora->down, out, a, s.N);
}

void MlpBackward(Backend& be, const MlpShape& s, const MlpWeights& w, const MlpGrads& g,
                 float* dinp, const float* dout, const float* h, const void* a, const void* inp,
                 float* scratch_a, float* scratch_h, const GemmPrecision& gp,
                 const MlpLora* lora) {
  float* da = scratch_a;  // (N,H)
  LinearBackward(be, da, g.w_down, g.b_down, dout, a, w.w_down, s.N, s.H, s.C, gp);
  if (lora != nullptr && lora->down.active()) {
    LoraBackward(be, lora->down, da, dout, a, s.N);
  }
  float* dh = scratch_h;  // (N, up_width); may alias da for GELU
  const bool tanh_gelu = !s.gated() && !s.gelu_erf;
  // The fused 16-bit passes below leave only the rounded dh; an active up-projection adapter
  // reads the fp32 one, so it takes the composed ops (GELU / SwiGLU backward, then LinearBackward).
  const bool up_lora = lora != nullptr && lora->up.active();
  if (tanh_gelu && (gp.type == DType::kF32 || (!up_lora && gp.scratch_elems >= s.N * s.H))) {
    // GELU's backward with the up projection's bias gradient and, 16-bit, dh rounded into the
    // GEMM scratch, in one pass (GeluBackwardBias); then the up projection's two GEMMs.
    const bool rounded = gp.type != DType::kF32;
    be.GeluBackwardBias(dh, h, da, g.b_up, s.N, s.H, rounded ? gp.scratch : nullptr, gp.type);
    if (rounded) {
      LinearBackwardRounded(be, dinp, g.w_up, gp.scratch, inp, w.w_up, s.N, s.C, s.H, gp);
    } else {
      LinearBackward(be, dinp, g.w_up, nullptr, dh, inp, w.w_up, s.N, s.C, s.H, gp);
    }
  } else if (s.swiglu && w.b_up == nullptr && gp.type != DType::kF32 && !up_lora &&
             gp.scratch_elems >= s.N * s.up_width()) {
    // SwiGLU's backward with dh rounded into the GEMM scratch in the same pass
    // (SwiGluBackwardRounded); then the up projection's two GEMMs on it.
    be.SwiGluBackwardRounded(dh, gp.scratch, gp.type, h, da, s.N, s.H);
    LinearBackwardRounded(be, dinp, g.w_up, gp.scratch, inp, w.w_up, s.N, s.C, s.up_width(), gp);
  } else {
    if (s.swiglu) {
      be.SwiGluBackward(dh, h, da, s.N, s.H);
    } else if (s.geglu) {
      be.GeGluBackward(dh, h, da, s.N, s.H);
    } else if (s.gelu_erf) {
      be.GeluErfBackward(dh, h, da, s.N * s.H);
    } else {
      be.GeluBackward(dh, h, da, s.N * s.H);
    }
    LinearBackward(be, dinp, g.w_up, g.b_up, dh, inp, w.w_up, s.N, s.C, s.up_width(), gp);
  }
  if (up_lora) LoraBackward(be, lora->up, dinp, dh, inp, s.N);
}

}  // namespace traind::engine::nn
