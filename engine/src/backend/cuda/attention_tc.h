// Launchers of the tensor-core flash attention (attention_tc.cu): FlashAttention-2 forward and
// backward on 16-bit q, k, v (bf16 or fp16, fp32 accumulation), for both builds (nvcc: mma.sync /
// ldmatrix / cp.async; simt: their warp-collective emulation).
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_ns.h"
#include "core/dtype.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

// Head sizes with a tensor-core kernel.
bool AttentionTcSupportsHeadSize(int64_t HS);  // 64, 80, 96, 128, 256

// Masks, as backend.h's AttentionForward: query i of sequence b attends key j when j < T,
// (!causal || j <= i), (key_mask == nullptr || key_mask[b*T + j] != 0),
// (window <= 0 || i - j < window) and (doc_start == nullptr || j >= doc_start[b*T + i]).
struct AttentionTcMasks {
  bool causal = true;
  const int32_t* key_mask = nullptr;   // device int32 (B*T) or null
  int64_t window = 0;                  // 0: none
  const int32_t* doc_start = nullptr;  // device int32 (B*T) or null: packed examples
};

// type: kBF16 or kF16. q: B*T rows of q_stride elements, NH heads of HS; k, v: B*T rows of
// kv_stride, NKV heads (GQA: query head h reads kv head h / (NH/NKV)). Strides multiples of 8 and
// pointers 16-byte aligned. out: (B*T, NH*HS) contiguous, 16-bit; lse: (B, NH, T) fp32. A query
// that sees no key gets out = 0, lse = 0.
Status AttentionTcForward(void* out, float* lse, const void* q, const void* k, const void* v,
                          DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                          int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                          cudaStream_t stream);

// fp32 scratch floats AttentionTcBackward needs: the dq accumulator (B*T*NH*HS) and the row
// deltas (B*NH*T).
int64_t AttentionTcBackwardScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t HS);

// dq (q's layout), dk, dv (k's layout) written (=) in `type`; GQA sums over the heads of a group.
// dout, out: (B*T, NH*HS) contiguous 16-bit; lse from the forward; masks the forward's.
Status AttentionTcBackward(void* dq, void* dk, void* dv, const void* dout, const void* out,
                           const float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                           float* scratch, cudaStream_t stream);

// AttentionTcBackward with fp32 gradients (Backend::AttentionBackward16): dq, dk, dv (=, q's and
// k's layouts and strides; columns outside the heads are not touched; pointers 16-byte aligned).
// dq accumulates in place, so `scratch` holds only the row deltas:
// AttentionTcBackwardF32GradsScratchFloats floats.
int64_t AttentionTcBackwardF32GradsScratchFloats(int64_t B, int64_t T, int64_t NH);
Status AttentionTcBackwardF32Grads(float* dq, float* dk, float* dv, const void* dout,
                                   const void* out, const float* lse, const void* q, const void* k,
                                   const void* v, DType type, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                   const AttentionTcMasks& masks, float* scratch,
                                   cudaStream_t stream);

// The same on the Backend's fp32 attention tensors (q, k, v, out, dout, dq, dk, dv as backend.h's
// AttentionForward/Backward: strided fp32 rows, out contiguous): they are rounded to `type` into
// `workspace` (AttentionTcF32WorkspaceFloats floats of device memory, 16-byte aligned), the
// kernels run, and the results are widened back (dq, dk, dv =; columns outside the heads are not
// touched). lse stays fp32.
int64_t AttentionTcF32WorkspaceFloats(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS);
Status AttentionTcForwardF32(float* out, float* lse, const float* q, const float* k, const float* v,
                             DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                             int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                             float* workspace, cudaStream_t stream);
Status AttentionTcBackwardF32(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                              int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                              float* workspace, cudaStream_t stream);

TRAIND_GPU_END
