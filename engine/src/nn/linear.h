// Linear layer: out (N,OC) = inp (N,C) @ weight^T + bias, weight (OC,C) like torch.nn.Linear.
// Gradient contract: dweight and dbias use += (micro-batch accumulation); dinp uses = and is
// skipped when null. bias / dbias may be null (no bias, e.g. llama).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

// FLOPs: 2*N*C*OC.
void LinearForward(Backend& be, float* out, const float* inp, const float* weight,
                   const float* bias, int64_t N, int64_t C, int64_t OC);
// FLOPs: 4*N*C*OC (2 GEMMs; one when dinp is null).
void LinearBackward(Backend& be, float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);

}  // namespace traind::engine::nn
