// Inverted dropout (backend.h's Dropout) with the counter-based mask of dropout_rng.h: each
// element's mask is a pure function of (key, stream, index), so threading changes nothing.
// The mask loop is branch-free (a select per element) and compiled per ISA so the 64-bit hash
// vectorises where the ISA has 64-bit multiplies (AVX-512).
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "backend/dropout_rng.h"

namespace traind::engine::cpu {
namespace {

// Elements per chunk: the input is widened into a stack buffer chunk by chunk.
constexpr int64_t kChunk = 1024;

// The mask times the scale for elements [i0, i0 + n): m[j] = keep ? scale : 0.
TRAIND_CPU_CLONES void MaskSpan(float* m, uint64_t base, int64_t i0, int64_t n, float p,
                                float scale) {
  for (int64_t j = 0; j < n; ++j) {
    m[j] = DropoutKeep(base, static_cast<uint64_t>(i0 + j), p) ? scale : 0.0f;
  }
}

// Not cloned: an ISA with FMA would contract out + x * m into one rounding, which the CUDA kernel
// (and simt) does not.
void ApplySpan(float* out, const float* x, const float* m, int64_t n,
                                 bool accumulate) {
  if (accumulate) {
    for (int64_t j = 0; j < n; ++j) out[j] += x[j] * m[j];
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = x[j] * m[j];
  }
}

void Widen(float* dst, const void* src, DType t, int64_t i0, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src) + i0;
  if (t == DType::kBF16) {
    for (int64_t j = 0; j < n; ++j) dst[j] = BF16ToF32(s[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = F16ToF32(s[j]);
  }
}

}  // namespace

void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p, uint64_t key,
             uint64_t stream, bool accumulate, int nt) {
  const uint64_t base = DropoutBase(key, stream);
  const float scale = 1.0f / (1.0f - p);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int threads = n >= (1 << 15) ? static_cast<int>(std::min<int64_t>(std::max(nt, 1), chunks)) : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk;
    const int64_t len = std::min(kChunk, n - i0);
    float m[kChunk];
    float xw[kChunk];
    MaskSpan(m, base, i0, len, p, scale);
    const float* x = static_cast<const float*>(inp) + i0;
    if (inp_type != DType::kF32) {
      Widen(xw, inp, inp_type, i0, len);
      x = xw;
    }
    ApplySpan(out + i0, x, m, len, accumulate);
  }
}

}  // namespace traind::engine::cpu
