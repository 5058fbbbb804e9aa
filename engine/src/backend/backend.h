// Backend: the one op set every device implements (CPU reference, CUDA, CUDA kernels under simt).
// Layers call these ops with device pointers and never branch on the device.
//
// Conventions (llm.c's):
// - Row-major. N = B*T rows. Letters: B batch, T time, C channels, OC output channels, NH query heads,
//   NKV key/value heads, HS head size, V real vocab, Vp padded vocab, H MLP hidden size.
// - Linear weights are stored (OC, C) like torch.nn.Linear (HF GPT-2 Conv1D weights are transposed
//   on load).
// - Gradient contract: parameter gradients use +=, so accumulation over micro-batches works;
//   activation gradients use =, unless the op's comment says +=.
// - Pointers are device pointers from Alloc(). ids/targets are int32 device arrays.
// - Ops are asynchronous with respect to the host on devices that have a stream; Synchronize()
//   waits. Scalars returned to the host (SumSquares) synchronize.
// - All ops take fp32 buffers unless a DType argument says otherwise.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/quant4.h"
#include "backend/rope_freq.h"
#include "backend/step_scalars.h"
#include "core/dtype.h"
#include "traind/engine/devices.h"  // DeviceCapabilities
#include "traind/engine/status.h"

namespace traind::engine {

// Double-buffered host-to-device transfer of training batches. Two host staging slots (pinned
// memory on CUDA); each Upload is issued on a copy stream, so it overlaps the work already
// queued, and work issued afterwards sees its data. The CPU backend copies synchronously.
// One thread drives it; the backend must outlive it.
class BatchUpload {
 public:
  virtual ~BatchUpload() = default;
  // Host staging buffer of slot 0 or 1 (slot_bytes long). Blocks until the slot's previous copy
  // has finished, so the caller may overwrite it.
  virtual Result<void*> HostSlot(int slot) = 0;
  // Copies the first `bytes` of host slot `slot` to device memory `dst`. The copy waits for the
  // work that was issued before this slot's last Consumed() (the previous readers of `dst`),
  // not for work issued later. INVALID_ARGUMENT when bytes > slot_bytes or slot is not 0 or 1.
  virtual Status Upload(int slot, void* dst, size_t bytes) = 0;
  // Marks the work issued so far as the last reader of what slot `slot` uploaded.
  virtual Status Consumed(int slot) = 0;
};

// Host staging buffers for asynchronous copies both ways between device and host memory, off the
// compute work: `slots()` buffers of `slot_bytes()` (pinned memory on CUDA, a fixed count) and a
// copy stream. A Download sees everything the compute work issued before it wrote; work issued
// after an Upload sees what it wrote; neither blocks the host. Host(slot) waits for the slot's
// copies issued so far, so the host may read what came down or overwrite what went up. What the
// offloaded optimizer's host update streams through (the chunks' gradients down, their weights
// up, the next chunk's copies behind this chunk's update). The default (CPU backend, whose memory
// is the host's) copies synchronously with CopyDeviceToHost / CopyHostToDevice. One thread drives
// it; the backend must outlive it.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  virtual int slots() const = 0;
  virtual size_t slot_bytes() const = 0;
  // The slot's buffer, once its copies issued so far have finished.
  virtual Result<void*> Host(int slot) = 0;
  // Copies `bytes` of device memory `src` into the slot at byte `offset`, after the compute work
  // issued so far.
  virtual Status Download(int slot, size_t offset, const void* src, size_t bytes) = 0;
  // Copies `bytes` at byte `offset` of the slot to device memory `dst`, after the compute work
  // issued so far (its readers of `dst`); compute work issued afterwards sees the data.
  virtual Status Upload(int slot, size_t offset, void* dst, size_t bytes) = 0;

 protected:
  // INVALID_ARGUMENT naming `what` when `slot` or [offset, offset + bytes) is outside the slots.
  Status CheckRange(const char* what, int slot, size_t offset, size_t bytes) const;
};

// The compute ops of the Backend interface, one entry per virtual method below (a new op: add it
// here and see README.md beside this file for the other places it touches). Memory, copies,
// synchronisation, graphs and batch uploads are not ops: every backend has them.
#define TRAIND_BACKEND_OPS(X) \
  X(Gemm) \
  X(LinearForward) \
  X(LinearForwardRoundedAct) \
  X(EmbeddingForward) \
  X(EmbeddingBackward) \
  X(AddBias) \
  X(BiasBackward) \
  X(BiasBackwardRounded) \
  X(ScaleRows) \
  X(RowDot) \
  X(Add) \
  X(Scale) \
  X(SumSquares) \
  X(AccumulateSumSquares) \
  X(AccumulateSum) \
  X(HasNonFinite) \
  X(Cast) \
  X(Dequantize4bit) \
  X(Dropout) \
  X(LayerNormForward) \
  X(LayerNormForwardRounded) \
  X(LayerNormBackward) \
  X(RmsNormForward) \
  X(RmsNormForwardRounded) \
  X(RmsNormBackward) \
  X(HeadRmsNormForward) \
  X(HeadRmsNormBackward) \
  X(ResidualNormForward) \
  X(GeluForward) \
  X(GeluBackward) \
  X(GeluBackwardBias) \
  X(GeluErfForward) \
  X(GeluErfBackward) \
  X(TanhForward) \
  X(TanhBackward) \
  X(SwiGluForward) \
  X(SwiGluForwardRounded) \
  X(SwiGluBackward) \
  X(SwiGluBackwardRounded) \
  X(GeGluForward) \
  X(GeGluBackward) \
  X(Rope) \
  X(AttentionForward) \
  X(AttentionBackward) \
  X(AttentionForward16) \
  X(AttentionBackward16) \
  X(AttentionDecode) \
  X(SoftmaxCrossEntropy) \
  X(AdamW) \
  X(AdamWFromScalars) \
  X(AdamWRunsFromScalars) \
  X(SgdUpdate) \
  X(AdafactorFactoredStats) \
  X(AdafactorSecondMoment) \
  X(AdafactorUpdateSumSquares) \
  X(AdafactorApply) \
  X(AdamW8bitBlockwise)

enum class Op : int {
#define TRAIND_OP_ENUM(name) k##name,
  TRAIND_BACKEND_OPS(TRAIND_OP_ENUM)
#undef TRAIND_OP_ENUM
      kCount
};
inline constexpr int kOpCount = static_cast<int>(Op::kCount);
// "Gemm", "LayerNormForward", ... (the method's name).
const char* OpName(Op op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0", "simt"

  // ---- what the backend implements ----
  // True when `op` is implemented. Default: false for every op except LinearForward, whose default
  // is composed of Gemm, AddBias and GeluForward; so a new backend can start partial and say which
  // ops it has. Calling an op that is not supported does nothing and records UNIMPLEMENTED naming
  // the op and the backend in status() (SumSquares then returns NaN, HasNonFinite true). The CPU
  // backend (the reference) and the GPU backends support every op. The trainer checks the ops a
  // model needs before its first step (CheckSupports).
  virtual bool Supports(Op op) const;

  // ---- memory ----
  // Returns nullptr when the device is out of memory. Alignment: 64 bytes at least.
  virtual void* Alloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual void CopyHostToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyDeviceToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) = 0;
  // A 2-D (strided) copy, as cudaMemcpy2D: `height` rows of `width` bytes, row r from
  // src + r * src_pitch (device) to dst + r * dst_pitch (host); pitches >= width. Synchronous, as
  // CopyDeviceToHost. Default: one CopyDeviceToHost per row; the GPU backends issue one copy.
  virtual void CopyDeviceToHost2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                  size_t width, size_t height);
  virtual void Memset0(void* dst, size_t bytes) = 0;
  virtual void Synchronize() = 0;

  // ---- GEMM ----
  // C(M,N) = alpha * op(A) * op(B) + beta * C, row-major, fp32 accumulation.
  // op(A) is (M,K): A is (M,K) with leading dimension lda, or (K,M) when trans_a.
  // op(B) is (K,N): B is (K,N) with leading dimension ldb, or (N,K) when trans_b.
  // A and B share `ab_type`; C has `c_type` (f32, or equal to ab_type).
  virtual void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                    int64_t ldc, DType ab_type = DType::kF32, DType c_type = DType::kF32);

  // ---- packed GEMM operands (a speed hint; default: none, every B is read as it is) ----
  // A matrix read as B by many GEMMs (a weight between two updates), or by one large one (a layer's
  // input in its weight gradient, nn::GemmPrecision::pack), can be copied once into the layout
  // the device's kernels read fastest. PackedGemmBBytes: the bytes of that copy for a
  // (K x N) B of `type` (0: this backend does not pack it). PackGemmB: copies B (trans_b and ldb
  // as Gemm's) into `storage` (storage_bytes, at least PackedGemmBBytes) and from then on every
  // Gemm / LinearForward(RoundedAct) given this B pointer with this layout, K and N reads the
  // copy; false when it did not (GEMMs then read B itself). The caller owns the staleness: after
  // the values at B change it calls PackGemmB again or ForgetPackedGemmB before the next GEMM that
  // reads it. ForgetPackedGemmB: drops every packed copy of a B in [begin, end) (a model's
  // weights, before they change or are freed). Neither may run while another thread issues ops.
  virtual int64_t PackedGemmBBytes(int64_t K, int64_t N, DType type) const {
    (void)K, (void)N, (void)type;
    return 0;
  }
  virtual bool PackGemmB(void* storage, int64_t storage_bytes, const void* B, bool trans_b,
                         int64_t K, int64_t N, int64_t ldb, DType type) {
    (void)storage, (void)storage_bytes, (void)B, (void)trans_b, (void)K, (void)N, (void)ldb,
        (void)type;
    return false;
  }
  virtual void ForgetPackedGemmB(const void* begin, const void* end) { (void)begin, (void)end; }

  // ---- linear layer forward, with the GEMM epilogues of cuBLASLt where the device has them ----
  // pre(N,OC) = inp(N,C) * weight(OC,C)^T (+ bias(OC) when bias is not null), fp32;
  // when act is not null, also act(N,OC) = GELU(pre) (tanh approximation, as GeluForward), fp32.
  // inp and weight have `type`. Default (CPU, simt): Gemm, AddBias, GeluForward. The CUDA backend
  // fuses the bias add and the GELU into the GEMM (cuBLASLt epilogues BIAS / GELU_AUX(_BIAS)).
  virtual void LinearForward(float* pre, float* act, const void* inp, const void* weight,
                             const float* bias, int64_t N, int64_t C, int64_t OC, DType type);
  // LinearForward with a 16-bit activation (the mixed-precision MLP's input to its down
  // projection): pre as LinearForward; act(N,OC) = GELU(pre) rounded to act_type (bf16 or f16,
  // nearest even), the bits of Cast(LinearForward's fp32 act). scratch: N*OC floats the
  // composition may use. Default: LinearForward(pre, scratch, ...) and Cast (the CUDA epilogue
  // stays fused); the CPU adds the bias, applies GELU and rounds each row in one pass, and leaves
  // scratch alone.
  virtual void LinearForwardRoundedAct(float* pre, void* act, DType act_type, float* scratch,
                                       const void* inp, const void* weight, const float* bias,
                                       int64_t N, int64_t C, int64_t OC, DType type);

  // ---- elementwise / small ops ----
  // out[n, :] (=, or += when accumulate) table[ids[n], :]. out (N,C), table (V,C).
  virtual void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N,
                                int64_t C, bool accumulate);
  // dtable[ids[n], :] += dout[n, :].
  virtual void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                                 int64_t C);
  // out(N,OC) += bias(OC) broadcast over rows.
  virtual void AddBias(float* out, const float* bias, int64_t N, int64_t OC);
  // dbias(OC) += sum over rows of dout(N,OC).
  virtual void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC);
  // BiasBackward and dout16(N,OC) = dout rounded to `type` (bf16 or f16, as Cast): what a 16-bit
  // linear layer's backward needs of its output gradient. Default: BiasBackward, then Cast; the
  // CPU rounds each row while it sums it (dbias keeps BiasBackward's bits).
  virtual void BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC,
                                   void* dout16, DType type);
  // x(N,C) row n *= w[n] (mixture of experts: each expert row by its routing weight).
  virtual void ScaleRows(float* x, const float* w, int64_t N, int64_t C);
  // out[n] = sum_c a[n,c] * b[n,c] (=), accumulated in double; a, b (N,C).
  virtual void RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C);
  // out = a + b, n elements (out may alias a or b).
  virtual void Add(float* out, const float* a, const float* b, int64_t n);
  // x *= s.
  virtual void Scale(float* x, float s, int64_t n);
  // Sum of squares of x, accumulated in double; synchronizes.
  virtual double SumSquares(const float* x, int64_t n);
  // *acc (device double) += sum of squares of x, accumulated in double; asynchronous.
  virtual void AccumulateSumSquares(double* acc, const float* x, int64_t n);
  // *acc (device double) += (*weight) * sum of x (weight: a device float); asynchronous.
  virtual void AccumulateSum(double* acc, const float* x, int64_t n, const float* weight);
  // True when some x is NaN or infinite (the fp16 loss-scaler's overflow check); synchronizes.
  // Default: through SumSquares (a non-finite element makes the double sum non-finite; finite
  // floats cannot overflow it). Backends may override with a cheaper flag kernel.
  virtual bool HasNonFinite(const float* x, int64_t n) { return !std::isfinite(SumSquares(x, n)); }
  // dst = src converted (round to nearest even), n elements.
  virtual void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);
  // QLoRA's frozen base: rows [r0, r1) of the (rows, cols) weight the 4-bit tensor q holds
  // row-major (q.n == rows * cols, 0 <= r0 <= r1 <= rows; every pointer in q a device pointer,
  // nested_code too) into out, row r at out + (r - r0) * ld elements of out_type (f32, bf16 or
  // f16; ld >= cols): bitsandbytes' dequantize_4bit bits (backend/quant4.h), 16-bit outputs
  // rounded to nearest even. The scratch a GEMM then reads.
  virtual void Dequantize4bit(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                              int64_t ld, DType out_type);
  // Inverted dropout (LoRA's lora_dropout): out (=, or += when accumulate) inp[i] * (keep(i) ?
  // 1 / (1 - p) : 0) over n elements (a product, as torch: a dropped inf/NaN gives NaN), inp of
  // `inp_type` (f32, bf16, f16), out fp32. keep(i) is the
  // counter-based hash of dropout_rng.h: DropoutKeep(DropoutBase(*key, stream), i, p), key a
  // device uint64 (so a captured graph draws a fresh mask when the key changes between replays),
  // stream a per-call constant (layer, adapter). The same (key, stream) gives the same mask: a
  // backward regenerates the forward's mask. 0 <= p < 1; out must not alias inp unless both fp32.
  virtual void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
                       const uint64_t* key, uint64_t stream, bool accumulate);

  // ---- norms ----
  // LayerNorm over C: out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C).
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int64_t N, int64_t C,
                                float eps);
  // LayerNormForward with out rounded to out_type (bf16 or f16, Cast's bits) into out16 (N,C);
  // out32 (N*C floats) is the composition's scratch and holds nothing the caller may read.
  // Default: LayerNormForward into out32, then Cast; the CPU rounds each row as it normalises it.
  virtual void LayerNormForwardRounded(void* out16, DType out_type, float* out32, float* mean,
                                       float* rstd, const float* inp, const float* weight,
                                       const float* bias, int64_t N, int64_t C, float eps);
  // dinp +=, dweight +=, dbias +=.
  virtual void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int64_t N, int64_t C);
  // RMSNorm (HF LlamaRMSNorm): out = inp * rsqrt(mean(inp^2) + eps) * weight. rstd (N).
  virtual void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight,
                              int64_t N, int64_t C, float eps);
  // RmsNormForward rounded to out_type into out16, as LayerNormForwardRounded.
  virtual void RmsNormForwardRounded(void* out16, DType out_type, float* out32, float* rstd,
                                     const float* inp, const float* weight, int64_t N, int64_t C,
                                     float eps);
  // res(N,C) = a + b (Add's bits), then res normalised into out: LayerNorm (weight, bias, mean)
  // or, when rms, RMSNorm (weight; bias and mean unused); out fp32 when out_type is f32, else
  // rounded to out_type (the Rounded norms' bits). The decoder's residual add and the norm after
  // it. scratch: N*C floats the composition may use (16-bit out), read after a and b: it may be b.
  // Default: Add, then the norm op; the CPU adds and normalises each row in one pass.
  virtual void ResidualNormForward(float* res, void* out, DType out_type, float* scratch,
                                   float* mean, float* rstd, const float* a, const float* b,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps, bool rms);
  // dinp +=, dweight +=.
  virtual void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int64_t N, int64_t C);
  // Per-head RMSNorm (HF Qwen3's q_norm / k_norm, over each head of q and k before RoPE): x holds
  // N rows of `row_stride` floats, each with n_heads heads of HS floats from offset 0; every head
  // is normalised in place, x = x * rsqrt(mean(x^2) + eps) * weight (HS floats, shared by the
  // heads). saved (N, n_heads*HS contiguous) receives the input and rstd (N*n_heads; row n, head
  // h at n*n_heads + h) each head's reciprocal RMS, for the backward; either may be null.
  virtual void HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight,
                                  int64_t N, int64_t n_heads, int64_t HS, int64_t row_stride,
                                  float eps);
  // Its backward in place: dx (the forward's layout) holds d(output) and becomes d(input) (=);
  // dweight (HS) +=. saved and rstd are the forward's. Columns past the heads are not touched.
  virtual void HeadRmsNormBackward(float* dx, float* dweight, const float* saved,
                                   const float* weight, const float* rstd, int64_t N,
                                   int64_t n_heads, int64_t HS, int64_t row_stride);

  // ---- activations ----
  // GELU, tanh approximation (HF "gelu_new"). out may alias inp.
  virtual void GeluForward(float* out, const float* inp, int64_t n);
  // dinp = dout * gelu'(inp). dinp may alias dout.
  virtual void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);
  // GeluBackward over (N,OC), then dbias(OC) += the column sums of dinp (when dbias is not null)
  // and, when dinp16 is not null, dinp16(N,OC) = dinp rounded to `type` (bf16 or f16, as Cast):
  // the MLP's GELU backward with its up projection's bias gradient (and 16-bit output gradient).
  // dinp may alias dout. With dinp16 given, dinp is scratch whose contents afterwards are
  // unspecified: read dinp16 (the CPU does not store the fp32 gradient at all; the default
  // composition leaves it in dinp). Default: GeluBackward, then BiasBackward /
  // BiasBackwardRounded / Cast; the CPU does all of it in one pass over each row (the bits of the
  // composition when OC is a multiple of 16).
  virtual void GeluBackwardBias(float* dinp, const float* inp, const float* dout, float* dbias,
                                int64_t N, int64_t OC, void* dinp16, DType type);
  // Exact GELU (HF "gelu", BERT): out = x * 0.5 * (1 + erf(x / sqrt(2))). out may alias inp.
  virtual void GeluErfForward(float* out, const float* inp, int64_t n);
  // dinp = dout * (0.5 * (1 + erf(x / sqrt(2))) + x * exp(-x^2 / 2) / sqrt(2 pi)), x = inp.
  // dinp may alias dout.
  virtual void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n);
  // out = tanh(inp) (BERT's pooler). out may alias inp.
  virtual void TanhForward(float* out, const float* inp, int64_t n);
  // dinp = dout * (1 - out^2), from the forward's output. dinp may alias dout.
  virtual void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n);
  // SwiGLU: inp (N, 2H) holds [gate | up] per row; out (N,H) = silu(gate) * up.
  virtual void SwiGluForward(float* out, const float* inp, int64_t N, int64_t H);
  // SwiGluForward's output rounded to out_type (bf16 or f16, as Cast) into out (N,H): the 16-bit
  // activation the down projection reads. scratch (N,H fp32) is for the default, SwiGluForward
  // into scratch then Cast; the CPU rounds each row as it computes it (the same bits).
  virtual void SwiGluForwardRounded(void* out, DType out_type, float* scratch, const float* inp,
                                    int64_t N, int64_t H);
  // dinp (N, 2H) = d/d[gate|up] given dout (N,H).
  virtual void SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                              int64_t H);
  // SwiGluBackward's gradient rounded to `type` (bf16 or f16, as Cast) into dinp16 (N, 2H): the up
  // projection's 16-bit output gradient. dinp (N, 2H) is scratch whose contents afterwards are
  // unspecified. Default: SwiGluBackward into dinp then Cast; the CPU rounds each row as it
  // computes it (the same bits) and does not store the fp32 gradient.
  virtual void SwiGluBackwardRounded(float* dinp, void* dinp16, DType type, const float* inp,
                                     const float* dout, int64_t N, int64_t H);
  // GeGLU (HF Gemma's MLP, hidden_activation gelu_pytorch_tanh): inp (N, 2H) holds [gate | up]
  // per row; out (N,H) = gelu(gate) * up, GeluForward's tanh GELU.
  virtual void GeGluForward(float* out, const float* inp, int64_t N, int64_t H);
  // dinp (N, 2H) = d/d[gate|up] given dout (N,H).
  virtual void GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                             int64_t H);

  // ---- rotary position embedding (HF rotate-half convention) ----
  // x: B*T rows of `row_stride` floats; each row holds `n_heads` heads of HS floats starting at
  // offset 0. Position of row r is pos_offset + r % T (pos_offset > 0: decoding rows of a
  // sequence whose first pos_offset positions are already cached). inv_freq[i] = 1 /
  // theta^(2i/HS) computed in fp32, angle = t * inv_freq[i] in fp32; x[i], x[i+HS/2] rotated by
  // angle. In place. inverse=true applies the transpose rotation (the backward of the forward).
  // `scaling` (HF rope_scaling: linear, llama3) rescales inv_freq as RopeInvFreq (rope_freq.h) does.
  // positions, when not null, is a device int32 array (B*T): row r's position is positions[r]
  // (packed rows: each example's positions restart at 0); pos_offset is then ignored.
  virtual void Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
                    float theta, bool inverse, int64_t pos_offset = 0,
                    const RopeScaling& scaling = RopeScaling{},
                    const int32_t* positions = nullptr);

  // ---- self-attention, causal or not, with an optional key padding mask (flash-style contract:
  // no (T,T) buffer is kept) ----
  // q: B*T rows, stride q_stride, NH heads of HS. k, v: B*T rows, stride kv_stride, NKV heads of HS
  // (NH % NKV == 0; query head h uses kv head h / (NH/NKV)). out (B*T, NH*HS) contiguous.
  // lse (B, NH, T): log-sum-exp of the scaled scores per query, saved for backward.
  // scale = 1/sqrt(HS). Query i of sequence b attends key j when (!causal || j <= i) and
  // (key_mask == nullptr || key_mask[b*T + j] != 0); key_mask is a device int32 array (B*T).
  // window > 0 (sliding-window attention, HF Mistral): query i also needs i - j < window, so it
  // attends its `window` most recent keys (itself included); 0 = no window.
  // doc_start, when not null, is a device int32 array (B*T) for packed rows: query i of sequence
  // b also needs j >= doc_start[b*T + i] (the first row of its example within the sequence), so
  // attention never crosses an example; with causal, doc_start[b*T+i] <= i.
  // Masked keys get exactly zero weight (HF BERT's additive finfo.min mask). A query whose keys
  // are all masked gets out = 0 and lse = 0, and contributes nothing to dq, dk, dv. Query rows at
  // padded positions are computed like any other.
  // operand_type kBF16 lets the backend round the operands of the score and output products (q,
  // k, v, the probabilities; in backward also dout and dS) to bf16 with fp32 accumulation, as
  // PyTorch's autocast does for attention's matmuls; the softmax, lse and the accumulated
  // gradients stay fp32. A backend without a fast bf16 product computes in fp32 (the CPU backend
  // uses oneDNN's bf16 kernels where the CPU has them; CUDA and simt use the tensor-core kernel
  // for head sizes it has, rounding the fp32 tensors into a workspace). The models' 16-bit jobs
  // call AttentionForward16/AttentionBackward16 below instead.
  virtual void AttentionForward(float* out, float* lse, const float* q, const float* k,
                                const float* v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                int64_t HS, int64_t q_stride, int64_t kv_stride,
                                bool causal = true, const int32_t* key_mask = nullptr,
                                DType operand_type = DType::kF32, int64_t window = 0,
                                const int32_t* doc_start = nullptr);
  // dq, dk, dv (=; same layouts and strides as q, k, v; GQA sums over the heads of a group).
  // Parts of a row outside the heads (e.g. the k,v thirds of a fused qkv row when dq points at
  // it) are not touched. causal, key_mask, window and doc_start must be the forward's.
  virtual void AttentionBackward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q,
                                 const float* k, const float* v, int64_t B, int64_t T, int64_t NH,
                                 int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                 bool causal = true, const int32_t* key_mask = nullptr,
                                 DType operand_type = DType::kF32, int64_t window = 0,
                                 const int32_t* doc_start = nullptr);
  // The same attention on 16-bit tensors (bf16 and fp16 jobs): q, k, v, out and, in backward,
  // dout hold `type` elements (kBF16 or kF16; strides count elements), read by the score and
  // output products as they are, with fp32 accumulation; the softmax, lse and dq, dk, dv (fp32,
  // =, q's and k's layouts as above) stay fp32; out is the fp32 result rounded to `type`. The
  // CPU gives AttentionForward/Backward's numbers with operand_type = type on the widened
  // tensors; CUDA and simt run the tensor-core kernel on them directly (no conversion
  // workspace) for the head sizes it has, else widen them into a workspace for the fp32 kernel.
  virtual void AttentionForward16(void* out, float* lse, const void* q, const void* k,
                                  const void* v, DType type, int64_t B, int64_t T, int64_t NH,
                                  int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                  bool causal = true, const int32_t* key_mask = nullptr,
                                  int64_t window = 0, const int32_t* doc_start = nullptr);
  virtual void AttentionBackward16(float* dq, float* dk, float* dv, const void* dout,
                                   const void* out, const float* lse, const void* q,
                                   const void* k, const void* v, DType type, int64_t B, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                                   int64_t kv_stride, bool causal = true,
                                   const int32_t* key_mask = nullptr, int64_t window = 0,
                                   const int32_t* doc_start = nullptr);

  // ---- attention of new tokens against a key/value cache (generation) ----
  // One query row per sequence: q (B rows, stride q_stride, NH heads of HS). k, v: the caches,
  // B blocks of `cache_rows` rows each (stride kv_stride, NKV heads of HS; GQA as above); the
  // first T rows of every block are attended (the new token's own row included: it is written to
  // the cache first). out (B, NH*HS) contiguous = softmax(q k^T / sqrt(HS)) v over those rows;
  // with window > 0 only the last min(T, window) of them.
  virtual void AttentionDecode(float* out, const float* q, const float* k, const float* v,
                               int64_t B, int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV,
                               int64_t HS, int64_t q_stride, int64_t kv_stride,
                               int64_t window = 0);

  // ---- fused softmax + cross-entropy over the logits ----
  // logits (N, Vp); only columns [0, V) are real. targets (N): -1 = ignored row.
  // losses (N) = -log softmax(logits[n, :V])[targets[n]] (0 for ignored rows).
  // When compute_grad: logits are overwritten in place with
  // dlogits = (softmax - onehot) * grad_scale (0 in padded columns and ignored rows), so no
  // second logits-sized buffer exists. `device_scale`, when not null, is a device float that
  // multiplies grad_scale (so a captured step can change it between replays).
  // `grad16`, when not null (with compute_grad): the gradient goes there instead, (N, Vp) in the
  // 16-bit `grad16_type`, bit for bit what the in-place gradient followed by Cast gives, and the
  // logits are left unspecified (a 16-bit lm-head backward reads the rounded gradient anyway: the
  // CPU writes it in the pass that computes it, never writing the fp32 gradient to memory).
  virtual void SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float grad_scale, bool compute_grad,
                                   const float* device_scale, void* grad16 = nullptr,
                                   DType grad16_type = DType::kBF16);

  // ---- optimizer ----
  // AdamW (torch.optim.AdamW semantics), in place on n elements:
  //   p -= lr * weight_decay * p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
  //   p -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
  // with bias_correction{1,2} = 1 - b{1,2}^step given by the caller. g is read as grad_scale * grad.
  virtual void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay,
                     float bias_correction1, float bias_correction2, float grad_scale);
  // The same update with lr, the bias corrections and the gradient multiplier taken from device
  // memory: grad_scale = StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm); nothing
  // is changed when s->skip_nonfinite and grad_sq is not finite. Capturable.
  virtual void AdamWFromScalars(float* param, const float* grad, float* m, float* v, int64_t n,
                                const StepScalars* s, float beta1, float beta2, float eps,
                                float weight_decay);
  // AdamWFromScalars over several runs of the flat buffers at once, each [offset, offset + numel)
  // with its own weight decay (a model's decayed weights alternate with undecayed biases and
  // norms; AdamWRun in step_scalars.h): the bits of one AdamWFromScalars call per run. `runs` is
  // host memory, read during the call. Default: one AdamWFromScalars per run; the CPU updates every run in one parallel pass.
  virtual void AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                                    const AdamWRun* runs, int64_t n_runs, const StepScalars* s,
                                    float beta1, float beta2, float eps);

  // ---- SGD, Adafactor, 8-bit AdamW (engine/src/optim/; the CPU kernels of cpu/cpu_optim.h are the
  // reference semantics, each contract in full there). In place, asynchronous; device scalars
  // (row_sum, acc, sums) are doubles in device memory, so nothing is read back to the host. ----
  // torch.optim.SGD, g = grad_scale * grad: g += weight_decay * p; with momentum (buf may be null
  // when momentum == 0): buf = first_step ? g : momentum * buf + (1 - dampening) * g, g = nesterov
  // ? g + momentum * buf : buf; p -= lr * g. `s` (nullable, device): lr = s->lr, grad_scale *=
  // StepGradMultiplier(...) and the fp16 skip, as AdamWFromScalars (capturable).
  virtual void SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr,
                         float momentum, float dampening, float weight_decay, bool nesterov,
                         bool first_step, float grad_scale, const StepScalars* s);
  // Adafactor (HF), factored second moment of a (B, R, C) tensor: row (B,R) and col (B,C) moving
  // averages of the means of g^2 + eps1 over C and over R; row_sum (B) = sum over R of the new row.
  virtual void AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum,
                                      int64_t B, int64_t R, int64_t C, float beta2t, float eps1,
                                      float grad_scale);
  // Adafactor, unfactored: v = beta2t * v + (1 - beta2t) * (g^2 + eps1).
  virtual void AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t,
                                     float eps1, float grad_scale);
  // *acc += sum of update^2, update = g * rsqrt(row / mean_R(row)) * rsqrt(col) (v null), else
  // g * rsqrt(v) (B = R = 1, C = n).
  virtual void AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row,
                                         const float* col, const double* row_sum, const float* v,
                                         int64_t B, int64_t R, int64_t C, float grad_scale);
  // Applies the update; sums = {sum of p^2 before the step, sum of update^2}; step size, clipping,
  // first moment (m may be null) and weight decay as cpu_optim.h's AdafactorApply.
  virtual void AdafactorApply(float* param, float* m, const float* grad, const float* row,
                              const float* col, const double* row_sum, const float* v,
                              const double* sums, int64_t B, int64_t R, int64_t C, float grad_scale,
                              float rel_step, float eps2, bool scale_parameter,
                              float clip_threshold, float beta1, float weight_decay);
  // bitsandbytes' blockwise 8-bit AdamW over n elements (blocks of 256; codes uint8, absmax fp32
  // per block; code_m/code_v: the 256-entry code tables in device memory). `s` as SgdUpdate's; the
  // bias corrections then come from it too.
  virtual void AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes,
                                  uint8_t* v_codes, float* m_absmax, float* v_absmax,
                                  const float* code_m, const float* code_v, int64_t n, float lr,
                                  float beta1, float beta2, float eps, float weight_decay,
                                  float bias_correction1, float bias_correction2, float grad_scale,
                                  const StepScalars* s);

  // ---- device capabilities (defaults: none; the GPU backends override) ----
  // The device's policy-relevant capabilities (DeviceCapabilities, devices.h). Default: a device with
  // its own memory, asynchronous ops, no packing, no tensor cores and no data parallel (what a
  // test backend is treated as); the cpu, cuda and simt backends answer for themselves.
  virtual DeviceCapabilities capabilities() const { return DeviceCapabilities{}; }
  // The first error an op hit (OK when none). Ops do not abort on bad input on the GPU backends;
  // they do nothing and report here. The CPU backend's ops do not fail.
  virtual const Status& status() const { return unsupported_; }
  // Free and total device memory in bytes. UNIMPLEMENTED on backends without a device memory of
  // their own (the CPU backend: the planner uses host RAM).
  virtual Status MemoryInfo(size_t* free_bytes, size_t* total_bytes) const {
    return Status::Unimplemented("MemoryInfo: " + name() + " has no device memory of its own");
  }
  // Graph capture: when SupportsGraphs(), the ops issued between BeginCapture and EndCapture are
  // recorded, not run; EndCapture returns the graph's id and Replay(id) runs that sequence again
  // (same pointers, same scalar arguments; values the ops read from device memory may change).
  // A backend keeps every graph until it is destroyed. Ops that return values to the host
  // (SumSquares, HasNonFinite, copies to the host) must not be issued while capturing.
  virtual bool SupportsGraphs() const { return false; }
  virtual Status BeginCapture() { return Status::Unimplemented("graph capture on " + name()); }
  virtual Result<int> EndCapture() { return Status::Unimplemented("graph capture on " + name()); }
  virtual Status Replay(int graph) {
    return Status::Unimplemented("graph replay " + std::to_string(graph) + " on " + name());
  }

  // ---- markers: a point in the work issued so far, that another host thread waits for ----
  // Data parallel's gradient buckets (train/overlapped_allreduce.h): the trainer's thread records
  // a marker when backward has issued a block's gradients; the communication thread waits for it
  // before it hands the bucket to the communicator. NewMarker allocates one (before the step
  // loop: nothing is allocated in the step); RecordMarker(id), on the thread that issues ops,
  // marks the work issued so far on the backend's compute stream (not while capturing a graph);
  // WaitMarker(id), on any thread, returns once that work has finished (the device's error
  // otherwise). A marker is recorded again only after the wait for its previous record returned.
  // Defaults, for backends whose ops have finished when they return (cpu): nothing to record or
  // wait for (NewMarker returns 0).
  virtual Result<int> NewMarker() { return 0; }
  virtual Status RecordMarker(int marker) {
    (void)marker;
    return Status::Ok();
  }
  virtual Status WaitMarker(int marker) {
    (void)marker;
    return Status::Ok();
  }

  // ---- batch uploads ----
  // A double-buffered uploader with slots of `slot_bytes`. Default: plain host slots copied with
  // CopyHostToDevice (synchronous); the GPU backends use pinned slots and a copy stream.
  virtual Result<std::unique_ptr<BatchUpload>> MakeBatchUpload(size_t slot_bytes);
  // `slots` staging buffers of `slot_bytes` each (HostStaging). Default: plain host buffers and
  // the synchronous copies; the GPU backends pin them and copy on their own stream.
  virtual Result<std::unique_ptr<HostStaging>> MakeHostStaging(int slots, size_t slot_bytes);

 protected:
  // What the default op bodies call: records UNIMPLEMENTED for `op` (the first one) in status().
  void Unsupported(Op op);

 private:
  Status unsupported_;
};

// OK when `backend` supports every op in `ops`, else FAILED_PRECONDITION naming the first missing
// op and the backend ("backend simt does not implement op Rope, which this model needs").
Status CheckSupports(const Backend& backend, const std::vector<Op>& ops);

// The CPU backend (always available; the reference). threads = 0: all cores.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);
// Whether the CPU backend keeps packed copies of GEMM B operands of `type` (its PackedGemmBBytes
// is > 0 for them; cpu::DnnlPackedBBytes applies this rule): fp32 and, where the CPU has bf16
// arithmetic, bf16, when its GEMMs go to oneDNN. What a model on the cpu device plans packed
// weights for (models/layout.h). A CPU query, no kernel and no allocation: the daemon's planner
// calls it too.
bool CpuPacksGemmB(DType type);

}  // namespace traind::engine
