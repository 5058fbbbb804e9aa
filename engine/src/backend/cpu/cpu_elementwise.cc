// Elementwise and small ops of the CPU backend: embedding, bias, add/scale, sum of squares, GELU,
// SwiGLU, AdamW, the non-finite check. Row loops are OpenMP-threaded; the per-row bodies are
// compiled per ISA (TRAIND_CPU_CLONES) so they vectorise. Reductions use per-thread partials
// combined in a fixed order, so results do not depend on scheduling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_optim.h"

namespace traind::engine::cpu {
namespace {

constexpr int64_t kMinParallel = 1
                                 << 14;  // elements below which threading costs more than it saves

// Splits [0, n) into nt contiguous chunks of a multiple of 16 elements; chunk t is [*b, *e).
void Chunk(int64_t n, int nt, int t, int64_t* b, int64_t* e) {
  int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
  *b = std::min(n, per * t);
  *e = std::min(n, *b + per);
}

int ThreadsFor(int64_t work, int nt) { return work < kMinParallel ? 1 : nt; }

TRAIND_CPU_CLONES void AddRow(float* out, const float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += a[i];
}
TRAIND_CPU_CLONES void ScaleSpan(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
TRAIND_CPU_CLONES double SumSquaresSpan(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// 1 when some element has an all-ones exponent (NaN or infinity); integer ops only.
TRAIND_CPU_CLONES int NonFiniteSpan(const float* x, int64_t n) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
  uint32_t any = 0;
#pragma omp simd reduction(| : any)
  for (int64_t i = 0; i < n; ++i) any |= ((u[i] & 0x7f800000u) == 0x7f800000u) ? 1u : 0u;
  return static_cast<int>(any);
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// gelu_new(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
// The sigmoid form avoids the cancellation of 1 + tanh(u) for negative x.
TRAIND_CPU_CLONES void GeluSpan(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluC * (x + kGeluA * x * x * x);
    out[i] = x / (1.0f + ExpF(-2.0f * u));
  }
}
// d/dx [x * s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
TRAIND_CPU_CLONES void GeluBackSpan(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluC * (x + kGeluA * x * x * x);
    float s = 1.0f / (1.0f + ExpF(-2.0f * u));
    float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    dinp[i] = dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
  }
}

// Exact GELU (erf form, HF "gelu"): x Phi(x) with Phi from cpu_math.h's NormalCdfF (vectorised;
// libm's erf per element took ~6 ns, 11% of a bert-base step). tanh (the pooler only): std::tanh.
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)

TRAIND_CPU_CLONES void GeluErfSpan(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = x * NormalCdfF(x);
  }
}

TRAIND_CPU_CLONES void GeluErfBackSpan(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float pdf = kInvSqrt2Pi * ExpFlushF(-0.5f * x * x);
    dinp[i] = dout[i] * (NormalCdfF(x) + x * pdf);
  }
}

void TanhSpan(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(inp[i]);
}

TRAIND_CPU_CLONES void TanhBackSpan(float* dinp, const float* out, const float* dout, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
}

TRAIND_CPU_CLONES void SwiGluRow(float* out, const float* gate, const float* up, int64_t H) {
  for (int64_t i = 0; i < H; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + ExpF(-g)) * up[i];
  }
}
// dgate = dout * up * s (1 + g (1 - s)), dup = dout * g s. Reads gate/up before writing, so dinp
// may alias inp.
TRAIND_CPU_CLONES void SwiGluBackRow(float* dgate, float* dup, const float* gate, const float* up,
                                     const float* dout, int64_t H) {
  for (int64_t i = 0; i < H; ++i) {
    float g = gate[i], u = up[i], d = dout[i];
    float s = 1.0f / (1.0f + ExpF(-g));
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
  }
}

// GeGLU: out = gelu_tanh(gate) * up (GeluSpan's GELU).
TRAIND_CPU_CLONES void GeGluRow(float* out, const float* gate, const float* up, int64_t H) {
  for (int64_t i = 0; i < H; ++i) {
    float x = gate[i];
    float u = kGeluC * (x + kGeluA * x * x * x);
    out[i] = x / (1.0f + ExpF(-2.0f * u)) * up[i];
  }
}
// dgate = dout * up * gelu'(gate) (GeluBackSpan's), dup = dout * gelu(gate). Reads gate/up
// before writing, so dinp may alias inp.
TRAIND_CPU_CLONES void GeGluBackRow(float* dgate, float* dup, const float* gate, const float* up,
                                    const float* dout, int64_t H) {
  for (int64_t i = 0; i < H; ++i) {
    float x = gate[i], v = up[i], d = dout[i];
    float u = kGeluC * (x + kGeluA * x * x * x);
    float s = 1.0f / (1.0f + ExpF(-2.0f * u));
    float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    dgate[i] = d * v * (s + 2.0f * x * s * (1.0f - s) * du);
    dup[i] = d * x * s;
  }
}

// torch.optim.AdamW (single-tensor path), step by step in fp32 as torch does it.
TRAIND_CPU_CLONES void AdamWSpan(float* p, const float* grad, float* m, float* v, int64_t n,
                                 float decay_mul, float b1, float one_minus_b1, float b2,
                                 float one_minus_b2, float sqrt_bc2, float eps, float neg_step,
                                 float gs) {
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * gs;
    float pi = p[i] * decay_mul;
    float mi = m[i] * b1 + one_minus_b1 * g;
    float vi = v[i] * b2 + one_minus_b2 * g * g;
    float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    p[i] = pi + neg_step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

TRAIND_CPU_CLONES void AddSpan(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                      bool accumulate, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = table + static_cast<int64_t>(ids[n]) * C;
    if (accumulate)
      AddRow(out + n * C, row, C);
    else
      std::memcpy(out + n * C, row, static_cast<size_t>(C) * sizeof(float));
  }
}

// Each thread owns a column slice of dtable, so repeated ids never race and the sum order is fixed.
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                       int nt) {
  int threads = ThreadsFor(N * C, nt);
#pragma omp parallel num_threads(threads)
  {
    int64_t b, e;
    Chunk(C, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    if (e > b) {
      for (int64_t n = 0; n < N; ++n) {
        AddRow(dtable + static_cast<int64_t>(ids[n]) * C + b, dout + n * C + b, e - b);
      }
    }
  }
}

void AddBias(float* out, const float* bias, int64_t N, int64_t OC, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* OC, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) AddRow(out + n * OC, bias, OC);
}

void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, int nt) {
#pragma omp parallel num_threads(ThreadsFor(N* OC, nt))
  {
    int64_t b, e;
    Chunk(OC, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    for (int64_t n = 0; n < N && e > b; ++n) AddRow(dbias + b, dout + n * OC + b, e - b);
  }
}

void BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                         DType type, int nt) {
  auto* d16 = static_cast<uint16_t*>(dout16);
#pragma omp parallel num_threads(ThreadsFor(N* OC, nt))
  {
    int64_t b, e;
    Chunk(OC, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    for (int64_t n = 0; n < N && e > b; ++n) {
      const float* row = dout + n * OC + b;
      AddRow(dbias + b, row, e - b);
      F32To16Span(d16 + n * OC + b, row, e - b, type);
    }
  }
}

void GeluBackwardBias(float* dinp, const float* inp, const float* dout, float* dbias, int64_t N,
                      int64_t OC, void* dinp16, DType type, int nt) {
  auto* d16 = static_cast<uint16_t*>(dinp16);
#pragma omp parallel num_threads(ThreadsFor(N* OC, nt))
  {
    int64_t b, e;
    Chunk(OC, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    // 16-bit: each row chunk's fp32 gradient in a per-thread row, dinp not written (4 bytes an
    // element less to store: ops_bench gelubwd bf16 1.30-1.36 -> 1.14-1.21 ms, bench/README.md).
    static thread_local std::vector<float> row;
    if (d16 != nullptr) row.resize(static_cast<size_t>(std::max<int64_t>(e - b, 0)));
    for (int64_t n = 0; n < N && e > b; ++n) {
      const int64_t o = n * OC + b;
      float* g = d16 != nullptr ? row.data() : dinp + o;
      GeluBackSpan(g, inp + o, dout + o, e - b);
      if (dbias != nullptr) AddRow(dbias + b, g, e - b);
      if (d16 != nullptr) F32To16Span(d16 + o, g, e - b, type);
    }
  }
}

void BiasGelu(float* pre, const float* bias, int64_t N, int64_t OC, void* act, DType act_type,
              int nt) {
#pragma omp parallel num_threads(ThreadsFor(N* OC * 8, nt))
  {
    static thread_local std::vector<float> tmp;  // one row of GELU before rounding (16-bit act)
    if (act_type != DType::kF32) tmp.resize(static_cast<size_t>(OC));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* row = pre + n * OC;
      if (bias != nullptr) AddRow(row, bias, OC);
      if (act_type == DType::kF32) {
        GeluSpan(static_cast<float*>(act) + n * OC, row, OC);
        continue;
      }
      GeluSpan(tmp.data(), row, OC);
      F32To16Span(static_cast<uint16_t*>(act) + n * OC, tmp.data(), OC, act_type);
    }
  }
}

void ScaleRows(float* x, const float* w, int64_t N, int64_t C, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float s = w[n];
    float* row = x + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] *= s;
  }
}

void RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += double{a[n * C + c]} * b[n * C + c];
    out[n] = static_cast<float>(s);
  }
}

void Add(float* out, const float* a, const float* b, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) AddSpan(out + lo, a + lo, b + lo, hi - lo);
  }
}

void Scale(float* x, float s, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) ScaleSpan(x + lo, s, hi - lo);
  }
}

double SumSquares(const float* x, int64_t n, int nt) {
  // Fixed 64K-element blocks summed in block order: the result is independent of nt.
  constexpr int64_t kBlock = 1 << 16;
  int64_t nblocks = (n + kBlock - 1) / kBlock;
  if (nblocks <= 0) return 0.0;
  std::vector<double> partial(static_cast<size_t>(nblocks));
#pragma omp parallel for num_threads(nblocks > 1 ? nt : 1) schedule(static)
  for (int64_t i = 0; i < nblocks; ++i) {
    int64_t lo = i * kBlock;
    partial[static_cast<size_t>(i)] = SumSquaresSpan(x + lo, std::min(kBlock, n - lo));
  }
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

bool HasNonFinite(const float* x, int64_t n, int nt) {
  int any = 0;
#pragma omp parallel num_threads(ThreadsFor(n, nt)) reduction(| : any)
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) any |= NonFiniteSpan(x + lo, hi - lo);
  }
  return any != 0;
}

void GeluForward(float* out, const float* inp, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n * 8, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) GeluSpan(out + lo, inp + lo, hi - lo);
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n * 8, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) GeluBackSpan(dinp + lo, inp + lo, dout + lo, hi - lo);
  }
}

void GeluErfForward(float* out, const float* inp, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n * 8, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) GeluErfSpan(out + lo, inp + lo, hi - lo);
  }
}

void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n * 8, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) GeluErfBackSpan(dinp + lo, inp + lo, dout + lo, hi - lo);
  }
}

void TanhForward(float* out, const float* inp, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n * 8, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) TanhSpan(out + lo, inp + lo, hi - lo);
  }
}

void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n, int nt) {
#pragma omp parallel num_threads(ThreadsFor(n, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) TanhBackSpan(dinp + lo, out + lo, dout + lo, hi - lo);
  }
}

void SwiGluForward(float* out, const float* inp, int64_t N, int64_t H, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* H * 8, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) SwiGluRow(out + n * H, inp + n * 2 * H, inp + n * 2 * H + H, H);
}

void SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                    int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* H * 8, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    SwiGluBackRow(dinp + n * 2 * H, dinp + n * 2 * H + H, inp + n * 2 * H, inp + n * 2 * H + H,
                  dout + n * H, H);
  }
}

void GeGluForward(float* out, const float* inp, int64_t N, int64_t H, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* H * 8, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) GeGluRow(out + n * H, inp + n * 2 * H, inp + n * 2 * H + H, H);
}

void GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                   int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N* H * 8, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    GeGluBackRow(dinp + n * 2 * H, dinp + n * 2 * H + H, inp + n * 2 * H, inp + n * 2 * H + H,
                 dout + n * H, H);
  }
}

void SwiGluForwardRounded(void* out, DType out_type, const float* inp, int64_t N, int64_t H,
                          int nt) {
  auto* o16 = static_cast<uint16_t*>(out);
#pragma omp parallel num_threads(ThreadsFor(N* H * 8, nt))
  {
    static thread_local std::vector<float> row;  // one row before rounding
    row.resize(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      SwiGluRow(row.data(), inp + n * 2 * H, inp + n * 2 * H + H, H);
      F32To16Span(o16 + n * H, row.data(), H, out_type);
    }
  }
}

void SwiGluBackwardRounded(float* dinp, void* dinp16, DType type, const float* inp,
                           const float* dout, int64_t N, int64_t H, int nt) {
  (void)dinp;  // not written: each row's fp32 gradient goes through a per-thread row
  auto* d16 = static_cast<uint16_t*>(dinp16);
#pragma omp parallel num_threads(ThreadsFor(N* H * 8, nt))
  {
    static thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(2 * H));
    float* d = row.data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      SwiGluBackRow(d, d + H, inp + n * 2 * H, inp + n * 2 * H + H, dout + n * H, H);
      F32To16Span(d16 + n * 2 * H, d, 2 * H, type);
    }
  }
}

void AdamWRuns(float* param, const float* grad, float* m, float* v, const AdamWRun* runs,
               int64_t n_runs, float lr, float beta1, float beta2, float eps,
               float bias_correction1, float bias_correction2, float grad_scale, int nt) {
  // AdamW's scalars (below), the decay multiplier per run.
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float one_minus_b1 = static_cast<float>(1.0 - b1);
  const float one_minus_b2 = static_cast<float>(1.0 - b2);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(static_cast<double>(bias_correction2)));
  const float neg_step = static_cast<float>(-(lr_d / static_cast<double>(bias_correction1)));
  int64_t total = 0;
  for (int64_t i = 0; i < n_runs; ++i) total += runs[i].numel;
#pragma omp parallel num_threads(ThreadsFor(total * 4, nt))
  {
    // This thread's share of the runs laid end to end, walked run by run.
    int64_t lo, hi;
    Chunk(total, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    int64_t start = 0;
    for (int64_t i = 0; i < n_runs && start < hi; start += runs[i].numel, ++i) {
      const int64_t b = std::max(lo, start), e = std::min(hi, start + runs[i].numel);
      if (e <= b) continue;
      const int64_t o = runs[i].offset + (b - start);
      const float decay_mul =
          static_cast<float>(1.0 - lr_d * static_cast<double>(runs[i].weight_decay));
      AdamWSpan(param + o, grad + o, m + o, v + o, e - b, decay_mul, beta1, one_minus_b1, beta2,
                one_minus_b2, sqrt_bc2, eps, neg_step, grad_scale);
    }
  }
}

void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float bias_correction1,
           float bias_correction2, float grad_scale, int nt) {
  // Scalars as torch forms them: Python doubles, rounded to float where they meet the tensor.
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float decay_mul = static_cast<float>(1.0 - lr_d * static_cast<double>(weight_decay));
  const float one_minus_b1 = static_cast<float>(1.0 - b1);
  const float one_minus_b2 = static_cast<float>(1.0 - b2);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(static_cast<double>(bias_correction2)));
  const float neg_step = static_cast<float>(-(lr_d / static_cast<double>(bias_correction1)));
#pragma omp parallel num_threads(ThreadsFor(n * 4, nt))
  {
    int64_t lo, hi;
    Chunk(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    if (hi > lo) {
      AdamWSpan(param + lo, grad + lo, m + lo, v + lo, hi - lo, decay_mul, beta1, one_minus_b1,
                beta2, one_minus_b2, sqrt_bc2, eps, neg_step, grad_scale);
    }
  }
}

}  // namespace traind::engine::cpu
