// Linear layer: out (N,OC) = inp (N,C) @ weight^T + bias, weight (OC,C) like torch.nn.Linear.
// Gradient contract: dweight and dbias use += (micro-batch accumulation); dinp uses = and is
// skipped when null. bias / dbias may be null (no bias, e.g. llama). dweight null: a frozen
// weight (LoRA's base), no weight-gradient GEMM.
// Precision: inp and weight are stored in GemmPrecision::type (fp32, bf16 or f16), the GEMMs
// accumulate in fp32, and out, dinp, dweight, bias and dbias are always fp32. With a 16-bit type
// the incoming gradient dout is rounded to that type (in GemmPrecision::scratch) before its GEMMs,
// as autocast does; dbias is summed from the fp32 dout.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

struct GemmPrecision {
  DType type = DType::kF32;
  // 16-bit types only: room for `scratch_elems` elements of `type` (at least OC of them: dout
  // goes through in row chunks of scratch_elems / OC rows when N*OC does not fit). Overwritten.
  void* scratch = nullptr;
  int64_t scratch_elems = 0;
  // Optional room (`pack_bytes`) for the layer input packed in the layout the device's GEMM reads
  // B in (Backend::PackGemmB), for the weight gradient's product dout^T x inp: where the device
  // packs and the room is large enough, inp is packed there just before it and forgotten after
  // (oneDNN's bf16 weight gradients 10-30% faster: bench/README.md). Overwritten; null: none.
  void* pack = nullptr;
  int64_t pack_bytes = 0;
};

// FLOPs: 2*N*C*OC. inp and weight in `type`.
void LinearForward(Backend& be, float* out, const void* inp, const void* weight, const float* bias,
                   int64_t N, int64_t C, int64_t OC, DType type = DType::kF32);
// FLOPs: 4*N*C*OC (2 GEMMs; one when dinp is null). inp and weight in gp.type.
void LinearBackward(Backend& be, float* dinp, float* dweight, float* dbias, const float* dout,
                    const void* inp, const void* weight, int64_t N, int64_t C, int64_t OC,
                    const GemmPrecision& gp = {});
// The 16-bit GEMMs of LinearBackward for a dout already rounded to `type` (N,OC): no bias, dinp
// and dweight as above. The lm head's gradient comes this way from the fused softmax +
// cross-entropy (Backend::SoftmaxCrossEntropy's grad16). gp: the type, and the pack room (its
// scratch is not used: dout16 may be in it).
void LinearBackwardRounded(Backend& be, float* dinp, float* dweight, const void* dout16,
                           const void* inp, const void* weight, int64_t N, int64_t C, int64_t OC,
                           const GemmPrecision& gp);

}  // namespace traind::engine::nn
