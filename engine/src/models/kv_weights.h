// KvWeights: where a KvDecoder (kv_decoder.h) reads a decoder model's weights, by offset in the
// family's parameter table: one flat fp32 buffer, or (a model whose fp32 master weights are off
// the device) the GEMM weights in the 16-bit compute copy and the rest in fp32.
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace traind::engine {

struct KvWeights {
  DType gemm_type = DType::kF32;               // the GEMM weights' type (fp32, bf16, f16)
  std::function<const void*(int64_t)> gemm;    // a GEMM weight (device), in gemm_type
  std::function<const float*(int64_t)> fp32;   // an embedding table, norm or bias (device)
  // Every tensor in one flat fp32 buffer (table layout).
  static KvWeights Flat(const float* params) {
    KvWeights w;
    w.gemm = [params](int64_t offset) -> const void* { return params + offset; };
    w.fp32 = [params](int64_t offset) { return params + offset; };
    return w;
  }
};

}  // namespace traind::engine
