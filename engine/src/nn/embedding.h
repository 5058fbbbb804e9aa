// Token (+ learned position) embedding: out[n] = wte[ids[n]] (+ wpe[pos[n]]).
// Gradient contract: dwte and dwpe use += (rows of ids/positions scatter-add).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace traind::engine::nn {

// out (N,C). wpe / pos may be null (no learned positions: llama).
void EmbeddingForward(Backend& be, float* out, const int32_t* ids, const int32_t* pos,
                      const float* wte, const float* wpe, int64_t N, int64_t C);
void EmbeddingBackward(Backend& be, float* dwte, float* dwpe, const float* dout, const int32_t* ids,
                       const int32_t* pos, int64_t N, int64_t C);

}  // namespace traind::engine::nn
