// LayerNorm and RMSNorm forward/backward on the CPU. Row statistics accumulate in double.
// Backward: dinp +=, dweight +=, dbias += (parameter gradients reduced through per-thread
// partials summed in thread order, so the result is deterministic for a given thread count).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

namespace traind::engine::cpu {
namespace {

int ThreadsFor(int64_t N, int64_t C, int nt) { return N * C < 8192 ? 1 : std::min<int64_t>(nt, N); }

TRAIND_CPU_CLONES void LayerNormRow(float* out, float* mean_out, float* rstd_out, const float* x,
                                    const float* w, const float* b, int64_t C, float eps) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < C; ++i) s += x[i];
  const double mu = s / static_cast<double>(C);
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < C; ++i) {
    double d = x[i] - mu;
    ss += d * d;
  }
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
  for (int64_t i = 0; i < C; ++i) out[i] = (x[i] - m) * rs * w[i] + b[i];
  *mean_out = m;
  *rstd_out = rs;
}

// Row r of the LayerNorm backward; dw/db are this thread's partial sums.
TRAIND_CPU_CLONES void LayerNormBackRow(float* dx, float* __restrict dw, float* __restrict db,
                                        const float* dy, const float* x, const float* w, float m,
                                        float rs, int64_t C) {
  double sum_dn = 0.0, sum_dn_n = 0.0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
  for (int64_t i = 0; i < C; ++i) {
    float n = (x[i] - m) * rs;
    float dn = w[i] * dy[i];
    sum_dn += dn;
    sum_dn_n += static_cast<double>(dn) * n;
  }
  const float mean_dn = static_cast<float>(sum_dn / static_cast<double>(C));
  const float mean_dn_n = static_cast<float>(sum_dn_n / static_cast<double>(C));
  // Two loops: few enough possibly-aliasing pointers per loop for GCC to vectorise each.
  for (int64_t i = 0; i < C; ++i) {
    float n = (x[i] - m) * rs;
    dx[i] += (w[i] * dy[i] - mean_dn - n * mean_dn_n) * rs;
  }
  for (int64_t i = 0; i < C; ++i) {
    dw[i] += (x[i] - m) * rs * dy[i];
    db[i] += dy[i];
  }
}

TRAIND_CPU_CLONES void RmsNormRow(float* out, float* rstd_out, const float* x, const float* w,
                                  int64_t C, float eps) {
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
  for (int64_t i = 0; i < C; ++i) out[i] = w[i] * (x[i] * rs);
  *rstd_out = rs;
}

TRAIND_CPU_CLONES void RmsNormBackRow(float* dx, float* __restrict dw, const float* dy,
                                      const float* x, const float* w, float rs, int64_t C) {
  double sum_dn_n = 0.0;
#pragma omp simd reduction(+ : sum_dn_n)
  for (int64_t i = 0; i < C; ++i) sum_dn_n += static_cast<double>(w[i] * dy[i]) * (x[i] * rs);
  const float mean_dn_n = static_cast<float>(sum_dn_n / static_cast<double>(C));
  for (int64_t i = 0; i < C; ++i) dx[i] += (w[i] * dy[i] - x[i] * rs * mean_dn_n) * rs;
  for (int64_t i = 0; i < C; ++i) dw[i] += x[i] * rs * dy[i];
}

TRAIND_CPU_CLONES void AddInto(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t N, int64_t C, float eps, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N, C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    LayerNormRow(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C, eps);
  }
}

// Row n normalised into a per-thread fp32 row by `row(out, n)`, then rounded into out16.
template <typename RowFn>
void RoundedRows(void* out16, DType out_type, int64_t N, int64_t C, int nt, RowFn row) {
#pragma omp parallel num_threads(ThreadsFor(N, C, nt))
  {
    static thread_local std::vector<float> tmp;
    tmp.resize(static_cast<size_t>(C));
    uint16_t* dst = static_cast<uint16_t*>(out16);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      row(tmp.data(), n);
      F32To16Span(dst + n * C, tmp.data(), C, out_type);
    }
  }
}

void LayerNormForwardRounded(void* out16, DType out_type, float* mean, float* rstd,
                             const float* inp, const float* weight, const float* bias, int64_t N,
                             int64_t C, float eps, int nt) {
  RoundedRows(out16, out_type, N, C, nt, [&](float* out, int64_t n) {
    LayerNormRow(out, mean + n, rstd + n, inp + n * C, weight, bias, C, eps);
  });
}

void RmsNormForwardRounded(void* out16, DType out_type, float* rstd, const float* inp,
                           const float* weight, int64_t N, int64_t C, float eps, int nt) {
  RoundedRows(out16, out_type, N, C, nt, [&](float* out, int64_t n) {
    RmsNormRow(out, rstd + n, inp + n * C, weight, C, eps);
  });
}

void ResidualNormForward(float* res, void* out, DType out_type, float* mean, float* rstd,
                         const float* a, const float* b, const float* weight, const float* bias,
                         int64_t N, int64_t C, float eps, bool rms, int nt) {
  // Row n: res = a + b, then its norm into `dst`.
  auto row = [&](float* dst, int64_t n) {
    float* r = res + n * C;
    AddSpan(r, a + n * C, b + n * C, C);
    if (rms) {
      RmsNormRow(dst, rstd + n, r, weight, C, eps);
    } else {
      LayerNormRow(dst, mean + n, rstd + n, r, weight, bias, C, eps);
    }
  };
  if (out_type != DType::kF32) {
    RoundedRows(out, out_type, N, C, nt, row);
    return;
  }
  float* out32 = static_cast<float*>(out);
#pragma omp parallel for num_threads(ThreadsFor(N, C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) row(out32 + n * C, n);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t N, int64_t C, int nt) {
  const int threads = ThreadsFor(N, C, nt);
  // partial[t] = (dweight | dbias) of thread t's rows.
  static thread_local std::vector<float> partial;  // reused: no allocation after the first step
  partial.assign(static_cast<size_t>(threads) * 2 * C, 0.0f);
  float* part = partial.data();  // the calling thread's buffer, shared with the team
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nth = omp_get_num_threads();
    float* dw = part + static_cast<int64_t>(t) * 2 * C;
    const int64_t per = (N + nth - 1) / nth;
    for (int64_t n = t * per; n < std::min(N, (t + 1) * per); ++n) {
      LayerNormBackRow(dinp + n * C, dw, dw + C, dout + n * C, inp + n * C, weight, mean[n],
                       rstd[n], C);
    }
  }
  for (int t = 0; t < threads; ++t) {
    AddInto(dweight, partial.data() + static_cast<int64_t>(t) * 2 * C, C);
    AddInto(dbias, partial.data() + static_cast<int64_t>(t) * 2 * C + C, C);
  }
}

void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                    int64_t C, float eps, int nt) {
#pragma omp parallel for num_threads(ThreadsFor(N, C, nt)) schedule(static)
  for (int64_t n = 0; n < N; ++n) RmsNormRow(out + n * C, rstd + n, inp + n * C, weight, C, eps);
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int64_t N, int64_t C, int nt) {
  const int threads = ThreadsFor(N, C, nt);
  static thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(threads) * C, 0.0f);
  float* part = partial.data();  // the calling thread's buffer, shared with the team
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nth = omp_get_num_threads();
    float* dw = part + static_cast<int64_t>(t) * C;
    const int64_t per = (N + nth - 1) / nth;
    for (int64_t n = t * per; n < std::min(N, (t + 1) * per); ++n) {
      RmsNormBackRow(dinp + n * C, dw, dout + n * C, inp + n * C, weight, rstd[n], C);
    }
  }
  for (int t = 0; t < threads; ++t)
    AddInto(dweight, partial.data() + static_cast<int64_t>(t) * C, C);
}

void HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                        int64_t n_heads, int64_t HS, int64_t row_stride, float eps, int nt) {
#pragma omp parallel num_threads(ThreadsFor(N * n_heads, HS, nt))
  {
    static thread_local std::vector<float> in;
    in.resize(static_cast<size_t>(HS));
    float rs_discard = 0.0f;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t h = 0; h < n_heads; ++h) {
        float* head = x + n * row_stride + h * HS;
        std::copy_n(head, HS, in.data());
        if (saved != nullptr) std::copy_n(head, HS, saved + (n * n_heads + h) * HS);
        RmsNormRow(head, rstd != nullptr ? rstd + n * n_heads + h : &rs_discard, in.data(), weight,
                   HS, eps);
      }
    }
  }
}

void HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                         const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                         int64_t row_stride, int nt) {
  const int64_t rows = N * n_heads;
  const int threads = ThreadsFor(rows, HS, nt);
  static thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(threads) * HS, 0.0f);
  float* part = partial.data();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nth = omp_get_num_threads();
    float* dw = part + static_cast<int64_t>(t) * HS;
    static thread_local std::vector<float> dy;
    dy.resize(static_cast<size_t>(HS));
    const int64_t per = (rows + nth - 1) / nth;
    for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) {
      float* d = dx + (r / n_heads) * row_stride + (r % n_heads) * HS;
      std::copy_n(d, HS, dy.data());
      std::fill_n(d, HS, 0.0f);  // = (the row kernel adds)
      RmsNormBackRow(d, dw, dy.data(), saved + r * HS, weight, rstd[r], HS);
    }
  }
  for (int t = 0; t < threads; ++t)
    AddInto(dweight, partial.data() + static_cast<int64_t>(t) * HS, HS);
}

}  // namespace traind::engine::cpu
