// Fused softmax + cross-entropy over the logits on the CPU, one row per task. Max-subtracted
// softmax; the row sum accumulates in double. With compute_grad the logits row is overwritten by
// (softmax - onehot) * grad_scale (0 in the padded columns [V, Vp) and in ignored rows).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"

namespace traind::engine::cpu {
namespace {

TRAIND_CPU_CLONES float RowMax(const float* x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

TRAIND_CPU_CLONES double RowSumExp(const float* x, int64_t n, float mx) {
  // float lanes per 4K-element block, double across blocks: accurate and still vectorised.
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 4096) {
    const int64_t e = std::min(n, b + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += ExpFlushF(x[i] - mx);
    total += s;
  }
  return total;
}

// Like RowSumExp, but also stores exp(x - mx) in place (one exp per element for the gradient).
TRAIND_CPU_CLONES double RowExpInPlace(float* x, int64_t n, float mx) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 4096) {
    const int64_t e = std::min(n, b + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      const float y = ExpFlushF(x[i] - mx);
      x[i] = y;
      s += y;
    }
    total += s;
  }
  return total;
}

TRAIND_CPU_CLONES void RowScale(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

void SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N, int64_t V,
                         int64_t Vp, float grad_scale, bool compute_grad, int nt) {
  const int threads = N * V < 16384 ? 1 : nt;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * Vp;
    const int32_t target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
      if (compute_grad) std::memset(row, 0, static_cast<size_t>(Vp) * sizeof(float));
      continue;
    }
    const float mx = RowMax(row, V);
    const float target_logit = row[target];
    const double sum = compute_grad ? RowExpInPlace(row, V, mx) : RowSumExp(row, V, mx);
    losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(target_logit) - mx));
    if (compute_grad) {
      // row holds exp(x_i - mx); softmax_i = that / sum.
      RowScale(row, V, static_cast<float>(static_cast<double>(grad_scale) / sum));
      row[target] -= grad_scale;
      if (Vp > V) std::memset(row + V, 0, static_cast<size_t>(Vp - V) * sizeof(float));
    }
  }
}

}  // namespace traind::engine::cpu
