// CPU backend attention (causal or not, key padding masks, sliding windows, GQA, strided rows),
// rotary embedding
// and fused softmax + cross-entropy against independent double-precision references written here;
// backward ops against central finite differences of those references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"
#include "cpu_test_util.h"

namespace traind::engine {
namespace {

using testing::DotD;
using testing::ExpectClose;
using testing::NumGrad;
using testing::RandVec;
using testing::ToDouble;

struct AttnShape {
  int B, T, NH, NKV, HS;
  int q_stride, kv_stride;  // row strides of q and of k/v
  int q_off, k_off, v_off;  // element offsets of q, k, v in their buffers
};

// How a case attends: causal or not, the key padding mask (B*T; empty: every key) and the sliding
// window (0: none).
struct AttnMode {
  bool causal = true;
  std::vector<int32_t> mask;
  int window = 0;
};

// Whether query t of sequence b attends key j (HF: the other keys get weight exactly 0): causal,
// the key mask and the window (HF Mistral's sliding window: t - j < window) together.
bool Sees(const AttnMode& mode, int T, int b, int t, int j) {
  if (mode.causal && j > t) return false;
  if (!mode.mask.empty() && mode.mask[b * T + j] == 0) return false;
  return mode.window <= 0 || t - j < mode.window;
}

// out (B*T, NH*HS), lse (B, NH, T); q, k, v read from `qb`, `kvb` with the shape's strides.
// Query t attends key j when Sees(); a query with no such key: out 0, lse 0.
void RefAttention(const AttnShape& s, const std::vector<double>& qb, const std::vector<double>& kb,
                  const std::vector<double>& vb, std::vector<double>* out,
                  std::vector<double>* lse, const AttnMode& mode = {}) {
  const int C = s.NH * s.HS, group = s.NH / s.NKV;
  out->assign(s.B * s.T * C, 0.0);
  lse->assign(s.B * s.NH * s.T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < s.T; ++t) {
        std::vector<int> keys;
        for (int j = 0; j < s.T; ++j)
          if (Sees(mode, s.T, b, t, j)) keys.push_back(j);
        if (keys.empty()) continue;  // out 0, lse 0
        std::vector<double> sc(s.T);
        double mx = -1e300;
        for (int j : keys) {
          double d = 0.0;
          for (int i = 0; i < s.HS; ++i) {
            d += qb[s.q_off + (b * s.T + t) * s.q_stride + h * s.HS + i] *
                 kb[s.k_off + (b * s.T + j) * s.kv_stride + kvh * s.HS + i];
          }
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0.0;
        for (int j : keys) sum += std::exp(sc[j] - mx);
        (*lse)[(b * s.NH + h) * s.T + t] = mx + std::log(sum);
        for (int j : keys) {
          const double p = std::exp(sc[j] - mx) / sum;
          for (int i = 0; i < s.HS; ++i) {
            (*out)[(b * s.T + t) * C + h * s.HS + i] +=
                p * vb[s.v_off + (b * s.T + j) * s.kv_stride + kvh * s.HS + i];
          }
        }
      }
    }
  }
}

// Runs forward and backward for one layout. fused: q, k, v (and dq, dk, dv) share one buffer.
void CheckAttentionOnce(const AttnShape& s, bool fused, bool grad_check, const AttnMode& mode) {
  auto be = MakeCpuBackend(2);
  const int32_t* km = mode.mask.empty() ? nullptr : mode.mask.data();
  const int rows = s.B * s.T, C = s.NH * s.HS;
  const size_t qn = static_cast<size_t>(rows * s.q_stride),
               kvn = static_cast<size_t>(rows * s.kv_stride);
  auto qbuf = RandVec(qn, 1, -1.5f, 1.5f);
  auto kbuf = fused ? qbuf : RandVec(kvn, 2, -1.5f, 1.5f);
  auto vbuf = fused ? qbuf : RandVec(kvn, 3);
  std::vector<double> want_out, want_lse;
  RefAttention(s, ToDouble(qbuf), ToDouble(kbuf), ToDouble(vbuf), &want_out, &want_lse, mode);
  std::vector<float> out(rows * C, NAN), lse(s.B * s.NH * s.T, NAN);
  be->AttentionForward(out.data(), lse.data(), qbuf.data() + s.q_off, kbuf.data() + s.k_off,
                       vbuf.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS, s.q_stride, s.kv_stride,
                       mode.causal, km, DType::kF32, mode.window);
  const std::string tag = std::string(fused ? "fused" : "separate") + " T=" + std::to_string(s.T) +
                          (mode.causal ? " causal" : " bidirectional") +
                          (km != nullptr ? " masked" : "") +
                          (mode.window > 0 ? " window " + std::to_string(mode.window) : "");
  ExpectClose(out, want_out, 1e-5, 2e-6, "attention out " + tag);
  ExpectClose(lse, want_lse, 1e-5, 2e-6, "attention lse " + tag);
  // Queries that see no key: out and lse exactly 0 (the reference leaves them 0).
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < s.T; ++t) {
      bool any = false;
      for (int j = 0; j < s.T; ++j) any = any || Sees(mode, s.T, b, t, j);
      if (any) continue;
      for (int c = 0; c < C; ++c) ASSERT_EQ(out[(b * s.T + t) * C + c], 0.0f) << tag;
      for (int h = 0; h < s.NH; ++h) ASSERT_EQ(lse[(b * s.NH + h) * s.T + t], 0.0f) << tag;
    }
  }
  if (km != nullptr && !fused) {
    // Masked keys have exactly zero weight: huge k and v there change nothing, to the bit.
    auto k2 = kbuf, v2 = vbuf;
    for (int r = 0; r < rows; ++r) {
      if (km[r] != 0) continue;
      for (int c = 0; c < s.NKV * s.HS; ++c) {
        k2[s.k_off + r * s.kv_stride + c] = 1e4f;
        v2[s.v_off + r * s.kv_stride + c] = -3e4f;
      }
    }
    std::vector<float> out2(rows * C), lse2(s.B * s.NH * s.T);
    be->AttentionForward(out2.data(), lse2.data(), qbuf.data() + s.q_off, k2.data() + s.k_off,
                         v2.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS, s.q_stride,
                         s.kv_stride, mode.causal, km, DType::kF32, mode.window);
    EXPECT_EQ(out2, out) << "masked keys changed the output " << tag;
    EXPECT_EQ(lse2, lse) << "masked keys changed the lse " << tag;
  }
  if (!grad_check) return;

  // L = sum(R * out). Gradients by finite differences of the reference, per input buffer.
  auto R = RandVec(rows * C, 4);
  const float kSentinel = 12345.0f;
  std::vector<float> dqbuf(qn, kSentinel), dkbuf(kvn, kSentinel), dvbuf(kvn, kSentinel);
  float* dq = dqbuf.data() + s.q_off;
  float* dk = (fused ? dqbuf.data() : dkbuf.data()) + s.k_off;
  float* dv = (fused ? dqbuf.data() : dvbuf.data()) + s.v_off;
  be->AttentionBackward(dq, dk, dv, R.data(), out.data(), lse.data(), qbuf.data() + s.q_off,
                        kbuf.data() + s.k_off, vbuf.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS,
                        s.q_stride, s.kv_stride, mode.causal, km, DType::kF32, mode.window);
  auto loss = [&](const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v) {
    std::vector<double> o, l;
    RefAttention(s, q, k, v, &o, &l, mode);
    return DotD(o, ToDouble(R));
  };
  const auto q0 = ToDouble(qbuf), k0 = ToDouble(kbuf), v0 = ToDouble(vbuf);
  std::vector<double> gq, gk, gv;
  if (fused) {
    gq = NumGrad([&](const std::vector<double>& x) { return loss(x, x, x); }, q0);
  } else {
    gq = NumGrad([&](const std::vector<double>& x) { return loss(x, k0, v0); }, q0);
    gk = NumGrad([&](const std::vector<double>& x) { return loss(q0, x, v0); }, k0);
    gv = NumGrad([&](const std::vector<double>& x) { return loss(q0, k0, x); }, v0);
  }
  // Compare the head columns; every other column must still hold the sentinel.
  auto check = [&](const std::vector<float>& got, const std::vector<double>& num,
                   const std::vector<std::pair<int, int>>& spans, int stride, const char* what) {
    std::vector<float> g;
    std::vector<double> w;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < stride; ++c) {
        bool in = false;
        for (auto [b, e] : spans) in = in || (c >= b && c < e);
        const size_t idx = static_cast<size_t>(r * stride + c);
        if (in) {
          g.push_back(got[idx]);
          w.push_back(num[idx]);
        } else {
          ASSERT_EQ(got[idx], kSentinel) << what << " touched row " << r << " col " << c;
        }
      }
    }
    ExpectClose(g, w, 1e-4, 2e-6, std::string(what) + " " + tag);
  };
  const int qc = s.NH * s.HS, kc = s.NKV * s.HS;
  if (fused) {
    check(dqbuf, gq, {{s.q_off, s.q_off + qc}, {s.k_off, s.k_off + kc}, {s.v_off, s.v_off + kc}},
          s.q_stride, "dqkv");
  } else {
    check(dqbuf, gq, {{s.q_off, s.q_off + qc}}, s.q_stride, "dq");
    check(dkbuf, gk, {{s.k_off, s.k_off + kc}}, s.kv_stride, "dk");
    check(dvbuf, gv, {{s.v_off, s.v_off + kc}}, s.kv_stride, "dv");
    if (km != nullptr) {  // masked keys: dk = dv = 0 exactly
      for (int r = 0; r < rows; ++r) {
        if (km[r] != 0) continue;
        for (int c = 0; c < kc; ++c) {
          ASSERT_EQ(dkbuf[s.k_off + r * s.kv_stride + c], 0.0f) << "dk, masked row " << r;
          ASSERT_EQ(dvbuf[s.v_off + r * s.kv_stride + c], 0.0f) << "dv, masked row " << r;
        }
      }
    }
  }
}

// The fp32 tile products are the backend's own loops (no GEMM library), so one run per layout.
void CheckAttention(const AttnShape& s, bool fused, bool grad_check, const AttnMode& mode = {}) {
  CheckAttentionOnce(s, fused, grad_check, mode);
}

// The analytic gradients of L = sum(R * out) in double, from the reference's own forward:
// p = exp(scale q.k - lse) on the attended keys, dp_j = R_t . v_j, D_t = R_t . out_t,
// ds_j = p_j (dp_j - D_t); dq_t = scale sum_j ds_j k_j, dk_j += scale ds_j q_t, dv_j += p_j R_t.
void RefAttentionBackward(const AttnShape& s, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& R, const AttnMode& mode,
                          std::vector<double>* dq, std::vector<double>* dk,
                          std::vector<double>* dv) {
  std::vector<double> out, lse;
  RefAttention(s, q, k, v, &out, &lse, mode);
  const int C = s.NH * s.HS, group = s.NH / s.NKV, HS = s.HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  dq->assign(q.size(), 0.0);
  dk->assign(k.size(), 0.0);
  dv->assign(v.size(), 0.0);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < s.T; ++t) {
        const int qr = s.q_off + (b * s.T + t) * s.q_stride + h * HS;
        const int orow = (b * s.T + t) * C + h * HS;
        double D = 0.0;
        for (int i = 0; i < HS; ++i) D += R[orow + i] * out[orow + i];
        for (int j = 0; j < s.T; ++j) {
          if (!Sees(mode, s.T, b, t, j)) continue;
          const int kr = s.k_off + (b * s.T + j) * s.kv_stride + kvh * HS;
          const int vr = s.v_off + (b * s.T + j) * s.kv_stride + kvh * HS;
          double sc = 0.0, dp = 0.0;
          for (int i = 0; i < HS; ++i) {
            sc += q[qr + i] * k[kr + i];
            dp += R[orow + i] * v[vr + i];
          }
          const double p = std::exp(sc * scale - lse[(b * s.NH + h) * s.T + t]);
          const double ds = p * (dp - D);
          for (int i = 0; i < HS; ++i) {
            (*dq)[qr + i] += scale * ds * k[kr + i];
            (*dk)[kr + i] += scale * ds * q[qr + i];
            (*dv)[vr + i] += p * R[orow + i];
          }
        }
      }
    }
  }
}

TEST(CpuAttentionTest, FusedQkvRowsGqaForwardBackward) {
  // q | k | v in one row of (NH + 2 NKV) * HS floats, as a fused qkv projection writes them.
  const int B = 2, T = 5, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS;
  CheckAttention({B, T, NH, NKV, HS, W, W, 0, NH * HS, (NH + NKV) * HS}, true, true);
  // T = 70 crosses the kernels' 64-query block boundary (a full block and a partial one).
  const int T2 = 70, NH2 = 2, NKV2 = 1, HS2 = 4, W2 = (NH2 + 2 * NKV2) * HS2;
  CheckAttention({1, T2, NH2, NKV2, HS2, W2, W2, 0, NH2 * HS2, (NH2 + NKV2) * HS2}, true, true);
}

TEST(CpuAttentionTest, SeparatePaddedRowsForwardBackward) {
  // Strides larger than the heads; the padding columns must stay untouched.
  CheckAttention({2, 5, 4, 2, 6, 4 * 6 + 3, 2 * 6 + 2, 1, 2, 0}, false, true);
  CheckAttention({1, 7, 3, 3, 4, 3 * 4 + 1, 3 * 4 + 1, 0, 0, 1}, false, true);  // MHA
  CheckAttention({1, 6, 4, 1, 2, 8, 2, 0, 0, 0}, false, true);                  // MQA
}

TEST(CpuAttentionTest, LargerShapesForward) {
  CheckAttention({2, 64, 6, 3, 16, 96, 48, 0, 0, 0}, false, false);
  CheckAttention({3, 1, 2, 2, 8, 16, 16, 0, 0, 0}, false, false);  // T = 1
  CheckAttention({1, 130, 2, 1, 64, 128, 64, 0, 0, 0}, false, false);
}

// A random key mask (about a quarter of the keys masked) in which sequence `empty` has no key at
// all and key 0 of sequence 0 is masked (so the first causal query of it sees nothing).
std::vector<int32_t> RandomMask(int B, int T, int empty, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> m(B * T);
  for (auto& x : m) x = rng() % 4 != 0 ? 1 : 0;
  for (int j = 0; j < T; ++j) m[empty * T + j] = 0;
  m[0] = 0;
  if (B > 1 && empty != 0) m[1] = 1;  // sequence 0 still has visible keys
  return m;
}

// Padded tails: sequence b has its first lengths[b] keys (BERT's attention_mask).
std::vector<int32_t> TailMask(int T, const std::vector<int>& lengths) {
  std::vector<int32_t> m;
  for (int len : lengths)
    for (int j = 0; j < T; ++j) m.push_back(j < len ? 1 : 0);
  return m;
}

// Forward and backward of one case against the double references (RefAttention and its analytic
// gradients); rows padded past the heads keep their bytes.
void CheckAgainstAnalytic(Backend* be, const AttnShape& s, const AttnMode& mode,
                          DType operands = DType::kF32) {
  const int32_t* km = mode.mask.empty() ? nullptr : mode.mask.data();
  const std::string tag = "T=" + std::to_string(s.T) + " HS=" + std::to_string(s.HS) +
                          " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                          (mode.causal ? " causal" : " bidirectional") +
                          (km != nullptr ? " masked" : "") +
                          (mode.window > 0 ? " window " + std::to_string(mode.window) : "");
  SCOPED_TRACE(tag);
  const int rows = s.B * s.T, C = s.NH * s.HS;
  auto q = RandVec(static_cast<size_t>(rows * s.q_stride), 31, -1.5f, 1.5f);
  auto k = RandVec(static_cast<size_t>(rows * s.kv_stride), 32, -1.5f, 1.5f);
  auto v = RandVec(static_cast<size_t>(rows * s.kv_stride), 33);
  auto R = RandVec(static_cast<size_t>(rows * C), 34);
  std::vector<double> want_out, want_lse, gq, gk, gv;
  RefAttention(s, ToDouble(q), ToDouble(k), ToDouble(v), &want_out, &want_lse, mode);
  RefAttentionBackward(s, ToDouble(q), ToDouble(k), ToDouble(v), ToDouble(R), mode, &gq, &gk, &gv);
  std::vector<float> out(rows * C, NAN), lse(s.B * s.NH * s.T, NAN);
  be->AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV,
                       s.HS, s.q_stride, s.kv_stride, mode.causal, km, operands, mode.window);
  ExpectClose(out, want_out, 1e-5, 2e-6, "out " + tag);
  ExpectClose(lse, want_lse, 1e-5, 2e-6, "lse " + tag);
  const float kSentinel = 12345.0f;
  std::vector<float> dq(q.size(), kSentinel), dk(k.size(), kSentinel), dv(v.size(), kSentinel);
  be->AttentionBackward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(),
                        q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.q_stride,
                        s.kv_stride, mode.causal, km, operands, mode.window);
  auto heads = [&](const std::vector<float>& got, const std::vector<double>& want, int width,
                   int stride, const char* what) {
    std::vector<float> g;
    std::vector<double> w;
    for (int r = 0; r < rows; ++r) {
      for (int col = 0; col < stride; ++col) {
        const size_t i = static_cast<size_t>(r * stride + col);
        if (col < width) {
          g.push_back(got[i]);
          w.push_back(want[i]);
        } else {
          ASSERT_EQ(got[i], kSentinel) << what << " wrote row " << r << " col " << col;
        }
      }
    }
    ExpectClose(g, w, 1e-4, 1e-5, std::string(what) + " " + tag);
  };
  heads(dq, gq, C, s.q_stride, "dq");
  heads(dk, gk, s.NKV * s.HS, s.kv_stride, "dk");
  heads(dv, gv, s.NKV * s.HS, s.kv_stride, "dv");
}

// Head sizes that fill whole 16-float vectors (64: the 4-vector register blocks; 80: 4 + 1; 72: 4
// and a partial 8), sequences longer than a query block (64) and a product slice (128 keys), not
// multiples of 16: forward and backward against the double references (the finite-difference
// cases above use head sizes under 16). Rows padded past the heads keep their bytes.
TEST(CpuAttentionTest, VectorTileShapesMatchTheAnalyticGradients) {
  struct Case {
    AttnShape s;
    AttnMode mode;
  };
  const std::vector<Case> cases = {
      {{2, 200, 4, 2, 64, 4 * 64 + 16, 2 * 64 + 16, 0, 0, 0}, {true, {}}},
      {{2, 200, 4, 2, 64, 4 * 64 + 16, 2 * 64 + 16, 0, 0, 0}, {true, RandomMask(2, 200, 1, 15)}},
      {{2, 200, 4, 4, 64, 4 * 64, 4 * 64, 0, 0, 0}, {false, TailMask(200, {130, 200})}},
      {{1, 150, 2, 1, 80, 2 * 80 + 16, 80 + 16, 0, 0, 0}, {true, {}}},
      {{1, 150, 2, 2, 72, 2 * 72 + 8, 2 * 72 + 8, 0, 0, 0}, {true, TailMask(150, {97})}},
  };
  auto be = MakeCpuBackend(2);
  for (const Case& c : cases) CheckAgainstAnalytic(be.get(), c.s, c.mode);
}

// ---- sliding windows (HF Mistral: query i sees key j only when i - j < window) ----

// Forward and backward against the double references and finite differences: window 1 (each
// query sees only itself), windows under a 16-key vector and under the 64-query block, a window
// crossing the block boundary at T = 70, windows of T and over T (no window), with GQA on fused
// rows, separate padded rows, key masks (the two combine: a query whose window holds only masked
// keys sees nothing) and bidirectional attention (the window then bounds the past only).
TEST(CpuAttentionTest, SlidingWindowForwardBackward) {
  const int B = 2, T = 9, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS;
  const AttnShape fused{B, T, NH, NKV, HS, W, W, 0, NH * HS, (NH + NKV) * HS};
  const AttnShape padded{B, T, NH, NKV, HS, NH * HS + 3, NKV * HS + 2, 1, 2, 0};
  for (int window : {1, 2, 3, 8, 9, 20}) {
    CheckAttention(fused, true, true, {true, {}, window});
    CheckAttention(padded, false, true, {true, {}, window});
  }
  // Masks: sequence 0 keeps keys 0, 5, 8 only, so with window 2 queries 2, 3, 4 and 7 see nothing.
  const std::vector<int32_t> sparse = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1};
  for (int window : {1, 2, 4}) {
    CheckAttention(padded, false, true, {true, sparse, window});
    CheckAttention(padded, false, true, {true, TailMask(T, {6, 2}), window});
    CheckAttention(padded, false, true, {false, RandomMask(B, T, 1, 17), window});
  }
  CheckAttention({1, 6, 4, 1, 2, 8, 2, 0, 0, 0}, false, true, {true, {}, 2});  // MQA
  // T = 70: query blocks of 64; windows 5 and 40 reach back across the block boundary.
  const int T2 = 70, NH2 = 2, NKV2 = 1, HS2 = 4, W2 = (NH2 + 2 * NKV2) * HS2;
  for (int window : {5, 40}) {
    CheckAttention({1, T2, NH2, NKV2, HS2, W2, W2, 0, NH2 * HS2, (NH2 + NKV2) * HS2}, true, true,
                   {true, {}, window});
    CheckAttention({2, T2, 2, 1, 4, 9, 5, 0, 0, 0}, false, true,
                   {true, RandomMask(2, T2, 0, 18), window});
  }
}

// The vector tiles with windows: HS 64 and 128, T not a multiple of the 64-query block or of 16,
// windows 1 (only the diagonal), 17 and 40 (under a block), 64 (a block), 100 and 150 (several
// blocks back; key tiles start past 0 and the first keys are skipped), 199 (T - 1) and 500 (over
// T), GQA and MHA, masks, bidirectional; forward and backward against the analytic gradients.
TEST(CpuAttentionTest, SlidingWindowVectorTilesMatchTheAnalyticGradients) {
  auto be = MakeCpuBackend(2);
  const AttnShape gqa64{2, 200, 4, 2, 64, 4 * 64 + 16, 2 * 64 + 16, 0, 0, 0};
  for (int window : {1, 17, 40, 64, 100, 150, 199, 500})
    CheckAgainstAnalytic(be.get(), gqa64, {true, {}, window});
  const AttnShape mha128{1, 150, 2, 2, 128, 2 * 128, 2 * 128, 0, 0, 0};
  for (int window : {1, 33, 100}) CheckAgainstAnalytic(be.get(), mha128, {true, {}, window});
  CheckAgainstAnalytic(be.get(), gqa64, {true, RandomMask(2, 200, 1, 19), 50});
  CheckAgainstAnalytic(be.get(), gqa64, {true, TailMask(200, {70, 200}), 90});
  CheckAgainstAnalytic(be.get(), {1, 150, 2, 1, 80, 2 * 80 + 16, 80 + 16, 0, 0, 0},
                       {true, {}, 30});
  CheckAgainstAnalytic(be.get(), {2, 200, 4, 4, 64, 4 * 64, 4 * 64, 0, 0, 0},
                       {false, TailMask(200, {130, 200}), 70});
}

// A window of T or more changes nothing (bit for bit: the same tiles run); a shorter window does
// change the output (the cases above would pass with the window ignored otherwise). Keys outside a
// query's window get exactly zero weight: huge k and v at key j leave every query outside
// [j, j + window) unchanged to the bit.
TEST(CpuAttentionTest, SlidingWindowEdges) {
  auto be = MakeCpuBackend(2);
  const int B = 2, T = 150, NH = 4, NKV = 2, HS = 64, qs = NH * HS, kvs = NKV * HS;
  auto q = RandVec(static_cast<size_t>(B * T * qs), 41, -1.5f, 1.5f);
  auto k = RandVec(static_cast<size_t>(B * T * kvs), 42, -1.5f, 1.5f);
  auto v = RandVec(static_cast<size_t>(B * T * kvs), 43);
  auto run = [&](const std::vector<float>& kk, const std::vector<float>& vv, int window,
                 DType operands) {
    std::vector<float> out(B * T * qs), lse(B * NH * T);
    be->AttentionForward(out.data(), lse.data(), q.data(), kk.data(), vv.data(), B, T, NH, NKV,
                         HS, qs, kvs, true, nullptr, operands, window);
    return out;
  };
  for (DType operands : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(operands == DType::kF32 ? "fp32" : "bf16");
    const auto none = run(k, v, 0, operands);
    EXPECT_EQ(run(k, v, T, operands), none) << "window T";
    EXPECT_EQ(run(k, v, T + 77, operands), none) << "window > T";
    EXPECT_NE(run(k, v, T - 1, operands), none) << "window T - 1 must drop key 0 of the last query";
    const int window = 30, j = 37;
    const auto base = run(k, v, window, operands);
    auto k2 = k, v2 = v;
    for (int b = 0; b < B; ++b) {
      for (int c = 0; c < kvs; ++c) {
        k2[(b * T + j) * kvs + c] = 1e4f;
        v2[(b * T + j) * kvs + c] = -3e4f;
      }
    }
    const auto moved = run(k2, v2, window, operands);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const bool sees = t >= j && t - j < window;
        const float* x = base.data() + (b * T + t) * qs;
        const float* y = moved.data() + (b * T + t) * qs;
        if (sees) {
          EXPECT_NE(std::vector<float>(x, x + qs), std::vector<float>(y, y + qs)) << "query " << t;
        } else {
          ASSERT_EQ(std::vector<float>(x, x + qs), std::vector<float>(y, y + qs))
              << "key " << j << " outside query " << t << "'s window changed it";
        }
      }
    }
  }
}

// Generation with a window: decoding position t against a cache of t + 1 rows equals row t of the
// full windowed forward over the same rows (for every t, so the window is reached, crossed and
// exceeded), GQA, cache rows wider than the heads; and it differs from decoding without a window
// once t >= window.
TEST(CpuAttentionTest, SlidingWindowDecodeEqualsTheForwardRow) {
  auto be = MakeCpuBackend(2);
  const int T = 40, NH = 4, NKV = 2, HS = 16, qs = NH * HS + 3, kvs = 2 * NKV * HS + 5;
  auto q = RandVec(static_cast<size_t>(T * qs), 51, -1.5f, 1.5f);
  auto kv = RandVec(static_cast<size_t>(T * kvs), 52, -1.5f, 1.5f);  // cache rows [k | v | gap]
  const float* k = kv.data();
  const float* v = kv.data() + NKV * HS;
  for (int window : {1, 7, 16, 39, 40, 100}) {
    SCOPED_TRACE("window " + std::to_string(window));
    std::vector<float> out(T * NH * HS), lse(NH * T);
    be->AttentionForward(out.data(), lse.data(), q.data(), k, v, 1, T, NH, NKV, HS, qs, kvs, true,
                         nullptr, DType::kF32, window);
    for (int t = 0; t < T; ++t) {
      std::vector<float> dec(NH * HS), full(NH * HS);
      be->AttentionDecode(dec.data(), q.data() + t * qs, k, v, 1, t + 1, T, NH, NKV, HS, qs, kvs,
                          window);
      ExpectClose(dec, ToDouble(std::vector<float>(out.begin() + t * NH * HS,
                                                   out.begin() + (t + 1) * NH * HS)),
                  1e-6, 1e-5, "decode t=" + std::to_string(t));
      be->AttentionDecode(full.data(), q.data() + t * qs, k, v, 1, t + 1, T, NH, NKV, HS, qs, kvs);
      if (t >= window) {
        EXPECT_NE(dec, full) << "t=" << t << ": the window changed nothing";
      }
    }
  }
}

TEST(CpuAttentionTest, BidirectionalForwardBackward) {
  const AttnMode bi{false, {}};
  const int B = 2, T = 5, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS;
  CheckAttention({B, T, NH, NKV, HS, W, W, 0, NH * HS, (NH + NKV) * HS}, true, true, bi);  // GQA
  CheckAttention({2, 5, 4, 2, 6, 4 * 6 + 3, 2 * 6 + 2, 1, 2, 0}, false, true, bi);
  CheckAttention({1, 6, 4, 1, 2, 8, 2, 0, 0, 0}, false, true, bi);  // MQA
  // T = 70: a full 64-query block and a partial one, each against all 70 keys.
  const int T2 = 70, NH2 = 2, NKV2 = 1, HS2 = 4, W2 = (NH2 + 2 * NKV2) * HS2;
  CheckAttention({1, T2, NH2, NKV2, HS2, W2, W2, 0, NH2 * HS2, (NH2 + NKV2) * HS2}, true, true, bi);
  CheckAttention({2, 64, 6, 3, 16, 96, 48, 0, 0, 0}, false, false, bi);
  CheckAttention({1, 130, 2, 1, 64, 128, 64, 0, 0, 0}, false, false, bi);
}

TEST(CpuAttentionTest, KeyMaskForwardBackward) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    // Random masks, sequence 1 fully masked; GQA on fused rows and on separate padded rows.
    const int B = 3, T = 6, NH = 4, NKV = 2, HS = 6, W = (NH + 2 * NKV) * HS;
    CheckAttention({B, T, NH, NKV, HS, W, W, 0, NH * HS, (NH + NKV) * HS}, true, true,
                   {causal, RandomMask(B, T, 1, 11)});
    CheckAttention({B, T, NH, NKV, HS, NH * HS + 3, NKV * HS + 2, 1, 2, 0}, false, true,
                   {causal, RandomMask(B, T, 1, 12)});
    CheckAttention({2, 7, 3, 3, 4, 13, 13, 0, 0, 1}, false, true,  // MHA, padded tails
                   {causal, TailMask(7, {4, 7})});
    CheckAttention({3, 6, 4, 1, 2, 8, 2, 0, 0, 0}, false, true,  // MQA, one empty sequence
                   {causal, TailMask(6, {1, 0, 5})});
    // T = 70 across the query blocks: padded tail and a random mask with an empty sequence.
    const int T2 = 70, NH2 = 2, NKV2 = 1, HS2 = 4, W2 = (NH2 + 2 * NKV2) * HS2;
    CheckAttention({1, T2, NH2, NKV2, HS2, W2, W2, 0, NH2 * HS2, (NH2 + NKV2) * HS2}, true, true,
                   {causal, TailMask(T2, {66})});
    CheckAttention({2, T2, 2, 1, 4, 9, 5, 0, 0, 0}, false, true,
                   {causal, RandomMask(2, T2, 0, 13)});
    // Larger, forward only.
    CheckAttention({2, 130, 4, 2, 64, 256, 128, 0, 0, 0}, false, false,
                   {causal, TailMask(130, {100, 3})});
    CheckAttention({2, 64, 6, 3, 16, 96, 48, 0, 0, 0}, false, false,
                   {causal, RandomMask(2, 64, 1, 14)});
  }
}

// bf16 operands (operand_type kBF16): against the fp32 kernels run on the same inputs rounded to
// bf16 (verified above against double references and finite differences). The score product is
// then exact up to fp32 accumulation order, so lse agrees to 1e-5; the probabilities are rounded
// to bf16 before P V (relative 2^-9 each, so |out - out32| <= 2^-9 max|v| = 3e-3 here, bound 4e-3);
// backward also rounds dout and dS: gradients within 2% of their largest magnitude. Masked keys
// keep exactly zero weight and gradient, and columns outside the heads stay untouched. Where the
// backend uses bf16 tiles (cpu::UseBf16Tiles: oneDNN's bf16 matmuls for bidirectional T >= 256,
// the CPU's own bf16 dot products (AVX512-BF16) elsewhere for an even head size) the outputs must
// differ from fp32's (the bf16 path ran); elsewhere the request computes in fp32 and must equal
// the fp32 kernels on the same (unrounded) inputs bit for bit.
void CheckBf16Attention(const AttnShape& s, const AttnMode& mode) {
  auto be = MakeCpuBackend(2);
  const int32_t* km = mode.mask.empty() ? nullptr : mode.mask.data();
  const int rows = s.B * s.T, C = s.NH * s.HS;
  const size_t qn = static_cast<size_t>(rows * s.q_stride),
               kvn = static_cast<size_t>(rows * s.kv_stride);
  auto q = RandVec(qn, 21, -1.5f, 1.5f), k = RandVec(kvn, 22, -1.5f, 1.5f), v = RandVec(kvn, 23);
  auto round16 = [](std::vector<float> x) {
    for (float& f : x) f = BF16ToF32(F32ToBF16(f));
    return x;
  };
  // The reference: the fp32 kernels on the rounded inputs where bf16 tiles run, else on the same
  // inputs (then everything must match bit for bit).
  const bool tiles = cpu::UseBf16Tiles(DType::kBF16, mode.causal, s.T, s.HS);
  const auto qr = tiles ? round16(q) : q, kr = tiles ? round16(k) : k, vr = tiles ? round16(v) : v;
  const std::string tag = "T=" + std::to_string(s.T) + (mode.causal ? " causal" : " bidir") +
                          (km != nullptr ? " masked" : "") +
                          (mode.window > 0 ? " window " + std::to_string(mode.window) : "");
  std::vector<float> out32(rows * C), lse32(s.B * s.NH * s.T), out16(rows * C, NAN),
      lse16(s.B * s.NH * s.T, NAN);
  be->AttentionForward(out32.data(), lse32.data(), qr.data() + s.q_off, kr.data() + s.k_off,
                       vr.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS, s.q_stride, s.kv_stride,
                       mode.causal, km, DType::kF32, mode.window);
  be->AttentionForward(out16.data(), lse16.data(), q.data() + s.q_off, k.data() + s.k_off,
                       v.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS, s.q_stride, s.kv_stride,
                       mode.causal, km, DType::kBF16, mode.window);
  if (tiles) {
    ExpectClose(lse16, ToDouble(lse32), 1e-5, 1e-5, "bf16 lse " + tag);
    ExpectClose(out16, ToDouble(out32), 0.0, 4e-3, "bf16 out " + tag);
    EXPECT_NE(out16, out32) << "bf16 tiles expected, but the output is fp32's " << tag;
  } else {
    EXPECT_EQ(out16, out32) << "fp32 fallback must be the fp32 kernel's output " << tag;
    EXPECT_EQ(lse16, lse32) << "fp32 fallback must be the fp32 kernel's lse " << tag;
  }

  auto R = RandVec(rows * C, 24);
  const float kSentinel = 12345.0f;
  std::vector<float> g32[3], g16[3];
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float>* g = pass == 0 ? g32 : g16;
    g[0].assign(qn, kSentinel);
    g[1].assign(kvn, kSentinel);
    g[2].assign(kvn, kSentinel);
    const std::vector<float>& qq = pass == 0 ? qr : q;
    const std::vector<float>& kk = pass == 0 ? kr : k;
    const std::vector<float>& vv = pass == 0 ? vr : v;
    be->AttentionBackward(g[0].data() + s.q_off, g[1].data() + s.k_off, g[2].data() + s.v_off,
                          R.data(), (pass == 0 ? out32 : out16).data(),
                          (pass == 0 ? lse32 : lse16).data(), qq.data() + s.q_off,
                          kk.data() + s.k_off, vv.data() + s.v_off, s.B, s.T, s.NH, s.NKV, s.HS,
                          s.q_stride, s.kv_stride, mode.causal, km,
                          pass == 0 ? DType::kF32 : DType::kBF16, mode.window);
  }
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    double mx = 0.0;
    for (float x : g32[i])
      if (x != kSentinel) mx = std::max(mx, static_cast<double>(std::abs(x)));
    ASSERT_GT(mx, 0.0) << names[i] << " " << tag;
    for (size_t j = 0; j < g32[i].size(); ++j) {
      if (g32[i][j] == kSentinel) {
        ASSERT_EQ(g16[i][j], kSentinel) << names[i] << " touched outside the heads, " << tag;
      }
    }
    if (tiles) {
      ExpectClose(g16[i], ToDouble(g32[i]), 0.0, 0.02 * mx,
                  std::string("bf16 ") + names[i] + " " + tag);
    } else {
      EXPECT_EQ(g16[i], g32[i]) << "fp32 fallback " << names[i] << " " << tag;
    }
  }
  if (km != nullptr) {  // masked keys: dk = dv = 0 exactly, also in the rounded-up tile keys
    const int kc = s.NKV * s.HS;
    for (int r = 0; r < rows; ++r) {
      if (km[r] != 0) continue;
      for (int c = 0; c < kc; ++c) {
        ASSERT_EQ(g16[1][s.k_off + r * s.kv_stride + c], 0.0f) << "bf16 dk, masked row " << r;
        ASSERT_EQ(g16[2][s.v_off + r * s.kv_stride + c], 0.0f) << "bf16 dv, masked row " << r;
      }
    }
  }
}

// Every shape, bidirectional and causal, with the tiles this run chooses.
void CheckBf16AttentionShapes() {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    // BERT-like heads (HS 64) across three 128-query blocks, padded tails (260 keys: the tile
    // spans 320; 3 keys: 64) and no mask.
    CheckBf16Attention({2, 300, 2, 2, 64, 128, 128, 0, 0, 0}, {causal, TailMask(300, {260, 3})});
    CheckBf16Attention({1, 256, 2, 2, 64, 128, 128, 0, 0, 0}, {causal, {}});
    // GQA on separate padded rows, a random mask with an empty sequence.
    CheckBf16Attention({2, 270, 4, 2, 16, 4 * 16 + 3, 2 * 16 + 2, 1, 2, 0},
                       {causal, RandomMask(2, 270, 1, 15)});
    // Short sequences: the dot-product tiles where the CPU has them, else fp32.
    CheckBf16Attention({2, 70, 4, 2, 16, 4 * 16 + 3, 2 * 16 + 2, 1, 2, 0},
                       {causal, RandomMask(2, 70, 1, 16)});
    // The tiny configs' shape (two 64-query blocks); an odd T whose last block has one query (odd
    // query and key counts: half-empty pairs); a head size of 24 (a partial 16-column vector)
    // with a padded tail; an odd head size (no pairs: fp32 or oneDNN).
    CheckBf16Attention({2, 128, 4, 4, 64, 256, 256, 0, 0, 0}, {causal, {}});
    CheckBf16Attention({1, 129, 2, 1, 64, 128, 64, 0, 0, 0}, {causal, {}});
    CheckBf16Attention({2, 67, 3, 3, 24, 3 * 24 + 1, 3 * 24 + 1, 1, 0, 0},
                       {causal, TailMask(67, {45, 67})});
    CheckBf16Attention({1, 40, 2, 2, 15, 30, 30, 0, 0, 0}, {causal, {}});
    // Sliding windows (checked against the double references above in fp32): under a block, over
    // a bf16 query block (128) and under a 16-key vector, with masks, GQA, HS 64 and 128.
    CheckBf16Attention({2, 300, 2, 2, 64, 128, 128, 0, 0, 0},
                       {causal, TailMask(300, {260, 3}), 100});
    CheckBf16Attention({1, 270, 4, 2, 128, 4 * 128 + 3, 2 * 128 + 2, 1, 2, 0}, {causal, {}, 150});
    CheckBf16Attention({2, 270, 4, 2, 16, 4 * 16 + 3, 2 * 16 + 2, 1, 2, 0},
                       {causal, RandomMask(2, 270, 1, 15), 9});
    // (Window 2, not 1: a single visible key makes out = v and dS = 0 exactly, nothing to compare.)
    CheckBf16Attention({2, 67, 3, 3, 24, 3 * 24 + 1, 3 * 24 + 1, 1, 0, 0},
                       {causal, TailMask(67, {45, 67}), 2});
    CheckBf16Attention({1, 40, 2, 2, 15, 30, 30, 0, 0, 0}, {causal, {}, 5});  // odd head size
  }
}

// Both bf16 paths: the CPU's dot-product tiles (where it has AVX512-BF16), then, with them turned
// off, oneDNN's bf16 matmuls (bidirectional T >= 256) and the fp32 fallback elsewhere. oneDNN's
// bf16 tiles run on every AVX-512 CPU here (its emulation where the CPU has no bf16 arithmetic,
// which a job would not take: cpu::Bf16GemmNative).
TEST(CpuAttentionTest, Bf16OperandsForwardBackward) {
  cpu::SetGemmLibraryForTesting(true);  // oneDNN where the build has it
  const int native_before = cpu::SetBf16GemmNativeForTesting(1);
  for (bool dot_products : {true, false}) {
    SCOPED_TRACE(dot_products ? "dot-product tiles where the CPU has them" : "no dot products");
    cpu::SetBf16DotProductsForTesting(dot_products);
    if (cpu::Bf16TileProductsNative() || cpu::Bf16DotProductsNative()) {
      EXPECT_TRUE(cpu::UseBf16Tiles(DType::kBF16, false, 300, 64))
          << "bert-like shapes use bf16 tiles";
    }
    CheckBf16AttentionShapes();
  }
  cpu::SetBf16DotProductsForTesting(true);
  cpu::SetBf16GemmNativeForTesting(native_before);
}

// Where the CPU has AVX512-BF16, every bf16 request with an even head size runs the dot-product
// tiles (causal, short, long); an odd head size cannot pair its elements and does not.
TEST(CpuAttentionTest, Bf16DotProductTilesWhereTheCpuHasThem) {
  const bool dp = cpu::Bf16DotProductsNative();
  std::printf("AVX512-BF16 dot products: %s\n", dp ? "yes" : "no (the other paths checked)");
  EXPECT_EQ(cpu::UseBf16Tiles(DType::kBF16, true, 128, 64), dp);
  EXPECT_EQ(cpu::UseBf16Tiles(DType::kBF16, true, 1024, 64), dp);
  EXPECT_EQ(cpu::UseBf16Tiles(DType::kBF16, false, 70, 16), dp);
  EXPECT_FALSE(cpu::UseBf16Tiles(DType::kBF16, true, 128, 15));
  EXPECT_FALSE(cpu::UseBf16Tiles(DType::kF32, true, 128, 64));
  EXPECT_FALSE(cpu::UseBf16Tiles(DType::kF16, true, 128, 64));
}

// The 16-bit entry points (a 16-bit job's q, k, v, out and dout) give exactly the bits of
// AttentionForward/Backward with operand type = the 16-bit type on the widened tensors: bf16 on the
// CPU's own dot products reads the bits as they are (where the CPU has them), fp16 and bf16
// elsewhere widen. Fused qkv rows (GQA) and separate ones with a gap; causal with a tail mask,
// a window, and bidirectional.
TEST(CpuAttentionTest, SixteenBitTensorsEqualTheWidenedOperands) {
  const int B = 2, T = 37, NH = 4, NKV = 2, HS = 64, QW = NH * HS, KW = NKV * HS;
  auto widen = [](const std::vector<uint16_t>& h, DType t) {
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = t == DType::kBF16 ? BF16ToF32(h[i]) : F16ToF32(h[i]);
    return f;
  };
  auto round16 = [](const std::vector<float>& f, DType t) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = t == DType::kBF16 ? F32ToBF16(f[i]) : F32ToF16(f[i]);
    return h;
  };
  std::vector<int32_t> mask(B * T, 1);
  for (int j = T - 9; j < T; ++j) mask[j] = 0;  // sequence 0's padded tail
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int layout = 0; layout < 2; ++layout) {
      for (int mode = 0; mode < 3; ++mode) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " layout " + std::to_string(layout) + " mode " +
                     std::to_string(mode));
        const bool causal = mode != 2;
        const int window = mode == 1 ? 11 : 0;
        const int32_t* km = mode == 0 ? mask.data() : nullptr;
        const int qs = layout == 0 ? QW + 2 * KW : QW + 3, kvs = layout == 0 ? qs : KW + 3;
        const auto q16 = round16(RandVec(B * T * qs, 31), t);
        const auto k16 = layout == 0 ? q16 : round16(RandVec(B * T * kvs, 32), t);
        const auto v16 = layout == 0 ? q16 : round16(RandVec(B * T * kvs, 33), t);
        const int ko = layout == 0 ? QW : 0, vo = layout == 0 ? QW + KW : 0;
        const auto qf = widen(q16, t), kf = widen(k16, t), vf = widen(v16, t);
        const auto dout16 = round16(RandVec(B * T * QW, 34), t);
        const auto doutf = widen(dout16, t);
        // Reference: the fp32 entry points on the widened tensors, out rounded as Cast.
        std::vector<float> out_ref(B * T * QW), lse_ref(B * NH * T);
        cpu::AttentionForward(out_ref.data(), lse_ref.data(), qf.data(), kf.data() + ko,
                              vf.data() + vo, B, T, NH, NKV, HS, qs, kvs, causal, km, t, window, 2);
        const auto out_ref16 = round16(out_ref, t);
        std::vector<uint16_t> out16(B * T * QW);
        std::vector<float> lse(B * NH * T);
        cpu::AttentionForward16Bit(out16.data(), lse.data(), q16.data(), k16.data() + ko,
                                   v16.data() + vo, t, B, T, NH, NKV, HS, qs, kvs, causal, km,
                                   window, 2, nullptr);
        EXPECT_EQ(out16, out_ref16);
        EXPECT_EQ(lse, lse_ref);
        const auto outw = widen(out16, t);
        std::vector<float> dq_ref(B * T * qs, 7.0f), dk_ref(B * T * kvs, 7.0f), dv_ref = dk_ref;
        float* dk_r = layout == 0 ? dq_ref.data() + ko : dk_ref.data();
        float* dv_r = layout == 0 ? dq_ref.data() + vo : dv_ref.data();
        cpu::AttentionBackward(dq_ref.data(), dk_r, dv_r, doutf.data(), outw.data(), lse.data(),
                               qf.data(), kf.data() + ko, vf.data() + vo, B, T, NH, NKV, HS, qs,
                               kvs, causal, km, t, window, 2);
        std::vector<float> dq(B * T * qs, 7.0f), dk(B * T * kvs, 7.0f), dv = dk;
        float* dk_p = layout == 0 ? dq.data() + ko : dk.data();
        float* dv_p = layout == 0 ? dq.data() + vo : dv.data();
        cpu::AttentionBackward16Bit(dq.data(), dk_p, dv_p, dout16.data(), out16.data(), lse.data(),
                                    q16.data(), k16.data() + ko, v16.data() + vo, t, B, T, NH,
                                    NKV, HS, qs, kvs, causal, km, window, 2, nullptr);
        EXPECT_EQ(dq, dq_ref);
        EXPECT_EQ(dk, dk_ref);
        EXPECT_EQ(dv, dv_ref);
      }
    }
  }
}

// Rotary embedding reference: inv_freq and angles in fp32 as HF forms them, rotation in double.
void RefRope(std::vector<double>* x, int B, int T, int NHd, int HS, int stride, float theta,
             bool inverse) {
  const int half = HS / 2;
  for (int r = 0; r < B * T; ++r) {
    const int t = r % T;
    for (int h = 0; h < NHd; ++h) {
      for (int i = 0; i < half; ++i) {
        float inv = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(HS));
        float ang = static_cast<float>(t) * inv;
        const double c = std::cos(static_cast<double>(ang)),
                     sn = std::sin(static_cast<double>(ang));
        double& a = (*x)[r * stride + h * HS + i];
        double& b = (*x)[r * stride + h * HS + half + i];
        const double a0 = a, b0 = b;
        if (!inverse) {
          a = a0 * c - b0 * sn;
          b = b0 * c + a0 * sn;
        } else {
          a = a0 * c + b0 * sn;
          b = b0 * c - a0 * sn;
        }
      }
    }
  }
}

TEST(CpuRopeTest, ForwardInverseAndTransposeProperty) {
  auto be = MakeCpuBackend(2);
  struct Case {
    int B, T, NHd, HS, stride;
    float theta;
  };
  // The backend keeps its cos/sin table between calls: the same shape with another theta, and
  // the first case again, must each get their own angles.
  for (Case c : {Case{2, 5, 4, 6, 30, 10000.0f}, Case{2, 300, 2, 64, 130, 500000.0f},
                 Case{2, 5, 4, 6, 30, 500.0f}, Case{2, 5, 4, 6, 30, 10000.0f}}) {
    const size_t n = static_cast<size_t>(c.B * c.T * c.stride);
    auto x = RandVec(n, 5);
    auto want = ToDouble(x);
    RefRope(&want, c.B, c.T, c.NHd, c.HS, c.stride, c.theta, false);
    auto y = x;
    be->Rope(y.data(), c.B, c.T, c.NHd, c.HS, c.stride, c.theta, false);
    ExpectClose(y, want, 0.0, 1e-6, "rope forward HS=" + std::to_string(c.HS));  // also padding
    // inverse(forward(x)) == x.
    be->Rope(y.data(), c.B, c.T, c.NHd, c.HS, c.stride, c.theta, true);
    ExpectClose(y, ToDouble(x), 0.0, 2e-6, "rope inverse");
    if (c.T > 10) continue;
    // Backward: d/dx sum(R * rope(x)) (finite differences) == rope_inverse(R).
    auto R = RandVec(n, 6);
    auto num = NumGrad(
        [&](const std::vector<double>& xx) {
          auto yy = xx;
          RefRope(&yy, c.B, c.T, c.NHd, c.HS, c.stride, c.theta, false);
          return DotD(yy, ToDouble(R));
        },
        ToDouble(x));
    // Padding columns of the rope: identity there, so their gradient is R itself.
    be->Rope(R.data(), c.B, c.T, c.NHd, c.HS, c.stride, c.theta, true);
    ExpectClose(R, num, 1e-5, 1e-6, "rope backward");
  }
}

// losses and d(grad_scale * sum(losses))/dlogits in double; padded columns ignored.
double RefCe(const std::vector<double>& logits, const std::vector<int32_t>& tg, int N, int V,
             int Vp, std::vector<double>* losses) {
  losses->assign(N, 0.0);
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    if (tg[n] < 0) continue;
    double mx = -1e300, sum = 0.0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, logits[n * Vp + i]);
    for (int i = 0; i < V; ++i) sum += std::exp(logits[n * Vp + i] - mx);
    (*losses)[n] = std::log(sum) + mx - logits[n * Vp + tg[n]];
    total += (*losses)[n];
  }
  return total;
}

TEST(CpuSoftmaxCrossEntropyTest, LossesGradientIgnoredRowsPaddedVocab) {
  auto be = MakeCpuBackend(2);
  const int N = 7, V = 13, Vp = 16;
  auto logits = RandVec(N * Vp, 7, -5.0f, 5.0f);
  logits[2 * Vp + 4] = 80.0f;  // a large logit: needs the max subtraction
  logits[5 * Vp + 1] = -60.0f;
  std::vector<int32_t> tg = {3, -1, 4, 12, 0, 1, -1};
  std::vector<double> want;
  RefCe(ToDouble(logits), tg, N, V, Vp, &want);
  std::vector<float> losses(N, 99.0f);
  auto copy = logits;
  be->SoftmaxCrossEntropy(copy.data(), losses.data(), tg.data(), N, V, Vp, 0.5f, false, nullptr);
  ExpectClose(losses, want, 1e-6, 1e-6, "ce losses (no grad)");
  EXPECT_EQ(copy, logits) << "compute_grad=false must leave the logits alone";
  auto num = NumGrad(
      [&](const std::vector<double>& l) {
        std::vector<double> ls;
        return 0.5 * RefCe(l, tg, N, V, Vp, &ls);
      },
      ToDouble(logits));
  for (int n = 0; n < N; ++n) {
    for (int i = V; i < Vp; ++i) num[n * Vp + i] = 0.0;  // padded columns: 0 gradient
  }
  std::fill(losses.begin(), losses.end(), 99.0f);
  be->SoftmaxCrossEntropy(copy.data(), losses.data(), tg.data(), N, V, Vp, 0.5f, true, nullptr);
  ExpectClose(losses, want, 1e-6, 1e-6, "ce losses");
  ExpectClose(copy, num, 1e-5, 1e-7, "ce dlogits");
  for (int i = 0; i < Vp; ++i) EXPECT_EQ(copy[1 * Vp + i], 0.0f) << "ignored row, col " << i;
}

TEST(CpuSoftmaxCrossEntropyTest, GptVocabRows) {
  auto be = MakeCpuBackend(2);
  const int N = 9, V = 50257, Vp = 50304;
  auto logits = RandVec(static_cast<size_t>(N) * Vp, 8, -10.0f, 10.0f);
  std::vector<int32_t> tg = {0, 50256, 17, -1, 30000, 5, 6, 7, 8};
  std::vector<double> want;
  RefCe(ToDouble(logits), tg, N, V, Vp, &want);
  std::vector<float> losses(N);
  auto l64 = ToDouble(logits);
  be->SoftmaxCrossEntropy(logits.data(), losses.data(), tg.data(), N, V, Vp, 1.0f, true, nullptr);
  ExpectClose(losses, want, 1e-6, 1e-6, "ce losses V=50257");
  // Gradient rows: softmax - onehot, each row sums to 0.
  for (int n = 0; n < N; ++n) {
    if (tg[n] < 0) continue;
    double sum = 0.0;
    for (int i = 0; i < Vp; ++i) sum += logits[static_cast<size_t>(n) * Vp + i];
    EXPECT_NEAR(sum, 0.0, 1e-5) << "row " << n;
    // loss = lse - logit[target], so softmax_i = exp(logit_i - loss - logit[target]).
    const double p = std::exp(l64[n * Vp + 100] - want[n] - l64[n * Vp + tg[n]]);
    EXPECT_NEAR(logits[n * Vp + 100], (tg[n] == 100 ? p - 1 : p), 1e-9 + 1e-5 * p);
  }
}

// The 16-bit gradient (grad16): exactly the bits of the in-place fp32 gradient rounded by Cast,
// the same losses, ignored rows and padded columns zero, logits left unchanged; for bf16 and f16,
// a GPT-2-wide vocabulary (several 4096-column blocks, targets in the first, a middle and the last
// block) and a small padded one. Against the in-place path, which the tests above check against
// double-precision references and finite differences.
TEST(CpuSoftmaxCrossEntropyTest, RoundedGradientEqualsInPlaceThenCast) {
  auto be = MakeCpuBackend(2);
  struct Shape {
    int N, V, Vp;
    std::vector<int32_t> tg;
  };
  const Shape shapes[] = {{7, 13, 16, {3, -1, 4, 12, 0, 1, -1}},
                          {9, 50257, 50304, {0, 50256, 4095, -1, 4096, 30000, 5, 8191, 12288}}};
  for (const Shape& sh : shapes) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      const size_t n = static_cast<size_t>(sh.N) * sh.Vp;
      const auto logits = RandVec(n, 11, -10.0f, 10.0f);
      auto inplace = logits;
      std::vector<float> want_losses(sh.N), losses(sh.N, 99.0f);
      be->SoftmaxCrossEntropy(inplace.data(), want_losses.data(), sh.tg.data(), sh.N, sh.V, sh.Vp,
                              0.25f, true, nullptr);
      std::vector<uint16_t> want(n), got(n, 0xabcd);
      be->Cast(want.data(), t, inplace.data(), DType::kF32, static_cast<int64_t>(n));
      auto kept = logits;
      be->SoftmaxCrossEntropy(kept.data(), losses.data(), sh.tg.data(), sh.N, sh.V, sh.Vp, 0.25f,
                              true, nullptr, got.data(), t);
      const std::string what = std::string(DTypeName(t)) + " V=" + std::to_string(sh.V);
      EXPECT_EQ(losses, want_losses) << what;
      EXPECT_EQ(kept, logits) << what << ": the logits are only read on the CPU";
      size_t differ = 0, nonzero = 0;
      for (size_t i = 0; i < n; ++i) {
        differ += got[i] != want[i];
        nonzero += got[i] != 0;
      }
      EXPECT_EQ(differ, 0u) << what << ": elements whose bits differ from in place + Cast";
      // Not vacuous: every kept row's target has gradient (p - 1) * 0.25 != 0 (f16 flushes
      // many small probabilities to 0, bf16 few).
      const auto kept_rows = std::count_if(sh.tg.begin(), sh.tg.end(), [](int32_t v) { return v >= 0; });
      EXPECT_GE(nonzero, static_cast<size_t>(kept_rows) * (t == DType::kBF16 ? sh.V / 2 : 1)) << what;
      for (int r = 0; r < sh.N; ++r) {
        const int first_zero = sh.tg[r] < 0 ? 0 : sh.V;  // ignored rows whole, others' padding
        for (int i = first_zero; i < sh.Vp; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(r) * sh.Vp + i], 0) << what << " row " << r << " col " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace traind::engine
