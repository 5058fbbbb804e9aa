// Linear forward/backward as GEMMs on the backend (see linear.h for the contract).
#include "nn/linear.h"

#include <algorithm>
#include <cassert>

namespace traind::engine::nn {

void LinearForward(Backend& be, float* out, const void* inp, const void* weight, const float* bias,
                   int64_t N, int64_t C, int64_t OC, DType type) {
  // out(N,OC) = inp(N,C) * weight(OC,C)^T + bias (fused into the GEMM where the device can)
  be.LinearForward(out, nullptr, inp, weight, bias, N, C, OC, type);
}

void LinearBackward(Backend& be, float* dinp, float* dweight, float* dbias, const float* dout,
                    const void* inp, const void* weight, int64_t N, int64_t C, int64_t OC,
                    const GemmPrecision& gp) {
  if (gp.type == DType::kF32) {
    if (dbias != nullptr) be.BiasBackward(dbias, dout, N, OC);
    // dinp(N,C) = dout(N,OC) * weight(OC,C)
    if (dinp != nullptr) be.Gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    // dweight(OC,C) += dout(N,OC)^T * inp(N,C); a frozen weight (null dweight) has none
    if (dweight != nullptr) be.Gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    return;
  }
  // 16-bit: round dout into the scratch, a chunk of rows at a time (one chunk unless the scratch
  // is smaller than dout, as for the logits gradient).
  const int64_t rows = std::min(N, gp.scratch_elems / OC);
  assert(rows >= 1 && gp.scratch != nullptr);
  if (rows < 1 || gp.scratch == nullptr) return;
  const size_t esize = DTypeSize(gp.type);
  const auto* inp_bytes = static_cast<const char*>(inp);
  // One chunk: the bias gradient and the rounding in one pass (BiasBackwardRounded).
  const bool fused_bias = dbias != nullptr && rows == N;
  if (dbias != nullptr && !fused_bias) be.BiasBackward(dbias, dout, N, OC);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    if (fused_bias) {
      be.BiasBackwardRounded(dbias, dout, N, OC, gp.scratch, gp.type);
    } else {
      be.Cast(gp.scratch, gp.type, dout + r0 * OC, DType::kF32, n * OC);
    }
    LinearBackwardRounded(be, dinp != nullptr ? dinp + r0 * C : nullptr, dweight, gp.scratch,
                          inp_bytes + r0 * C * esize, weight, n, C, OC, gp);
  }
}

void LinearBackwardRounded(Backend& be, float* dinp, float* dweight, const void* dout16,
                           const void* inp, const void* weight, int64_t N, int64_t C, int64_t OC,
                           const GemmPrecision& gp) {
  const DType type = gp.type;
  if (dinp != nullptr) {
    be.Gemm(false, false, N, C, OC, 1.0f, dout16, OC, weight, C, 0.0f, dinp, C, type, DType::kF32);
  }
  if (dweight == nullptr) return;  // frozen weight
  // inp is B (K = N rows, C columns) of the weight gradient: packed for this one product where the
  // device packs (a registration keyed by inp's address, so it is dropped right after: the
  // activation buffer is rewritten by the next micro-batch).
  const bool packed =
      gp.pack != nullptr && be.PackGemmB(gp.pack, gp.pack_bytes, inp, false, N, C, C, type);
  be.Gemm(true, false, OC, C, N, 1.0f, dout16, OC, inp, C, 1.0f, dweight, C, type, DType::kF32);
  if (packed) be.ForgetPackedGemmB(inp, static_cast<const char*>(inp) + 1);
}

}  // namespace traind::engine::nn
