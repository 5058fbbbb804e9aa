// Embedding forward/backward on the backend's gather/scatter ops (see embedding.h).
#include "nn/embedding.h"

namespace traind::engine::nn {

void EmbeddingForward(Backend& be, float* out, const int32_t* ids, const int32_t* pos,
                      const float* wte, const float* wpe, int64_t N, int64_t C) {
  be.EmbeddingForward(out, ids, wte, N, C, /*accumulate=*/false);
  if (wpe != nullptr) be.EmbeddingForward(out, pos, wpe, N, C, /*accumulate=*/true);
}

void EmbeddingBackward(Backend& be, float* dwte, float* dwpe, const float* dout, const int32_t* ids,
                       const int32_t* pos, int64_t N, int64_t C) {
  be.EmbeddingBackward(dwte, dout, ids, N, C);
  if (dwpe != nullptr) be.EmbeddingBackward(dwpe, dout, pos, N, C);
}

}  // namespace traind::engine::nn
