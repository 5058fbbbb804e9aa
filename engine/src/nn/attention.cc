// Attention core: RoPE + backend attention, forward and backward (see attention.h).
#include "nn/attention.h"

namespace traind::engine::nn {

void AttentionRope(Backend& be, const AttentionShape& s, float* qkv) {
  if (!s.rope) return;
  // q's NH heads and k's NKV heads are adjacent in each row: one call rotates both.
  be.Rope(qkv, s.B, s.T, s.NH + s.NKV, s.HS, s.width(), s.rope_theta, /*inverse=*/false, 0,
          s.rope_scaling, s.positions);
}

namespace {

// q_rot = R q, so dq = R^T dq_rot: the inverse rotation (dq and dk adjacent: one call).
void AttentionRopeBackward(Backend& be, const AttentionShape& s, float* dqkv) {
  if (!s.rope) return;
  be.Rope(dqkv, s.B, s.T, s.NH + s.NKV, s.HS, s.width(), s.rope_theta, /*inverse=*/true, 0,
          s.rope_scaling, s.positions);
}

}  // namespace

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
  AttentionRopeBackward(be, s, dqkv);
}

void AttentionRope16(Backend& be, const AttentionShape& s, float* qkv32, void* qkv16) {
  AttentionRope(be, s, qkv32);
  be.Cast(qkv16, s.operand_type, qkv32, DType::kF32, s.B * s.T * s.width());
}

void AttentionForward16(Backend& be, const AttentionShape& s, void* out16, float* lse,
                        float* qkv32, void* qkv16) {
  AttentionRope16(be, s, qkv32, qkv16);
  const int64_t W = s.width();
  const size_t es = DTypeSize(s.operand_type);
  const char* q = static_cast<const char*>(qkv16);
  const char* k = q + s.NH * s.HS * es;
  const char* v = k + s.NKV * s.HS * es;
  be.AttentionForward16(out16, lse, q, k, v, s.operand_type, s.B, s.T, s.NH, s.NKV, s.HS, W, W,
                        s.causal, s.key_mask, s.window, s.doc_start);
}

void AttentionBackward16(Backend& be, const AttentionShape& s, float* dqkv, const void* dout16,
                         const void* out16, const float* lse, const void* qkv16) {
  const int64_t W = s.width();
  const int64_t koff = s.NH * s.HS;
  const int64_t voff = koff + s.NKV * s.HS;
  const size_t es = DTypeSize(s.operand_type);
  const char* q = static_cast<const char*>(qkv16);
  be.AttentionBackward16(dqkv, dqkv + koff, dqkv + voff, dout16, out16, lse, q, q + koff * es,
                         q + voff * es, s.operand_type, s.B, s.T, s.NH, s.NKV, s.HS, W, W,
                         s.causal, s.key_mask, s.window, s.doc_start);
  AttentionRopeBackward(be, s, dqkv);
}

}  // namespace traind::engine::nn
