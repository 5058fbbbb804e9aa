// CPU kernels of the SGD, Adafactor and blockwise 8-bit AdamW updates (cpu_optim.h). Element loops
// are OpenMP-threaded over contiguous chunks and compiled per ISA (TRAIND_CPU_CLONES); reductions
// keep per-thread partials combined in thread order, so results depend on nt only.
#include "backend/cpu/cpu_optim.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/optim_math.h"
#include "traind/engine/mutex.h"

namespace traind::engine::cpu {
namespace {

constexpr int64_t kMinParallel = 1 << 14;

int ThreadsFor(int64_t work, int nt) { return work < kMinParallel ? 1 : nt; }

void Chunk(int64_t n, int nt, int t, int64_t* b, int64_t* e) {
  int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
  *b = std::min(n, per * t);
  *e = std::min(n, *b + per);
}

TRAIND_CPU_CLONES void SgdSpan(float* p, const float* grad, float* buf, int64_t n, float neg_lr,
                               float momentum, float one_minus_damp, float wd, bool nesterov,
                               bool first, float gs) {
  if (momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] * gs + wd * p[i];
      p[i] = p[i] + neg_lr * g;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * gs + wd * p[i];
    const float b = first ? g : buf[i] * momentum + one_minus_damp * g;
    buf[i] = b;
    g = nesterov ? g + momentum * b : b;
    p[i] = p[i] + neg_lr * g;
  }
}

// Row r of a factored tensor: the row statistic's mean over C and the column sums of (g^2+eps1).
TRAIND_CPU_CLONES double RowSquares(const float* g, double* col_acc, int64_t C, float eps1,
                                    float gs) {
  double s = 0.0;
  for (int64_t c = 0; c < C; ++c) {
    const float x = g[c] * gs;
    const float u = x * x + eps1;
    s += u;
    col_acc[c] += u;
  }
  return s;
}

TRAIND_CPU_CLONES void SecondMomentSpan(const float* g, float* v, int64_t n, float b2t,
                                        float one_minus_b2t, float eps1, float gs) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i] * gs;
    v[i] = v[i] * b2t + one_minus_b2t * (x * x + eps1);
  }
}

// inv_col[c] = 1 / sqrt(col[c]), computed once per tensor (the same float values as inline).
TRAIND_CPU_CLONES double FactoredSquaresRow(const float* g, const float* inv_col, float rf,
                                            int64_t C, float gs) {
  double s = 0.0;
  for (int64_t c = 0; c < C; ++c) {
    const float u = (rf * inv_col[c]) * (g[c] * gs);
    s += static_cast<double>(u) * u;
  }
  return s;
}

TRAIND_CPU_CLONES void InverseSqrt(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 1.0f / std::sqrt(x[i]);
}

// A per-thread host scratch of n floats that only grows (no allocation once warm).
float* Scratch(int64_t n) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

TRAIND_CPU_CLONES double UnfactoredSquaresSpan(const float* g, const float* v, int64_t n,
                                               float gs) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = (1.0f / std::sqrt(v[i])) * (g[i] * gs);
    s += static_cast<double>(u) * u;
  }
  return s;
}

// p and m updated from the raw update u[i] = (rf * inv[i]) * g[i] over a span: rf = 1 and
// inv = 1 / sqrt(v) (unfactored, computed here when `inv_given` is false), or rf the row factor
// and inv the precomputed inverse column factors (factored).
template <bool inv_given>
TRAIND_CPU_CLONES void ApplySpan(float* p, float* m, const float* g, const float* den, float rf,
                                 int64_t n, float gs, float step, float div, float beta1,
                                 float one_minus_beta1, float neg_decay) {
  for (int64_t i = 0; i < n; ++i) {
    const float inv = inv_given ? den[i] : 1.0f / std::sqrt(den[i]);
    float u = (rf * inv) * (g[i] * gs);
    u = u / div;
    u = u * step;
    if (m != nullptr) {
      u = m[i] * beta1 + one_minus_beta1 * u;
      m[i] = u;
    }
    float pi = p[i];
    pi = pi + neg_decay * pi;
    p[i] = pi - u;
  }
}

// QuantizeToCode without its 7-step data-dependent binary search (branch mispredictions made the
// 8-bit step ~30x slower than the fp32 one). The search ends at the even leaf p whose neighbours
// bracket x (code[p-1] < x <= code[p+1]), so p = 2 * #{odd j : code[j] < x}; that count comes
// from a table over the top 16 bits of x's float (sign, exponent, 7 mantissa bits) plus one
// comparison, since no cell of that table holds two odd codes for bitsandbytes' maps (checked
// when the table is built; cells that do, and non-finite x, take the search). The last step
// (midpoint rule and sign rule) is QuantizeToCode's, so the codes are identical
// (tests/engine/optim_adamw8bit_test.cc compares them on every midpoint and random values).
class FastQuantizer {
 public:
  FastQuantizer(const float* code, bool is_signed)
      : is_signed_(is_signed), lowest_(is_signed ? -1.0f : 0.0f) {
    std::copy(code, code + 256, code_);
    for (uint32_t h = 0; h < 65536; ++h) {
      const bool neg = (h & 0x8000u) != 0;
      const float lo = std::bit_cast<float>(neg ? (h << 16) | 0xFFFFu : h << 16);  // cell minimum
      const float hi = std::bit_cast<float>(neg ? h << 16 : (h << 16) | 0xFFFFu);  // maximum
      int below = 0, inside = 0;
      for (int j = 1; j < 256; j += 2) {
        below += code_[j] < lo;
        inside += code_[j] >= lo && code_[j] < hi;
      }
      cell_[h] = static_cast<uint16_t>(below | (inside > 1 || !std::isfinite(lo) ? kSlow : 0));
    }
  }
  bool Matches(const float* code, bool is_signed) const {
    return is_signed == is_signed_ && std::equal(code, code + 256, code_);
  }
  uint8_t operator()(float x) const {
    const uint16_t cell = cell_[std::bit_cast<uint32_t>(x) >> 16];
    if ((cell & kSlow) != 0 || !std::isfinite(x)) return QuantizeToCode(code_, x, is_signed_);
    // Selects instead of branches (the comparisons are data-dependent and would mispredict).
    const int t = cell;
    int p = 2 * (t + (t < 128 && code_[t < 128 ? 2 * t + 1 : 255] < x));
    p = p > 254 ? 254 : p;
    const float val = code_[p];
    const float upper = code_[p + 1];
    const float lower = p == 0 ? lowest_ : code_[p == 0 ? 0 : p - 1];
    const int down = p == 0 ? 0 : p - 1;
    const int above = x > (upper + val) * 0.5f ? p + 1 : p;
    const int below = x < (lower + val) * 0.5f ? down : p;
    int c = x > val ? above : below;
    const int step = x > 0.0f ? 1 : -1;
    c += (is_signed_ && std::signbit(code_[c]) != std::signbit(x)) ? step : 0;
    return static_cast<uint8_t>(c);
  }

 private:
  static constexpr uint16_t kSlow = 0x8000;
  bool is_signed_;
  float lowest_;  // QuantizeToCode's lower bound below code 0
  float code_[256];
  uint16_t cell_[65536];
};

// The quantizer of a code table, built once per distinct table (the optimizer passes the same two
// tables every step).
const FastQuantizer& QuantizerFor(const float* code, bool is_signed) {
  static Mutex mu;
  static std::vector<std::unique_ptr<FastQuantizer>> cache;  // under mu
  MutexLock lock(&mu);
  for (const auto& q : cache) {
    if (q->Matches(code, is_signed)) return *q;
  }
  cache.push_back(std::make_unique<FastQuantizer>(code, is_signed));
  return *cache.back();
}

TRAIND_CPU_CLONES void AdamW8bitBlock(float* p, const float* grad, uint8_t* mc, uint8_t* vc,
                                      float* m_absmax, float* v_absmax, const float* code_m,
                                      const float* code_v, const FastQuantizer& qm,
                                      const FastQuantizer& qv, int64_t n, float lr, float b1,
                                      float b2, float eps, float wd, float c1, float c2, float gs) {
  float m[kQuant8Block], v[kQuant8Block];
  const float am = *m_absmax, av = *v_absmax;
  float max_m = 0.0f, max_v = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float g0 = grad[j];
    const bool ok = std::isfinite(g0);
    const float g = ok ? g0 * gs : 0.0f;
    const float vj = code_v[vc[j]] * av * b2 + (1.0f - b2) * g * g;
    const float mj = code_m[mc[j]] * am * b1 + (1.0f - b1) * g;
    v[j] = ok ? vj : 0.0f;
    m[j] = ok ? mj : 0.0f;
    max_m = std::max(max_m, std::fabs(m[j]));
    max_v = std::max(max_v, std::fabs(v[j]));
  }
  const float step_size = -lr * c2 / c1;
  const float decay = 1.0f - lr * wd;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(grad[j])) continue;
    float pj = p[j] + step_size * (m[j] / (std::sqrt(v[j]) + c2 * eps));
    if (wd > 0.0f) pj = pj * decay;
    p[j] = pj;
  }
  *m_absmax = max_m;
  *v_absmax = max_v;
  for (int64_t j = 0; j < n; ++j) {
    mc[j] = qm(max_m > 0.0f ? m[j] / max_m : m[j]);
    vc[j] = qv(max_v > 0.0f ? v[j] / max_v : 0.0f);
  }
}

}  // namespace

void SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
               float dampening, float weight_decay, bool nesterov, bool first_step,
               float grad_scale, const StepScalars* s, int nt) {
  if (s != nullptr) {
    if (s->skip_nonfinite != 0 && !std::isfinite(s->grad_sq)) return;
    lr = s->lr;
    grad_scale *= StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm);
  }
  const float neg_lr = static_cast<float>(-static_cast<double>(lr));
  const float one_minus_damp = static_cast<float>(1.0 - static_cast<double>(dampening));
#pragma omp parallel num_threads(ThreadsFor(n * 3, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) {
      SgdSpan(param + lo, grad + lo, buf == nullptr ? nullptr : buf + lo, hi - lo, neg_lr, momentum,
              one_minus_damp, weight_decay, nesterov, first_step, grad_scale);
    }
  }
}

void AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                            int64_t R, int64_t C, float beta2t, float eps1, float grad_scale,
                            int nt) {
  const float one_minus = static_cast<float>(1.0 - static_cast<double>(beta2t));
  const int threads =
      static_cast<int>(std::min<int64_t>(ThreadsFor(R * C, nt), std::max<int64_t>(R, 1)));
  std::vector<double> col_acc(static_cast<size_t>(threads) * C);
  for (int64_t b = 0; b < B; ++b) {
    const float* g = grad + b * R * C;
    std::fill(col_acc.begin(), col_acc.end(), 0.0);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      double* acc = col_acc.data() + static_cast<int64_t>(t) * C;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const double mean =
            RowSquares(g + r * C, acc, C, eps1, grad_scale) / static_cast<double>(C);
        float& x = row[b * R + r];
        x = x * beta2t + one_minus * static_cast<float>(mean);
      }
    }
    double rs = 0.0;
    for (int64_t r = 0; r < R; ++r) rs += row[b * R + r];
    row_sum[b] = rs;
    for (int64_t c = 0; c < C; ++c) {
      double s = 0.0;
      for (int t = 0; t < threads; ++t) s += col_acc[static_cast<size_t>(t) * C + c];
      float& x = col[b * C + c];
      x = x * beta2t + one_minus * static_cast<float>(s / static_cast<double>(R));
    }
  }
}

void AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                           float grad_scale, int nt) {
  const float one_minus = static_cast<float>(1.0 - static_cast<double>(beta2t));
#pragma omp parallel num_threads(ThreadsFor(n * 2, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) SecondMomentSpan(grad + lo, v + lo, hi - lo, beta2t, one_minus, eps1, grad_scale);
  }
}

void AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                               const double* row_sum, const float* v, int64_t B, int64_t R,
                               int64_t C, float grad_scale, int nt) {
  if (v != nullptr) {
    const int64_t n = B * R * C;
    const int threads = ThreadsFor(n, nt);
    std::vector<double> part(static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
    {
      int64_t lo, hi;
      Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
      if (hi > lo)
        part[omp_get_thread_num()] = UnfactoredSquaresSpan(grad + lo, v + lo, hi - lo, grad_scale);
    }
    double s = 0.0;
    for (double x : part) s += x;
    *acc += s;
    return;
  }
  const int threads = ThreadsFor(B * R * C, nt);
  std::vector<double> part(static_cast<size_t>(threads), 0.0);
  float* inv_col = Scratch(C);
  for (int64_t b = 0; b < B; ++b) {
    const float mean = static_cast<float>(row_sum[b] / static_cast<double>(R));
    InverseSqrt(col + b * C, inv_col, C);
#pragma omp parallel num_threads(threads)
    {
      double s = 0.0;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        const float rf = 1.0f / std::sqrt(row[b * R + r] / mean);
        s += FactoredSquaresRow(grad + (b * R + r) * C, inv_col, rf, C, grad_scale);
      }
      part[omp_get_thread_num()] += s;
    }
  }
  double s = 0.0;
  for (double x : part) s += x;
  *acc += s;
}

void AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                    const double* row_sum, const float* v, const double* sums, int64_t B, int64_t R,
                    int64_t C, float grad_scale, float rel_step, float eps2, bool scale_parameter,
                    float clip_threshold, float beta1, float weight_decay, int nt) {
  const int64_t numel = B * R * C;
  const float step_size = AdafactorStepSize(sums[0], numel, rel_step, eps2, scale_parameter);
  const float divisor = AdafactorUpdateDivisor(sums[1], numel, clip_threshold);
  const float one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const float neg_decay =
      static_cast<float>(-static_cast<double>(weight_decay) * static_cast<double>(step_size));
  if (v != nullptr) {
    const int64_t n = B * R * C;
#pragma omp parallel num_threads(ThreadsFor(n * 3, nt))
    {
      int64_t lo, hi;
      Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
      if (hi > lo) {
        ApplySpan<false>(param + lo, m == nullptr ? nullptr : m + lo, grad + lo, v + lo, 1.0f,
                         hi - lo, grad_scale, step_size, divisor, beta1, one_minus_beta1,
                         neg_decay);
      }
    }
    return;
  }
  float* inv_col = Scratch(C);
  for (int64_t b = 0; b < B; ++b) {
    const float mean = static_cast<float>(row_sum[b] / static_cast<double>(R));
    InverseSqrt(col + b * C, inv_col, C);
#pragma omp parallel for num_threads(ThreadsFor(R* C * 3, nt)) schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t off = (b * R + r) * C;
      const float rf = 1.0f / std::sqrt(row[b * R + r] / mean);
      ApplySpan<true>(param + off, m == nullptr ? nullptr : m + off, grad + off, inv_col, rf, C,
                      grad_scale, step_size, divisor, beta1, one_minus_beta1, neg_decay);
    }
  }
}

void AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes,
                        float* m_absmax, float* v_absmax, const float* code_m, const float* code_v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float bias_correction1, float bias_correction2,
                        float grad_scale, const StepScalars* s, int nt) {
  if (s != nullptr) {
    if (s->skip_nonfinite != 0 && !std::isfinite(s->grad_sq)) return;
    lr = s->lr;
    bias_correction1 = s->bias_correction1;
    bias_correction2 = s->bias_correction2;
    grad_scale *= StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm);
  }
  const int64_t blocks = (n + kQuant8Block - 1) / kQuant8Block;
  const float c2 = std::sqrt(bias_correction2);
  const FastQuantizer& qm = QuantizerFor(code_m, true);
  const FastQuantizer& qv = QuantizerFor(code_v, false);
#pragma omp parallel for num_threads(ThreadsFor(n * 2, nt)) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o = b * kQuant8Block;
    AdamW8bitBlock(param + o, grad + o, m_codes + o, v_codes + o, m_absmax + b, v_absmax + b,
                   code_m, code_v, qm, qv, std::min(kQuant8Block, n - o), lr, beta1, beta2, eps,
                   weight_decay, bias_correction1, c2, grad_scale);
  }
}

void QuantizeCodes(const float* code, bool is_signed, const float* x, int64_t n, uint8_t* out) {
  const FastQuantizer& q = QuantizerFor(code, is_signed);
  for (int64_t i = 0; i < n; ++i) out[i] = q(x[i]);
}

}  // namespace traind::engine::cpu
