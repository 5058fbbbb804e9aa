// Attention core: RoPE + backend attention, forward and backward (see attention.h).
#include "nn/attention.h"

namespace traind::engine::nn {

void AttentionForward(Backend& be, const AttentionShape& s, float* out, float* lse, float* qkv) {
  const int64_t W = s.width();
  float* q = qkv;
  float* k = qkv + s.NH * s.HS;
  float* v = k + s.NKV * s.HS;
  if (s.rope) {
    be.Rope(q, s.B, s.T, s.NH, s.HS, W, s.rope_theta, /*inverse=*/false);
    be.Rope(k, s.B, s.T, s.NKV, s.HS, W, s.rope_theta, /*inverse=*/false);
  }
  be.AttentionForward(out, lse, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS, W, W, s.causal,
                      s.key_mask);
}

void AttentionBackward(Backend& be, const AttentionShape& s, float* dqkv, const float* dout,
                       const float* out, const float* lse, const float* qkv) {
  const int64_t W = s.width();
  const int64_t koff = s.NH * s.HS;
  const int64_t voff = koff + s.NKV * s.HS;
  be.AttentionBackward(dqkv, dqkv + koff, dqkv + voff, dout, out, lse, qkv, qkv + koff, qkv + voff,
                       s.B, s.T, s.NH, s.NKV, s.HS, W, W, s.causal, s.key_mask);
  if (s.rope) {
    // q_rot = R q, so dq = R^T dq_rot: the inverse rotation.
    be.Rope(dqkv, s.B, s.T, s.NH, s.HS, W, s.rope_theta, /*inverse=*/true);
    be.Rope(dqkv + koff, s.B, s.T, s.NKV, s.HS, W, s.rope_theta, /*inverse=*/true);
  }
}

}  // namespace traind::engine::nn
