// Attention core: RoPE + backend attention, forward and backward (see attention.h).
#include "nn/attention.h"

namespace traind::engine::nn {

void AttentionRope(Backend& be, const AttentionShape& s, float* qkv) {
  if (!s.rope) return;
  // q's NH heads and k's NKV heads are adjacent in each row: one call rotates both.
  be.Rope(qkv, s.B, s.T, s.NH + s.NKV, s.HS, s.width(), s.rope_theta, /*inverse=*/false, 0,
          s.rope_scaling, s.positions);
}

void AttentionForward(Backend& be, const AttentionShape& s, float* out, float* lse, float* qkv) {
  const int64_t W = s.width();
  float* q = qkv;
  float* k = qkv + s.NH * s.HS;
  float* v = k + s.NKV * s.HS;
  AttentionRope(be, s, qkv);
  be.AttentionForward(out, lse, q, k, v, s.B, s.T, s.NH, s.NKV, s.HS, W, W, s.causal,
                      s.key_mask, s.operand_type, s.window, s.doc_start);
}

void AttentionBackward(Backend& be, const AttentionShape& s, float* dqkv, const float* dout,
                       const float* out, const float* lse, const float* qkv) {
  const int64_t W = s.width();
  const int64_t koff = s.NH * s.HS;
  const int64_t voff = koff + s.NKV * s.HS;
  be.AttentionBackward(dqkv, dqkv + koff, dqkv + voff, dout, out, lse, qkv, qkv + koff, qkv + voff,
                       s.B, s.T, s.NH, s.NKV, s.HS, W, W, s.causal, s.key_mask, s.operand_type,
                       s.window, s.doc_start);
  if (s.rope) {
    // q_rot = R q, so dq = R^T dq_rot: the inverse rotation (dq and dk adjacent: one call).
    be.Rope(dqkv, s.B, s.T, s.NH + s.NKV, s.HS, W, s.rope_theta, /*inverse=*/true, 0,
            s.rope_scaling, s.positions);
  }
}

}  // namespace traind::engine::nn
