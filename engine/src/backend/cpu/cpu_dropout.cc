// Inverted dropout (backend.h's Dropout) with the counter-based mask of dropout_rng.h: each
// element's mask is a pure function of (key, stream, index), so threading changes nothing.
#include <algorithm>

#include "backend/cpu/cpu_kernels.h"
#include "backend/dropout_rng.h"

namespace traind::engine::cpu {
namespace {

float LoadAsFloat(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace

void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p, uint64_t key,
             uint64_t stream, bool accumulate, int nt) {
  const uint64_t base = DropoutBase(key, stream);
  const float scale = 1.0f / (1.0f - p);
  const int threads = n >= (1 << 15) ? std::max(nt, 1) : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = DropoutKeep(base, static_cast<uint64_t>(i), p)
                        ? LoadAsFloat(inp, inp_type, i) * scale : 0.0f;
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace traind::engine::cpu
