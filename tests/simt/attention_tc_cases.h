// The tensor-core attention's test cases, inputs, double-precision reference and comparison,
// shared by tests/simt/attention_tc_test.cc (the kernels under simt) and
// tests/simt/gpu_attention_tc_test.cc (the same kernels on CUDA device 0).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/half.h"

namespace traind::engine::attention_tc_cases {

inline uint16_t To16(float x, DType t) { return t == DType::kBF16 ? F32ToBF16(x) : F32ToF16(x); }
inline float From16(uint16_t x, DType t) { return t == DType::kBF16 ? BF16ToF32(x) : F16ToF32(x); }

struct Case {
  const char* name;
  int64_t HS;
  DType type;
  int64_t B, T, NH, NKV;
  bool causal;
  int key_mask;  // 0: none; 1: padding at the end of row 1; 2: also the first 3 keys of row 0
  int64_t window;
  bool doc;  // packed examples (doc_start)
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Inputs {
  int64_t row;  // elements per fused qkv row: NH + 2 NKV heads, then 8 padding elements
  std::vector<uint16_t> qkv16, dout16;
  std::vector<float> qkv, dout;  // the same values in fp32
  std::vector<int32_t> key_mask, doc_start;
};

inline Inputs MakeInputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.row = (c.NH + 2 * c.NKV) * c.HS + 8;
  const int64_t rows = c.B * c.T;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.qkv.assign(rows * in.row, 0.0f);
  in.qkv16.assign(rows * in.row, 0);
  for (int64_t i = 0; i < rows * in.row; ++i) {
    const float x = (i % in.row) < (c.NH + 2 * c.NKV) * c.HS ? 1.5f * nd(rng) : 0.0f;
    in.qkv16[i] = To16(x, c.type);
    in.qkv[i] = From16(in.qkv16[i], c.type);
  }
  in.dout.resize(rows * c.NH * c.HS);
  in.dout16.resize(in.dout.size());
  for (size_t i = 0; i < in.dout.size(); ++i) {
    in.dout16[i] = To16(nd(rng), c.type);
    in.dout[i] = From16(in.dout16[i], c.type);
  }
  if (c.key_mask != 0) {
    in.key_mask.assign(rows, 1);
    if (c.B > 1)
      for (int64_t j = c.T - 13; j < c.T; ++j) in.key_mask[c.T + j] = 0;
    if (c.key_mask == 2)
      for (int64_t j = 0; j < 3; ++j)
        in.key_mask[j] = 0;  // queries 0..2 of row 0 see nothing (causal)
  }
  if (c.doc) {
    in.doc_start.resize(rows);
    for (int64_t b = 0; b < c.B; ++b) {
      int64_t start = 0;
      for (int64_t i = 0; i < c.T; ++i) {
        if (i == 17 + 3 * b || i == 40 || i == c.T - 5) start = i;  // documents of 17+, 23, ..., 5
        in.doc_start[b * c.T + i] = static_cast<int32_t>(start);
      }
    }
  }
  return in;
}

struct Grads {
  std::vector<float> out, lse, dqkv;  // dqkv: the fused layout (padding untouched = sentinel)
};

inline constexpr float kSentinel = 7.0f;

// Double-precision attention forward and backward (the contract of backend.h, with doc_start).
inline Grads Reference(const Case& c, const Inputs& in) {
  const int64_t T = c.T, HS = c.HS, G = c.NH / c.NKV, ld = c.NH * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  Grads r;
  r.out.assign(c.B * T * ld, 0.0f);
  r.lse.assign(c.B * c.NH * T, 0.0f);
  std::vector<double> dqkv(c.B * T * in.row, 0.0);
  auto q = [&](int64_t b, int64_t i, int64_t h) { return &in.qkv[(b * T + i) * in.row + h * HS]; };
  auto k = [&](int64_t b, int64_t j, int64_t h) {
    return &in.qkv[(b * T + j) * in.row + (c.NH + h / G) * HS];
  };
  auto v = [&](int64_t b, int64_t j, int64_t h) {
    return &in.qkv[(b * T + j) * in.row + (c.NH + c.NKV + h / G) * HS];
  };
  std::vector<double> p(T), o(HS);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY;
        std::vector<bool> vis(T);
        for (int64_t j = 0; j < T; ++j) {
          vis[j] = (!c.causal || j <= i) && (c.window <= 0 || i - j < c.window) &&
                   (in.key_mask.empty() || in.key_mask[b * T + j] != 0) &&
                   (in.doc_start.empty() || j >= in.doc_start[b * T + i]);
          if (!vis[j]) continue;
          double s = 0.0;
          for (int64_t d = 0; d < HS; ++d) s += double{q(b, i, h)[d]} * k(b, j, h)[d];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        if (m == -INFINITY) continue;  // out = 0, lse = 0, no gradient
        double sum = 0.0;
        for (int64_t j = 0; j < T; ++j)
          if (vis[j]) sum += (p[j] = std::exp(p[j] - m));
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (!vis[j]) continue;
          p[j] /= sum;
          for (int64_t d = 0; d < HS; ++d) o[d] += p[j] * v(b, j, h)[d];
        }
        r.lse[(b * c.NH + h) * T + i] = static_cast<float>(m + std::log(sum));
        const float* dout = &in.dout[(b * T + i) * ld + h * HS];
        double delta = 0.0;
        for (int64_t d = 0; d < HS; ++d) {
          r.out[(b * T + i) * ld + h * HS + d] = static_cast<float>(o[d]);
          delta += o[d] * dout[d];
        }
        double* dq = &dqkv[(b * T + i) * in.row + h * HS];
        for (int64_t j = 0; j < T; ++j) {
          if (!vis[j]) continue;
          double dp = 0.0;
          for (int64_t d = 0; d < HS; ++d) dp += double{dout[d]} * v(b, j, h)[d];
          const double ds = p[j] * (dp - delta) * scale;
          double* dk = &dqkv[(b * T + j) * in.row + (c.NH + h / G) * HS];
          double* dv = &dqkv[(b * T + j) * in.row + (c.NH + c.NKV + h / G) * HS];
          for (int64_t d = 0; d < HS; ++d) {
            dq[d] += ds * k(b, j, h)[d];
            dk[d] += ds * q(b, i, h)[d];
            dv[d] += p[j] * dout[d];
          }
        }
      }
  r.dqkv.resize(dqkv.size());
  for (size_t i = 0; i < dqkv.size(); ++i)
    r.dqkv[i] = static_cast<int64_t>(i % in.row) < (c.NH + 2 * c.NKV) * HS
                    ? static_cast<float>(dqkv[i])
                    : kSentinel;
  return r;
}

// The CPU backend's fp32 attention on the same (rounded) inputs; no doc_start.
inline Grads CpuBackend(const Case& c, const Inputs& in) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  const int64_t rows = c.B * c.T, ld = c.NH * c.HS;
  Grads r;
  r.out.assign(rows * ld, 0.0f);
  r.lse.assign(c.B * c.NH * c.T, 0.0f);
  r.dqkv.assign(rows * in.row, kSentinel);
  const float* q = in.qkv.data();
  const int32_t* km = in.key_mask.empty() ? nullptr : in.key_mask.data();
  cpu->AttentionForward(r.out.data(), r.lse.data(), q, q + c.NH * c.HS, q + (c.NH + c.NKV) * c.HS,
                        c.B, c.T, c.NH, c.NKV, c.HS, in.row, in.row, c.causal, km, DType::kF32,
                        c.window);
  float* dq = r.dqkv.data();
  cpu->AttentionBackward(dq, dq + c.NH * c.HS, dq + (c.NH + c.NKV) * c.HS, in.dout.data(),
                         r.out.data(), r.lse.data(), q, q + c.NH * c.HS, q + (c.NH + c.NKV) * c.HS,
                         c.B, c.T, c.NH, c.NKV, c.HS, in.row, in.row, c.causal, km, DType::kF32,
                         c.window);
  EXPECT_TRUE(cpu->status().ok()) << cpu->status().ToString();
  return r;
}

// max |x - ref| / max |ref| (the error relative to the tensor's scale); NaN anywhere -> inf.
inline double RelErr(const std::vector<float>& x, const std::vector<float>& ref) {
  double worst = 0.0, scale = 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double{x[i]} - ref[i]));
    scale = std::max(scale, std::fabs(double{ref[i]}));
  }
  return worst / scale;
}
inline double MaxAbsErr(const std::vector<float>& x, const std::vector<float>& ref) {
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::isfinite(x[i]) ? std::fabs(double{x[i]} - ref[i]) : INFINITY);
  return worst;
}

// Tolerances (errors relative to each tensor's largest magnitude): the kernels round P (and in
// backward dS) to the 16-bit type for the products and write 16-bit outputs, which the fp32
// reference does not.
// Measured worst (the cases below): bf16 out 3.3e-3, dq/dk/dv 4.4e-3; fp16 out 3.9e-4, dq/dk/dv
// 5.1e-4; lse 9.5e-7. The bounds leave about 3x.
inline double OutTol(DType t) { return t == DType::kBF16 ? 1e-2 : 1.5e-3; }
inline double GradTol(DType t) { return t == DType::kBF16 ? 1.5e-2 : 2e-3; }
// lse: absolute, natural-log units (the scores are exact products).
inline constexpr double kLseTol = 1e-5;

inline const Case kCases[] = {
    {"hs64_bf16_causal_gqa", 64, DType::kBF16, 2, 77, 4, 2, true, 0, 0, false},
    {"hs64_f16_causal_keymask_emptyrows", 64, DType::kF16, 2, 70, 2, 2, true, 2, 0, false},
    {"hs80_bf16_causal_window_gqa", 80, DType::kBF16, 1, 75, 2, 1, true, 0, 20, false},
    {"hs80_f16_bert_keymask", 80, DType::kF16, 2, 50, 2, 2, false, 1, 0, false},
    {"hs96_bf16_causal_packed", 96, DType::kBF16, 2, 66, 2, 2, true, 0, 0, true},
    {"hs96_f16_causal_gqa4", 96, DType::kF16, 1, 80, 4, 1, true, 0, 0, false},
    {"hs128_bf16_window_keymask", 128, DType::kBF16, 2, 70, 2, 2, false, 1, 16, false},
    {"hs128_f16_causal_packed_keymask", 128, DType::kF16, 2, 45, 2, 1, true, 1, 0, true},
    {"hs256_bf16_causal", 256, DType::kBF16, 1, 45, 2, 1, true, 0, 0, false},
    {"hs256_f16_packed_keymask", 256, DType::kF16, 2, 38, 2, 2, false, 1, 0, true},
};

// Several query and key tiles per sequence (T not a multiple of any tile): the cp.async double
// buffering and the online softmax across tiles, which kCases reach only partly.
inline const Case kLongCases[] = {
    {"hs64_bf16_causal_keymask_gqa_long", 64, DType::kBF16, 2, 300, 4, 2, true, 1, 0, false},
    {"hs128_f16_causal_window_packed_long", 128, DType::kF16, 1, 260, 2, 1, true, 0, 100, true},
    {"hs256_bf16_bert_keymask_long", 256, DType::kBF16, 2, 200, 2, 2, false, 1, 0, false},
};

// The tensor-core kernels' results `tc` (tc_run(c, in), widened to fp32) against the
// double-precision reference and the CPU backend, within the bounds above.
template <typename Run>
void ExpectMatches(const Case& c, Run&& tc_run, uint64_t seed = 0) {
  const Inputs in = MakeInputs(c, seed != 0 ? seed : 1234 + c.HS);
  const Grads ref = Reference(c, in);
  const Grads tc = tc_run(c, in);
  if (!c.doc) {
    // The double-precision reference is the CPU backend's contract (the CPU backend has no
    // doc_start); the kernels also match the CPU backend directly.
    const Grads cpu = CpuBackend(c, in);
    EXPECT_LE(RelErr(cpu.out, ref.out), 1e-5);
    EXPECT_LE(MaxAbsErr(cpu.lse, ref.lse), 1e-5);
    EXPECT_LE(RelErr(cpu.dqkv, ref.dqkv), 1e-4);
    EXPECT_LE(RelErr(tc.out, cpu.out), OutTol(c.type)) << "against the CPU backend";
    EXPECT_LE(RelErr(tc.dqkv, cpu.dqkv), GradTol(c.type)) << "against the CPU backend";
  }
  const double e_out = RelErr(tc.out, ref.out), e_lse = MaxAbsErr(tc.lse, ref.lse),
               e_grad = RelErr(tc.dqkv, ref.dqkv);
  std::printf("[ %s ] out %.2e  lse %.2e  dqkv %.2e\n", c.name, e_out, e_lse, e_grad);
  EXPECT_LE(e_out, OutTol(c.type));
  EXPECT_LE(e_lse, kLseTol);
  EXPECT_LE(e_grad, GradTol(c.type));
  // Per-part checks, so a wrong dq, dk or dv alone cannot hide under another's scale; the padding
  // columns of the fused rows keep their sentinel.
  const int64_t HS = c.HS;
  for (int part = 0; part < 3; ++part) {
    const int64_t off = part == 0 ? 0 : part == 1 ? c.NH * HS : (c.NH + c.NKV) * HS;
    const int64_t width = (part == 0 ? c.NH : c.NKV) * HS;
    std::vector<float> a, b;
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t d = 0; d < width; ++d) {
        a.push_back(tc.dqkv[r * in.row + off + d]);
        b.push_back(ref.dqkv[r * in.row + off + d]);
      }
    EXPECT_LE(RelErr(a, b), GradTol(c.type)) << "part " << part;
  }
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t d = (c.NH + 2 * c.NKV) * HS; d < in.row; ++d)
      ASSERT_EQ(tc.dqkv[r * in.row + d], kSentinel) << "row " << r << " col " << d;
}

}  // namespace traind::engine::attention_tc_cases
