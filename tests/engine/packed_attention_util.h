// Packed rows for the attention tests (Backend::AttentionForward's doc_start): sequences holding
// several examples, the rest of a row padding (each padding position its own example, as
// ExampleSet::RowLayout makes them); a double-precision reference, and one forward + backward on
// any backend. Shared by tests/engine/packed_attention_test.cc (cpu) and
// tests/simt/packed_attention_simt_test.cc (simt against cpu).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/backend.h"

namespace traind::engine::testing {

struct PackedCase {
  int64_t B, T, NH, NKV, HS;
  std::vector<std::vector<int64_t>> docs;  // per sequence: its examples' lengths, in order
  bool causal = true;
  int64_t window = 0;
  std::string Name() const {
    std::ostringstream s;
    s << "B" << B << " T" << T << " NH" << NH << " NKV" << NKV << " HS" << HS;
    for (const auto& seq : docs) {
      s << " [";
      for (int64_t n : seq) s << n << " ";
      s << "]";
    }
    if (!causal) s << " bidirectional";
    if (window > 0) s << " window " << window;
    return s.str();
  }
};

// doc_start (B*T): the first position of each token's example; padding positions their own.
inline std::vector<int32_t> DocStarts(const PackedCase& c) {
  std::vector<int32_t> ds(static_cast<size_t>(c.B * c.T));
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t pos = 0;
    if (b < static_cast<int64_t>(c.docs.size())) {
      for (int64_t n : c.docs[static_cast<size_t>(b)]) {
        for (int64_t t = pos; t < pos + n && t < c.T; ++t) ds[b * c.T + t] = static_cast<int32_t>(pos);
        pos += n;
      }
    }
    for (int64_t t = pos; t < c.T; ++t) ds[b * c.T + t] = static_cast<int32_t>(t);
  }
  return ds;
}

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// q (B*T, NH*HS), k and v (B*T, NKV*HS), dout (B*T, NH*HS): contiguous rows.
struct AttentionIo {
  std::vector<float> q, k, v, dout;
  std::vector<float> out, lse, dq, dk, dv;  // results
};

inline AttentionIo RandomIo(const PackedCase& c, uint64_t seed) {
  AttentionIo io;
  const auto rows = static_cast<size_t>(c.B * c.T);
  io.q = RandomFloats(rows * static_cast<size_t>(c.NH * c.HS), seed);
  io.k = RandomFloats(rows * static_cast<size_t>(c.NKV * c.HS), seed + 1);
  io.v = RandomFloats(rows * static_cast<size_t>(c.NKV * c.HS), seed + 2);
  io.dout = RandomFloats(rows * static_cast<size_t>(c.NH * c.HS), seed + 3);
  return io;
}

// Whether query i of sequence b sees key j.
inline bool Sees(const PackedCase& c, const std::vector<int32_t>& ds, int64_t b, int64_t i,
                 int64_t j) {
  if (c.causal && j > i) return false;
  if (c.window > 0 && i - j >= c.window) return false;
  return j >= ds[static_cast<size_t>(b * c.T + i)];
}

// The double-precision forward and backward into io's results.
inline void ReferenceAttention(const PackedCase& c, const std::vector<int32_t>& ds,
                               AttentionIo* io) {
  const int64_t T = c.T, HS = c.HS, C = c.NH * HS, KC = c.NKV * HS, group = c.NH / c.NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const auto rows = static_cast<size_t>(c.B * T);
  io->out.assign(rows * static_cast<size_t>(C), 0.0f);
  io->lse.assign(static_cast<size_t>(c.B * c.NH * T), 0.0f);
  io->dq.assign(rows * static_cast<size_t>(C), 0.0f);
  std::vector<double> dk(rows * static_cast<size_t>(KC), 0.0), dv(dk.size(), 0.0);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.NH; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < T; ++i) {
        const float* q = &io->q[static_cast<size_t>((b * T + i) * C + h * HS)];
        std::vector<double> s(static_cast<size_t>(T), -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          if (!Sees(c, ds, b, i, j)) continue;
          const float* k = &io->k[static_cast<size_t>((b * T + j) * KC + kvh * HS)];
          double dot = 0;
          for (int64_t e = 0; e < HS; ++e) dot += double(q[e]) * k[e];
          s[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no key: out 0, lse 0
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (Sees(c, ds, b, i, j)) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        }
        const double lse = mx + std::log(sum);
        io->lse[static_cast<size_t>((b * c.NH + h) * T + i)] = static_cast<float>(lse);
        std::vector<double> p(static_cast<size_t>(T), 0.0), o(static_cast<size_t>(HS), 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (!Sees(c, ds, b, i, j)) continue;
          p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - lse);
          const float* v = &io->v[static_cast<size_t>((b * T + j) * KC + kvh * HS)];
          for (int64_t e = 0; e < HS; ++e) o[static_cast<size_t>(e)] += p[static_cast<size_t>(j)] * v[e];
        }
        float* out = &io->out[static_cast<size_t>((b * T + i) * C + h * HS)];
        for (int64_t e = 0; e < HS; ++e) out[e] = static_cast<float>(o[static_cast<size_t>(e)]);
        // Backward: dP = dO V^T, D = dO . O, dS = P (dP - D) scale.
        const float* dout = &io->dout[static_cast<size_t>((b * T + i) * C + h * HS)];
        double D = 0;
        for (int64_t e = 0; e < HS; ++e) D += double(dout[e]) * o[static_cast<size_t>(e)];
        float* dq = &io->dq[static_cast<size_t>((b * T + i) * C + h * HS)];
        std::vector<double> dqd(static_cast<size_t>(HS), 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (!Sees(c, ds, b, i, j)) continue;
          const float* k = &io->k[static_cast<size_t>((b * T + j) * KC + kvh * HS)];
          const float* v = &io->v[static_cast<size_t>((b * T + j) * KC + kvh * HS)];
          double dp = 0;
          for (int64_t e = 0; e < HS; ++e) dp += double(dout[e]) * v[e];
          const double pj = p[static_cast<size_t>(j)];
          const double dsj = pj * (dp - D) * scale;
          for (int64_t e = 0; e < HS; ++e) {
            dqd[static_cast<size_t>(e)] += dsj * k[e];
            dk[static_cast<size_t>((b * T + j) * KC + kvh * HS + e)] += dsj * q[e];
            dv[static_cast<size_t>((b * T + j) * KC + kvh * HS + e)] += pj * dout[e];
          }
        }
        for (int64_t e = 0; e < HS; ++e) dq[e] = static_cast<float>(dqd[static_cast<size_t>(e)]);
      }
    }
  }
  io->dk.assign(dk.begin(), dk.end());
  io->dv.assign(dv.begin(), dv.end());
}

// One forward and backward on `be` (device buffers), doc_start uploaded unless `ds` is empty.
// `out_lse_in`: take out and lse from there for the backward instead of this forward's.
inline void RunAttention(Backend* be, const PackedCase& c, const std::vector<int32_t>& ds,
                         AttentionIo* io, DType operands = DType::kF32,
                         const AttentionIo* out_lse_in = nullptr) {
  const int64_t rows = c.B * c.T, C = c.NH * c.HS, KC = c.NKV * c.HS;
  std::vector<void*> allocs;
  auto up = [&](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    void* p = be->Alloc(v.size() * sizeof(T));
    be->CopyHostToDevice(p, v.data(), v.size() * sizeof(T));
    allocs.push_back(p);
    return static_cast<T*>(p);
  };
  auto zeros = [&](size_t n) {
    return up(std::vector<float>(n, 0.0f));
  };
  float* q = up(io->q);
  float* k = up(io->k);
  float* v = up(io->v);
  float* dout = up(io->dout);
  const int32_t* d = ds.empty() ? nullptr : up(ds);
  float* out = zeros(static_cast<size_t>(rows * C));
  float* lse = zeros(static_cast<size_t>(c.B * c.NH * c.T));
  float* dq = zeros(static_cast<size_t>(rows * C));
  float* dk = zeros(static_cast<size_t>(rows * KC));
  float* dv = zeros(static_cast<size_t>(rows * KC));
  be->AttentionForward(out, lse, q, k, v, c.B, c.T, c.NH, c.NKV, c.HS, C, KC, c.causal, nullptr,
                       operands, c.window, d);
  io->out.resize(static_cast<size_t>(rows * C));
  io->lse.resize(static_cast<size_t>(c.B * c.NH * c.T));
  be->CopyDeviceToHost(io->out.data(), out, io->out.size() * sizeof(float));
  be->CopyDeviceToHost(io->lse.data(), lse, io->lse.size() * sizeof(float));
  if (out_lse_in != nullptr) {
    be->CopyHostToDevice(out, out_lse_in->out.data(), out_lse_in->out.size() * sizeof(float));
    be->CopyHostToDevice(lse, out_lse_in->lse.data(), out_lse_in->lse.size() * sizeof(float));
  }
  be->AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, c.B, c.T, c.NH, c.NKV, c.HS, C, KC,
                        c.causal, nullptr, operands, c.window, d);
  io->dq.resize(static_cast<size_t>(rows * C));
  io->dk.resize(static_cast<size_t>(rows * KC));
  io->dv.resize(static_cast<size_t>(rows * KC));
  be->CopyDeviceToHost(io->dq.data(), dq, io->dq.size() * sizeof(float));
  be->CopyDeviceToHost(io->dk.data(), dk, io->dk.size() * sizeof(float));
  be->CopyDeviceToHost(io->dv.data(), dv, io->dv.size() * sizeof(float));
  be->Synchronize();
  for (void* p : allocs) be->Free(p);
}

// The largest |a - b| / (abs + rel * |b|) (<= 1: within tolerance).
inline double WorstRatio(const std::vector<float>& a, const std::vector<float>& b, double abs,
                         double rel) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double r = std::abs(double(a[i]) - b[i]) / (abs + rel * std::abs(double(b[i])));
    worst = std::max(worst, std::isfinite(r) ? r : std::numeric_limits<double>::infinity());
  }
  return a.size() == b.size() ? worst : std::numeric_limits<double>::infinity();
}

}  // namespace traind::engine::testing
