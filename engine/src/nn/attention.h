// Self-attention core on a fused qkv buffer: optional RoPE (HF rotate-half) on q and k, then
// flash-style attention (no (T,T) buffer), causal (decoders) or not (encoders), with an optional
// key padding mask (Backend::AttentionForward's contract). The QKV and output projections are Linear layers.
// Gradient contract: dqkv uses = (every element of the (N, QKV) rows is written).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

// Rows of qkv are [q (NH*HS) | k (NKV*HS) | v (NKV*HS)], width() floats each.
struct AttentionShape {
  int64_t B = 0;
  int64_t T = 0;
  int64_t NH = 0;
  int64_t NKV = 0;
  int64_t HS = 0;
  bool rope = false;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // HF rope_scaling (linear, llama3); kNone: plain RoPE
  bool causal = true;
  int64_t window = 0;  // > 0: sliding-window attention (Backend::AttentionForward)
  // Device int32 (B*T) or null: key_mask[b*T + j] != 0 means key j of sequence b is attended.
  const int32_t* key_mask = nullptr;
  // Rows of examples (Backend::AttentionForward's doc_start, Backend::Rope's positions): device
  // int32 (B*T) each, or null.
  const int32_t* doc_start = nullptr;
  const int32_t* positions = nullptr;
  // The products' operand precision (Backend::AttentionForward): the model's compute type.
  DType operand_type = DType::kF32;
  int64_t width() const { return (NH + 2 * NKV) * HS; }
};

// qkv (B*T, width): RoPE is applied in place when s.rope, so qkv then holds the rotated q and k
// that the backward needs. out (B*T, NH*HS), lse (B, NH, T).
void AttentionForward(Backend& be, const AttentionShape& s, float* out, float* lse, float* qkv);
// Only the RoPE part of AttentionForward (nothing when !s.rope): what a checkpointed block's
// recompute needs when it keeps out and lse from the first forward.
void AttentionRope(Backend& be, const AttentionShape& s, float* qkv);
// dqkv (B*T, width) = d loss / d qkv (pre-RoPE), given dout (B*T, NH*HS) and the forward's out,
// lse and (rotated) qkv.
void AttentionBackward(Backend& be, const AttentionShape& s, float* dqkv, const float* dout,
                       const float* out, const float* lse, const float* qkv);

// The same with 16-bit attention tensors (s.operand_type kBF16 or kF16: a 16-bit job). qkv32
// (B*T, width) is the projection's fp32 output: RoPE is applied to it in place, then it is rounded
// into qkv16 (operand_type), the tensor attention reads and the backward keeps; out16 (B*T, NH*HS)
// is written in operand_type (Backend::AttentionForward16).
void AttentionForward16(Backend& be, const AttentionShape& s, void* out16, float* lse,
                        float* qkv32, void* qkv16);
// Only the RoPE and the rounding of AttentionForward16 (a checkpointed block's recompute).
void AttentionRope16(Backend& be, const AttentionShape& s, float* qkv32, void* qkv16);
// dqkv (B*T, width, fp32) = d loss / d qkv (pre-RoPE), given the output gradient rounded to
// operand_type (dout16) and the forward's out16, lse and qkv16.
void AttentionBackward16(Backend& be, const AttentionShape& s, float* dqkv, const void* dout16,
                         const void* out16, const float* lse, const void* qkv16);

}  // namespace traind::engine::nn
