// Launchers of the GPU backend's kernels (one .cu per op family). Shapes, letters and the gradient
// contract are those of backend/backend.h; pointers are device pointers. Each launcher checks its
// preconditions (INVALID_ARGUMENT naming the value), launches on `stream` (asynchronously) and
// returns the launch error as INTERNAL. The same declarations serve the nvcc and simt builds.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/gpu_ns.h"
#include "backend/cuda/optim_kernels.h"  // SGD, Adafactor, 8-bit AdamW launchers
#include "backend/quant4.h"
#include "backend/rope_freq.h"
#include "backend/step_scalars.h"
#include "core/dtype.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

// ---- elementwise.cu ----
Status EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                        bool accumulate, cudaStream_t stream);
Status EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                         cudaStream_t stream);
Status AddBias(float* out, const float* bias, int64_t N, int64_t OC, cudaStream_t stream);
Status BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, cudaStream_t stream);
// BiasBackward (its bits) and dout16 = dout rounded to `type` (bf16 or f16) in one pass over dout:
// the bias gradient of a 16-bit linear layer fused into the pass that rounds its output gradient.
Status BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                           DType type, cudaStream_t stream);
Status ScaleRows(float* x, const float* w, int64_t N, int64_t C, cudaStream_t stream);
Status RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C,
              cudaStream_t stream);
Status Add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
Status Scale(float* x, float s, int64_t n, cudaStream_t stream);
// *result (device) += sum of x^2 in double. The caller zeroes *result.
Status SumSquares(double* result, const float* x, int64_t n, cudaStream_t stream);
// *result (device) += (*weight) * sum of x in double (weight: a device float).
Status WeightedSum(double* result, const float* x, int64_t n, const float* weight,
                   cudaStream_t stream);
Status Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
            cudaStream_t stream);
// *flag (device) = 1 when some x is NaN or infinite; untouched otherwise. The caller zeroes it.
Status FlagNonFinite(int* flag, const float* x, int64_t n, cudaStream_t stream);

// ---- quant4.cu ----
// Backend::Dequantize4bit: rows [r0, r1) of q's (rows, cols) weight into out (row stride ld).
Status Dequantize4bitRows(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                          int64_t ld, DType out_type, cudaStream_t stream);

// ---- dropout.cu ----
// backend.h's Dropout; `key` is a device pointer.
Status Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
               const uint64_t* key, uint64_t stream, bool accumulate, cudaStream_t s);

// ---- activation.cu ----
Status GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream);
Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                    cudaStream_t stream);
Status GeluErfForward(float* out, const float* inp, int64_t n, cudaStream_t stream);
Status GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                       cudaStream_t stream);
Status TanhForward(float* out, const float* inp, int64_t n, cudaStream_t stream);
Status TanhBackward(float* dinp, const float* out, const float* dout, int64_t n,
                    cudaStream_t stream);
Status SwiGluForward(float* out, const float* inp, int64_t N, int64_t H, cudaStream_t stream);
Status SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                      cudaStream_t stream);
Status GeGluForward(float* out, const float* inp, int64_t N, int64_t H, cudaStream_t stream);
Status GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                     cudaStream_t stream);

// ---- norm.cu ----
Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps, cudaStream_t stream);
Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, cudaStream_t stream);
Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps, cudaStream_t stream);
Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C,
                       cudaStream_t stream);
// Backend::ResidualNormForward in one pass: res = a + b, then LayerNorm (mean, bias) or, when rms,
// RMSNorm of res into out (out_type f32, bf16 or f16). Bit for bit Add, then LayerNormForward /
// RmsNormForward and, for a 16-bit out, Cast. b == nullptr: the norm of a alone (res unused):
// Backend::LayerNormForwardRounded / RmsNormForwardRounded in one pass.
Status ResidualNormForward(float* res, void* out, DType out_type, float* mean, float* rstd,
                           const float* a, const float* b, const float* weight, const float* bias,
                           int64_t N, int64_t C, float eps, bool rms, cudaStream_t stream);
Status HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                          int64_t n_heads, int64_t HS, int64_t row_stride, float eps,
                          cudaStream_t stream);
Status HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                           const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                           int64_t row_stride, cudaStream_t stream);

// ---- rope.cu ----
Status Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
            float theta, bool inverse, int64_t pos_offset, const RopeScaling& scaling,
            cudaStream_t stream, const int32_t* positions = nullptr);

// ---- attention.cu ----
// HS <= kMaxAttentionHeadSize. AttentionBackward needs `scratch` of B*NH*T floats. causal,
// key_mask (device int32 (B*T) or null) and window (sliding window, 0 = none; negative: an error)
// and doc_start (device int32 (B*T) or null: packed rows) as backend.h's AttentionForward.
constexpr int64_t kMaxAttentionHeadSize = 256;
Status AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                        int64_t kv_stride, bool causal, const int32_t* key_mask, int64_t window,
                        cudaStream_t stream, const int32_t* doc_start = nullptr);
Status AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal,
                         const int32_t* key_mask, int64_t window, float* scratch,
                         cudaStream_t stream, const int32_t* doc_start = nullptr);

// ---- attention_decode.cu ----
// T <= kMaxDecodeRows (the scores of one query row live in shared memory). window > 0: only the
// last min(T, window) rows are attended.
constexpr int64_t kMaxDecodeRows = 8192;
Status AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                       int64_t q_stride, int64_t kv_stride, int64_t window, cudaStream_t stream);

// ---- softmax_ce.cu ----
Status SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float grad_scale, bool compute_grad,
                           const float* device_scale, cudaStream_t stream);

// ---- adamw.cu ----
Status AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bias_correction1,
             float bias_correction2, float grad_scale, cudaStream_t stream);
// AdamW with lr, bias corrections and the gradient multiplier read from `scalars` (device):
// Backend::AdamWFromScalars.
Status AdamWFromScalars(float* param, const float* grad, float* m, float* v, int64_t n,
                        const StepScalars* scalars, float beta1, float beta2, float eps,
                        float weight_decay, cudaStream_t stream);
// Backend::AdamWRunsFromScalars in one launch: the runs cut into chunks of at most
// kAdamWChunkElems elements (AdamWChunksOf, on the host), `chunks` a device copy of that table.
// Each element is updated with its chunk's weight decay exactly as AdamWFromScalars updates it.
// The table is plain device memory read by the kernel, so a launch captured in a graph stays
// valid while the table lives and is not rewritten.
struct AdamWChunk {
  int64_t offset;  // first element in the flat buffers
  int64_t numel;   // <= kAdamWChunkElems
  float weight_decay;
};
constexpr int64_t kAdamWChunkElems = 16384;  // 64 elements per thread of a 256-thread block
constexpr int64_t kAdamWMaxBlocks = 8192;     // grid cap; blocks then loop over the chunks
std::vector<AdamWChunk> AdamWChunksOf(const AdamWRun* runs, int64_t n_runs);
Status AdamWChunksFromScalars(float* param, const float* grad, float* m, float* v,
                              const AdamWChunk* chunks, int64_t n_chunks,
                              const StepScalars* scalars, float beta1, float beta2, float eps,
                              cudaStream_t stream);

TRAIND_GPU_END
