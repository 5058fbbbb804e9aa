// The CPU backend's kernels as free functions (one file per op family), called by CpuBackend.
// Shapes, letters and the gradient contract are those of backend/backend.h; every function takes
// `nt`, the number of OpenMP threads it may use. Results are deterministic for a given nt.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/rope_freq.h"
#include "core/dtype.h"
#include "core/half.h"  // the scalar conversions the array casts must match

// Hot inner loops are compiled for AVX-512, AVX2+FMA and baseline x86-64, picked at load time.
// Not under ThreadSanitizer: gcc instruments the ifunc resolvers, which the dynamic loader runs
// before TSan's runtime is initialised, so every binary crashed at load (./run.sh sanitize tsan).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TRAIND_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TRAIND_CPU_CLONES
#endif

namespace traind::engine::cpu {

// ---- numeric helpers (cpu_cast.cc) ----
void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, int nt);
// n floats -> bf16, round to nearest even (F32ToBF16's bits), on the calling thread.
void F32ToBf16Span(uint16_t* dst, const float* src, int64_t n);
// n floats -> f16, round to nearest even (F32ToF16's bits), on the calling thread.
void F32ToF16Span(uint16_t* dst, const float* src, int64_t n);
// n floats -> `type` (bf16 or f16: one of the two above), on the calling thread.
void F32To16Span(uint16_t* dst, const float* src, int64_t n, DType type);
// backend.h's Dropout with the key's value (cpu_dropout.cc).
void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p, uint64_t key,
             uint64_t stream, bool accumulate, int nt);

// ---- GEMM (cpu_gemm.cc) ----
// backend.h's Gemm: C(M,N) = alpha op(A) op(B) + beta C, row-major. f32 goes to OpenBLAS sgemm;
// bf16/f16 inputs are widened to f32 (exact) and C is rounded back when c_type is 16-bit.
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, DType ab_type,
          DType c_type, int nt);
// A linear layer's product: out (N, OC, fp32) = inp (N, C) weight^T (weight (OC, C)), both of
// `type`, plus bias (OC floats) when the library added it as it stored out (oneDNN's matmul:
// ops_bench linear, 3-10% faster than the GEMM and a bias pass on 16-bit products and fp32 ones
// of up to 1024 outputs); returns whether it did, else the caller adds the bias.
bool LinearGemm(float* out, const void* inp, const void* weight, const float* bias, int64_t N,
                int64_t C, int64_t OC, DType type, int nt);
// fp32 row-major GEMM into the library (oneDNN or OpenBLAS) with up to nt threads. Inside an
// OpenMP parallel region it runs on the calling thread only (oneDNN does not nest).
void Sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int nt);
// 16-bit A/B through oneDNN matmul (cpu_gemm_dnnl.cc). Returns false, having done nothing, when
// oneDNN is absent or has no fast kernel for the case; Gemm then widens to fp32.
bool DnnlGemm16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                int64_t ldc, DType ab_type, DType c_type, int nt);
// DnnlGemm16's matmul for any operand type (fp32 too), with an optional bias (N fp32 values, one
// per column of C) added as C is stored. Returns false, having done nothing, when oneDNN is absent
// or has no fast kernel for the case.
bool DnnlMatmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                int64_t ldc, DType ab_type, DType c_type, const float* bias, int nt);
// Packed B operands (Backend::PackGemmB). DnnlPackedBBytes: the bytes of a (K x N) B of `type`
// in the layout oneDNN's matmul reads fastest (0: no packing for it: not bf16 or fp32, no oneDNN,
// or OpenBLAS chosen). DnnlPackB: copies B (tb/ldb as DnnlMatmul's) into storage in that layout and
// registers it, so that every DnnlMatmul with this B pointer and layout reads the copy; false
// (nothing registered, any earlier registration of B dropped) when it cannot. DnnlForgetPackedB:
// drops the registrations of B in [begin, end) made by owner (nullptr: anyone's). Registrations
// are process-wide; they change only while no GEMM runs.
int64_t DnnlPackedBBytes(int64_t K, int64_t N, DType type);
bool DnnlPackB(void* storage, int64_t storage_bytes, const void* B, bool tb, int64_t K, int64_t N,
               int64_t ldb, DType type, const void* owner, int nt);
void DnnlForgetPackedB(const void* begin, const void* end, const void* owner);
// DnnlMatmul when B has a packed copy registered for this layout (fp32 GEMMs otherwise go to
// dnnl_sgemm); false, having done nothing, when it has none.
bool DnnlMatmulPackedB(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                       int64_t ldc, DType ab_type, DType c_type, int nt);
// B (K x N of 16-bit values; tb/ldb as Gemm's) into dst in oneDNN's BA16a64b2a layout (cpu_pack.cc;
// (K rounded up to 32) x (N rounded up to 64) values, the padding zero), nt threads.
void PackBA16a64b2a(void* dst, const uint16_t* b, bool tb, int64_t K, int64_t N, int64_t ldb, int nt);
// fp32 B into BA16a64b ((K rounded up to 16) x (N rounded up to 64) floats, blocks of 16 x 64).
void PackBA16a64b(void* dst, const float* b, bool tb, int64_t K, int64_t N, int64_t ldb, int nt);
// Whether the CPU has the bf16 arithmetic oneDNN's bf16 matmul runs on (AVX512-BF16 or AMX, as
// oneDNN reports its ISA; ONEDNN_MAX_CPU_ISA can lower it). Without it oneDNN emulates bf16 on
// AVX-512 at a fifth of sgemm's rate (a Cascade Lake VM: 52 against 227-248 GFLOP/s,
// bench/README.md), so bf16 GEMMs are refused here (DnnlMatmul false, DnnlPackedBBytes 0) and
// widen to fp32 for sgemm: exact operands, fp32 accumulation, the same products. Decided once per
// process.
bool Bf16GemmNative();
// Tests only: 1 takes oneDNN's bf16 matmul whatever the CPU (its emulation where it has no bf16
// instructions: slow, the same products), 0 refuses it, -1 lets the CPU decide again. Returns the
// setting it replaced. Only while no GEMM runs.
int SetBf16GemmNativeForTesting(int native);
// Whether bf16 products through oneDNN run native kernels here (Bf16GemmNative) and fp32 GEMMs go
// to oneDNN (not TRAIND_CPU_GEMM=openblas): what lets attention use oneDNN's bf16 tiles.
bool Bf16TileProductsNative();
// Configures the GEMM libraries for nt threads (OpenBLAS: 1 internal thread, process-global;
// Sgemm threads it over OpenMP itself).
void SetGemmThreads(int nt);
// "onednn" or "openblas": the library fp32 GEMMs go to (TRAIND_CPU_GEMM=openblas forces OpenBLAS).
const char* GemmLibrary();
// Tests only: route GEMMs to oneDNN (true) or OpenBLAS (false). Returns false when the choice is
// not available in this build.
bool SetGemmLibraryForTesting(bool use_onednn);

// ---- elementwise (cpu_elementwise.cc) ----
void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                      bool accumulate, int nt);
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                       int nt);
void AddBias(float* out, const float* bias, int64_t N, int64_t OC, int nt);
void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, int nt);
// backend.h's BiasBackwardRounded: BiasBackward's column chunks, each row's chunk also rounded
// into dout16 (bf16 or f16) while it is in cache.
void BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                         DType type, int nt);
// The epilogue of a linear layer with GELU, row by row: pre(N,OC) += bias (when not null), then
// act = GELU(pre) (GeluForward's bits) in act_type: fp32, or bf16/f16 rounded to nearest even
// (Cast's bits).
void BiasGelu(float* pre, const float* bias, int64_t N, int64_t OC, void* act, DType act_type,
              int nt);
void ScaleRows(float* x, const float* w, int64_t N, int64_t C, int nt);
void RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C, int nt);
void Add(float* out, const float* a, const float* b, int64_t n, int nt);
// out[i] = a[i] + b[i] for i < n on the calling thread (Add's and the residual norm's row body).
void AddSpan(float* out, const float* a, const float* b, int64_t n);
void Scale(float* x, float s, int64_t n, int nt);
double SumSquares(const float* x, int64_t n, int nt);
bool HasNonFinite(const float* x, int64_t n, int nt);  // any NaN or +-inf
void GeluForward(float* out, const float* inp, int64_t n, int nt);
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n, int nt);
// backend.h's GeluBackwardBias: BiasBackward's column chunks, each row's chunk through GELU's
// backward, summed into dbias and rounded into dinp16 while it is in cache.
void GeluBackwardBias(float* dinp, const float* inp, const float* dout, float* dbias, int64_t N,
                      int64_t OC, void* dinp16, DType type, int nt);
void GeluErfForward(float* out, const float* inp, int64_t n, int nt);
void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n, int nt);
void TanhForward(float* out, const float* inp, int64_t n, int nt);
void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n, int nt);
void SwiGluForward(float* out, const float* inp, int64_t N, int64_t H, int nt);
void SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H, int nt);
void GeGluForward(float* out, const float* inp, int64_t N, int64_t H, int nt);
void GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H, int nt);
// backend.h's SwiGluForwardRounded / SwiGluBackwardRounded: each row computed, then rounded.
void SwiGluForwardRounded(void* out, DType out_type, const float* inp, int64_t N, int64_t H,
                          int nt);
void SwiGluBackwardRounded(float* dinp, void* dinp16, DType type, const float* inp,
                           const float* dout, int64_t N, int64_t H, int nt);
void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float bias_correction1,
           float bias_correction2, float grad_scale, int nt);

// ---- norms (cpu_norm.cc) ----
// LayerNormForward / RmsNormForward with each row rounded into out16 (bf16 or f16, Cast's bits)
// as it is normalised (backend.h's *Rounded ops).
void LayerNormForwardRounded(void* out16, DType out_type, float* mean, float* rstd,
                             const float* inp, const float* weight, const float* bias, int64_t N,
                             int64_t C, float eps, int nt);
// backend.h's ResidualNormForward: each row added (Add's bits) and normalised (the norm ops' bits,
// rounded when out_type is 16-bit) in one pass.
void ResidualNormForward(float* res, void* out, DType out_type, float* mean, float* rstd,
                         const float* a, const float* b, const float* weight, const float* bias,
                         int64_t N, int64_t C, float eps, bool rms, int nt);
void RmsNormForwardRounded(void* out16, DType out_type, float* rstd, const float* inp,
                           const float* weight, int64_t N, int64_t C, float eps, int nt);
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C, float eps, int nt);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t N, int64_t C, int nt);
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                    int64_t C, float eps, int nt);
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int64_t N, int64_t C, int nt);
// backend.h's HeadRmsNormForward / HeadRmsNormBackward (RmsNormRow per head).
void HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                        int64_t n_heads, int64_t HS, int64_t row_stride, float eps, int nt);
void HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                         const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                         int64_t row_stride, int nt);

// ---- rotary embedding (cpu_rope.cc) ----
void Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
          float theta, bool inverse, int64_t pos_offset, const RopeScaling& scaling, int nt,
          const int32_t* positions = nullptr);

// ---- attention (cpu_attention.cc) ----
// backend.h's contract; window > 0 (sliding window: query i sees key j only when i - j < window;
// window <= 0 or >= T: none) in every path, the key blocks outside a query block's windows skipped.
void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                      int64_t kv_stride, bool causal, const int32_t* key_mask,
                      DType operand_type, int64_t window, int nt,
                      const int32_t* doc_start = nullptr);
void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                       int64_t kv_stride, bool causal, const int32_t* key_mask,
                       DType operand_type, int64_t window, int nt,
                       const int32_t* doc_start = nullptr);
// backend.h's AttentionForward16/Backward16: q, k, v, out (and dout) in `type` (bf16 or f16),
// AttentionForward/Backward's numbers with operand_type = type, out rounded as Cast. Where bf16
// takes the CPU's own bf16 dot products the tiles read the bf16 bits as they are; elsewhere the
// tensors are widened into per-thread fp32 copies (a fused qkv row, q then k then v adjacent with
// one stride, widened once).
void AttentionForward16Bit(void* out, float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, bool causal,
                           const int32_t* key_mask, int64_t window, int nt,
                           const int32_t* doc_start);
void AttentionBackward16Bit(float* dq, float* dk, float* dv, const void* dout, const void* out,
                            const float* lse, const void* q, const void* k, const void* v,
                            DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                            int64_t q_stride, int64_t kv_stride, bool causal,
                            const int32_t* key_mask, int64_t window, int nt,
                            const int32_t* doc_start);
// Whether AttentionForward/Backward with this operand type use bf16 tile products (see
// cpu_attention.cc: the CPU's own bf16 dot products for an even head size where it has them, else
// oneDNN's bf16 matmuls for bidirectional T >= 256); else they compute in fp32.
bool UseBf16Tiles(DType operand_type, bool causal, int64_t T, int64_t HS);
// Whether this CPU has AVX512-BF16's dot-product instruction (vdpbf16ps), which attention's bf16
// tile products use. Decided once per process; tests can turn it off (then attention takes the
// oneDNN or fp32 path, as on a CPU without it).
bool Bf16DotProductsNative();
void SetBf16DotProductsForTesting(bool enabled);
// Tests that compare a device whose attention computes in fp32 whatever the operand type (the CUDA
// kernels, under simt or on a GPU) with this backend turn every bf16 tile path off.
void SetBf16AttentionTilesForTesting(bool enabled);
// The last min(T, window) cached rows with window > 0, all T without.
void AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                     int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                     int64_t q_stride, int64_t kv_stride, int64_t window, int nt);

// ---- softmax + cross-entropy (cpu_softmax_ce.cc) ----
void SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N, int64_t V,
                         int64_t Vp, float grad_scale, bool compute_grad, int nt);
// The same with the gradient written to grad16 (N, Vp) in the 16-bit grad16_type: the bits of the
// in-place gradient rounded by Cast; logits are only read.
void SoftmaxCrossEntropy16(const float* logits, void* grad16, DType grad16_type, float* losses,
                           const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                           float grad_scale, int nt);

}  // namespace traind::engine::cpu
