// Fused softmax + cross-entropy over the logits on the CPU, one row per task. Max-subtracted
// softmax; the row sum accumulates in double. With compute_grad the logits row is overwritten by
// (softmax - onehot) * grad_scale (0 in the padded columns [V, Vp) and in ignored rows).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"

namespace traind::engine::cpu {
namespace {

// MaxF compiled per ISA (the inline helper vectorises only inside a TRAIND_CPU_CLONES caller).
TRAIND_CPU_CLONES float RowMax(const float* x, int64_t n) { return MaxF(x, n); }

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

// Like RowSumExp, but also stores exp(x - mx) in y (one exp per element for the gradient); y may
// be x (in place).
TRAIND_CPU_CLONES double RowExpInto(float* y, const float* x, int64_t n, float mx) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 4096) {
    const int64_t e = std::min(n, b + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      const float v = ExpFlushF(x[i] - mx);
      y[i] = v;
      s += v;
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
    const double sum = compute_grad ? RowExpInto(row, row, V, mx) : RowSumExp(row, V, mx);
    losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(target_logit) - mx));
    if (compute_grad) {
      // row holds exp(x_i - mx); softmax_i = that / sum.
      RowScale(row, V, static_cast<float>(static_cast<double>(grad_scale) / sum));
      row[target] -= grad_scale;
      if (Vp > V) std::memset(row + V, 0, static_cast<size_t>(Vp - V) * sizeof(float));
    }
  }
}

// The 16-bit gradient: the row's exponentials go to a per-thread fp32 row (197 KiB for GPT-2's
// vocabulary: it stays in the core's cache), are scaled there and rounded into grad16, so the
// logits are read once from memory and never written, and no separate Cast pass reads an fp32
// gradient again. The same operations in the same order as the in-place path, then Cast's
// rounding: the same bits.
void SoftmaxCrossEntropy16(const float* logits, void* grad16, DType grad16_type, float* losses,
                           const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                           float grad_scale, int nt) {
  const int threads = N * V < 16384 ? 1 : nt;
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<float> exps;  // kept across calls: no page faults per call
    if (static_cast<int64_t>(exps.size()) < V) exps.resize(static_cast<size_t>(V));
    float* y = exps.data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = logits + n * Vp;
      uint16_t* out = static_cast<uint16_t*>(grad16) + n * Vp;
      const int32_t target = targets[n];
      if (target < 0) {
        losses[n] = 0.0f;
        std::memset(out, 0, static_cast<size_t>(Vp) * sizeof(uint16_t));
        continue;
      }
      const float mx = RowMax(row, V);
      const double sum = RowExpInto(y, row, V, mx);
      losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(row[target]) - mx));
      RowScale(y, V, static_cast<float>(static_cast<double>(grad_scale) / sum));
      y[target] -= grad_scale;
      F32To16Span(out, y, V, grad16_type);
      if (Vp > V) std::memset(out + V, 0, static_cast<size_t>(Vp - V) * sizeof(uint16_t));
    }
  }
}

}  // namespace traind::engine::cpu
