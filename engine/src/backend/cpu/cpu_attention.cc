// Self-attention on the CPU, flash-style: no (T,T) matrix is kept. Work goes in query blocks of
// up to kQBlock rows against the keys 0..(last query of the block) when causal, else against all
// T keys; each thread keeps two (kQBlock, T) scratch tiles. A key padding mask (key_mask[b*T+j]
// == 0: key j of sequence b is not attended) zeroes those keys' probabilities exactly, and the
// keys after a sequence's last visible one (a padded tail) are left out of the products; a query
// with no visible key gets out = 0, lse = 0 and no gradient. The products are single-threaded library GEMMs per tile
// (Q K^T, P V, dO V^T, dS K, dS^T Q, P^T dO), threads split (b, head, block) in the forward and
// (b, kv head) in the backward, so each thread owns the dk/dv rows it accumulates (deterministic).
// Forward saves lse (log-sum-exp of the scaled scores per query); backward recomputes P from it.
// GQA: query head h reads kv head h / (NH/NKV).
// bf16 operands (operand_type kBF16, where oneDNN has native bf16 kernels): q, k, v (and dout in
// backward) are rounded once per call into per-head packed bf16 copies, the probabilities and dS
// per tile; every product is a oneDNN bf16 matmul with fp32 accumulation into fp32 tiles, so the
// softmax, lse, D and the dk/dv sums stay fp32 (PyTorch autocast's attention). Query blocks of
// kQBlock16 rows; a tile's keys are rounded up to a multiple of kKeyQuantum (the extra keys are
// masked or past the causal limit, so they get exactly zero weight) to bound the distinct GEMM
// shapes oneDNN compiles when sequences have different padded lengths.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"

namespace traind::engine::cpu {
namespace {

constexpr int64_t kQBlock = 64;
constexpr int64_t kQBlock16 = 128;
constexpr int64_t kKeyQuantum = 64;

// Row i of a score tile holds query t = t0 + i against keys 0..n-1; only keys j < valid may be
// attended (causal: valid = t + 1), and of those only the ones with km[j] != 0 when km is not
// null. In place: s -> softmax probabilities (exactly 0 where masked); returns the lse (0 when no
// key is visible, the row then all zeros).
TRAIND_CPU_CLONES float SoftmaxRow(float* s, int64_t valid, int64_t n, const int32_t* km) {
  float mx = -INFINITY;
  if (km == nullptr) {
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
  } else {
    for (int64_t j = 0; j < valid; ++j)
      if (km[j] != 0) mx = std::max(mx, s[j]);
  }
  if (mx == -INFINITY) {  // every key masked (scores are finite otherwise)
    for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
    return 0.0f;
  }
  float sum = 0.0f;
  if (km == nullptr) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) {
      const float e = ExpF(s[j] - mx);
      s[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) {
      const float e = km[j] != 0 ? ExpF(s[j] - mx) : 0.0f;
      s[j] = e;
      sum += e;
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
  for (int64_t j = valid; j < n; ++j) s[j] = 0.0f;
  return mx + std::log(sum);
}

// p = exp(s - lse) on the visible keys (0 elsewhere); ds = p * (dp - D) * scale, in place in dp.
TRAIND_CPU_CLONES void GradRow(float* s, float* dp, float lse, float D, float scale, int64_t valid,
                               int64_t n, const int32_t* km) {
  if (km == nullptr) {
    for (int64_t j = 0; j < valid; ++j) {
      const float p = ExpFlushF(s[j] - lse);
      s[j] = p;
      dp[j] = p * (dp[j] - D) * scale;
    }
  } else {
    for (int64_t j = 0; j < valid; ++j) {
      const float p = km[j] != 0 ? ExpFlushF(s[j] - lse) : 0.0f;
      s[j] = p;
      dp[j] = p * (dp[j] - D) * scale;
    }
  }
  for (int64_t j = valid; j < n; ++j) {
    s[j] = 0.0f;
    dp[j] = 0.0f;
  }
}

// 1 + the last visible key of a sequence's mask (0 when none): the keys past it (a padded tail)
// are left out of the tile products.
int64_t KeyEnd(const int32_t* km, int64_t T) {
  if (km == nullptr) return T;
  int64_t end = T;
  while (end > 0 && km[end - 1] == 0) --end;
  return end;
}

TRAIND_CPU_CLONES float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// SoftmaxRow, then the row's probabilities in bf16 into p16 (zeros past `valid`).
float SoftmaxRow16(float* s, int64_t valid, int64_t n, const int32_t* km, uint16_t* p16) {
  const float lse = SoftmaxRow(s, valid, n, km);
  F32ToBf16Span(p16, s, n);
  return lse;
}

// GradRow, then P and dS in bf16 into p16 and ds16.
void GradRow16(float* s, float* dp, float lse, float D, float scale, int64_t valid, int64_t n,
               const int32_t* km, uint16_t* p16, uint16_t* ds16) {
  GradRow(s, dp, lse, D, scale, valid, n, km);
  F32ToBf16Span(p16, s, n);
  F32ToBf16Span(ds16, dp, n);
}

// bf16 (NH heads) copies of the rows of x (B*T rows, stride `stride`, head h at h*HS), packed
// head-major: dst[((b*NH + h)*T + t)*HS + e].
void PackHeads16(uint16_t* dst, const float* x, int64_t B, int64_t T, int64_t NH, int64_t HS,
                 int64_t stride, int nt) {
  const int64_t rows = B * T;
  const int threads = rows * NH * HS < 65536 ? 1 : nt;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / T, t = r % T;
    for (int64_t h = 0; h < NH; ++h)
      F32ToBf16Span(dst + ((b * NH + h) * T + t) * HS, x + r * stride + h * HS, HS);
  }
}

// One tile product with bf16 operands and fp32 C on the calling thread (C = alpha op(A) op(B) +
// beta C, row-major as Sgemm), through oneDNN; a shape it refuses is widened into fp32 scratch.
void Gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* a,
            int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (DnnlGemm16(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, DType::kBF16, DType::kF32,
                 1)) {
    return;
  }
  static thread_local std::vector<float> wa, wb;
  auto widen = [](std::vector<float>* w, const uint16_t* x, int64_t rows, int64_t cols,
                  int64_t ld) {
    w->resize(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) (*w)[i * cols + j] = BF16ToF32(x[i * ld + j]);
  };
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  widen(&wa, a, ar, ac, lda);
  widen(&wb, b, br, bc, ldb);
  Sgemm(ta, tb, M, N, K, alpha, wa.data(), ac, wb.data(), bc, beta, c, ldc, 1);
}

// Query rows per bf16 tile: 128 (fewer, larger products) unless causal, where a block's keys end at
// its last query and 64-row blocks skip more of the masked upper triangle (as the fp32 path).
int64_t QueryBlock16(bool causal) { return causal ? kQBlock16 / 2 : kQBlock16; }

// Where the bf16 tiles pay: measured on the 2-core AVX512-BF16 VM (1 thread, HS 64), bidirectional
// T=512 (bert) runs 1.45x faster than fp32 forward and backward; causal tiles at T=128..1024 and
// short sequences gain nothing (the conversions and per-product calls cost what the bf16 products
// save), so they stay fp32 (operand_type is a permission).

// Keys a bf16 tile spans: the visible ones rounded up to kKeyQuantum (never past T).
int64_t KeysForTile(int64_t visible, int64_t T) {
  return std::min(T, (visible + kKeyQuantum - 1) / kKeyQuantum * kKeyQuantum);
}

void AttentionForward16(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                        int64_t q_stride, int64_t kv_stride, bool causal,
                        const int32_t* key_mask, int nt) {
  const int64_t group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  static thread_local std::vector<uint16_t> pack;  // q, k, v in bf16, packed per head
  const int64_t qn = B * NH * T * HS, kn = B * NKV * T * HS;
  pack.resize(static_cast<size_t>(qn + 2 * kn));
  uint16_t* q16 = pack.data();
  uint16_t* k16 = q16 + qn;
  uint16_t* v16 = k16 + kn;
  PackHeads16(q16, q, B, T, NH, HS, q_stride, nt);
  PackHeads16(k16, k, B, T, NKV, HS, kv_stride, nt);
  PackHeads16(v16, v, B, T, NKV, HS, kv_stride, nt);
  const int64_t qblock = QueryBlock16(causal);
  const int64_t nblocks = (T + qblock - 1) / qblock;
  const int64_t items = B * NH * nblocks;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(nt, items)))
  {
    static thread_local std::vector<float> tile;    // (kQBlock16, T) scores / probabilities
    static thread_local std::vector<uint16_t> p16;  // the probabilities in bf16
    tile.resize(static_cast<size_t>(kQBlock16 * T));
    p16.resize(static_cast<size_t>(kQBlock16 * T));
    float* S = tile.data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t blk = nblocks - 1 - it % nblocks, bh = it / nblocks;
      const int64_t b = bh / NH, h = bh % NH, kvh = h / group;
      const int64_t t0 = blk * qblock, t1 = std::min(T, t0 + qblock), nq = t1 - t0;
      const uint16_t* qb = q16 + ((b * NH + h) * T + t0) * HS;
      const uint16_t* kb = k16 + (b * NKV + kvh) * T * HS;
      const uint16_t* vb = v16 + (b * NKV + kvh) * T * HS;
      const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
      const int64_t visible = std::min(causal ? t1 : T, KeyEnd(km, T));
      float* lse_row = lse + (b * NH + h) * T + t0;
      float* ob = out + (b * T + t0) * C + h * HS;
      if (visible == 0) {  // no visible key at all
        for (int64_t i = 0; i < nq; ++i) {
          std::fill_n(ob + i * C, HS, 0.0f);
          lse_row[i] = 0.0f;
        }
        continue;
      }
      const int64_t nk = KeysForTile(visible, T);
      // S(nq, nk) = scale * Q_blk K^T; P = softmax; O_blk(nq, HS) = P V.
      Gemm16(false, true, nq, nk, HS, scale, qb, HS, kb, HS, 0.0f, S, nk);
      for (int64_t i = 0; i < nq; ++i) {
        lse_row[i] = SoftmaxRow16(S + i * nk, std::min(causal ? t0 + i + 1 : T, visible), nk, km,
                                  p16.data() + i * nk);
      }
      Gemm16(false, false, nq, HS, nk, 1.0f, p16.data(), nk, vb, HS, 0.0f, ob, C);
    }
  }
}

void AttentionBackward16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal,
                         const int32_t* key_mask, int nt) {
  const int64_t group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  static thread_local std::vector<uint16_t> pack;  // q, k, v, dout in bf16, packed per head
  const int64_t qn = B * NH * T * HS, kn = B * NKV * T * HS;
  pack.resize(static_cast<size_t>(2 * qn + 2 * kn));
  uint16_t* q16 = pack.data();
  uint16_t* k16 = q16 + qn;
  uint16_t* v16 = k16 + kn;
  uint16_t* do16 = v16 + kn;
  PackHeads16(q16, q, B, T, NH, HS, q_stride, nt);
  PackHeads16(k16, k, B, T, NKV, HS, kv_stride, nt);
  PackHeads16(v16, v, B, T, NKV, HS, kv_stride, nt);
  PackHeads16(do16, dout, B, T, NH, HS, C, nt);
  const int64_t qblock = QueryBlock16(causal);
  const int64_t nblocks = (T + qblock - 1) / qblock;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(nt, B * NKV)))
  {
    static thread_local std::vector<float> tiles;       // P and dP/dS, (kQBlock16, T) each
    static thread_local std::vector<uint16_t> tiles16;  // the same rounded to bf16
    tiles.resize(static_cast<size_t>(2 * kQBlock16 * T));
    tiles16.resize(static_cast<size_t>(2 * kQBlock16 * T));
    float* P = tiles.data();
    float* dS = P + kQBlock16 * T;
    uint16_t* P16 = tiles16.data();
    uint16_t* dS16 = P16 + kQBlock16 * T;
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < B * NKV; ++bk) {
      const int64_t b = bk / NKV, kvh = bk % NKV;
      const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
      const int64_t key_end = KeyEnd(km, T);
      const uint16_t* kb = k16 + (b * NKV + kvh) * T * HS;
      const uint16_t* vb = v16 + (b * NKV + kvh) * T * HS;
      float* dkb = dk + b * T * kv_stride + kvh * HS;
      float* dvb = dv + b * T * kv_stride + kvh * HS;
      for (int64_t t = 0; t < T; ++t) {
        std::fill_n(dkb + t * kv_stride, HS, 0.0f);
        std::fill_n(dvb + t * kv_stride, HS, 0.0f);
      }
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t blk = 0; blk < nblocks; ++blk) {
          const int64_t t0 = blk * qblock, t1 = std::min(T, t0 + qblock), nq = t1 - t0;
          const uint16_t* qb = q16 + ((b * NH + h) * T + t0) * HS;
          const uint16_t* dob16 = do16 + ((b * NH + h) * T + t0) * HS;
          const float* dob = dout + (b * T + t0) * C + h * HS;
          const float* ob = out + (b * T + t0) * C + h * HS;
          const float* lse_row = lse + (b * NH + h) * T + t0;
          const int64_t visible = std::min(causal ? t1 : T, key_end);
          if (visible == 0) {  // no visible key: dq = 0, nothing for dk, dv
            for (int64_t i = 0; i < nq; ++i)
              std::fill_n(dq + (b * T + t0 + i) * q_stride + h * HS, HS, 0.0f);
            continue;
          }
          const int64_t nk = KeysForTile(visible, T);
          // P = exp(scale * Q K^T - lse); dP = dO V^T; dS = P (dP - D) scale (fp32 tiles).
          Gemm16(false, true, nq, nk, HS, scale, qb, HS, kb, HS, 0.0f, P, nk);
          Gemm16(false, true, nq, nk, HS, 1.0f, dob16, HS, vb, HS, 0.0f, dS, nk);
          for (int64_t i = 0; i < nq; ++i) {
            const float D = Dot(dob + i * C, ob + i * C, HS);
            GradRow16(P + i * nk, dS + i * nk, lse_row[i], D, scale,
                      std::min(causal ? t0 + i + 1 : T, visible), nk, km, P16 + i * nk,
                      dS16 + i * nk);
          }
          // dQ_blk = dS K (=);  dK += dS^T Q_blk;  dV += P^T dO_blk (fp32 sums over blocks).
          Gemm16(false, false, nq, HS, nk, 1.0f, dS16, nk, kb, HS, 0.0f,
                 dq + (b * T + t0) * q_stride + h * HS, q_stride);
          Gemm16(true, false, nk, HS, nq, 1.0f, dS16, nk, qb, HS, 1.0f, dkb, kv_stride);
          Gemm16(true, false, nk, HS, nq, 1.0f, P16, nk, dob16, HS, 1.0f, dvb, kv_stride);
        }
      }
    }
  }
}

}  // namespace

bool UseBf16Tiles(DType operand_type, bool causal, int64_t T) {
  return operand_type == DType::kBF16 && !causal && T >= 256 && Bf16TileProductsNative();
}

void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                      int64_t kv_stride, bool causal, const int32_t* key_mask,
                      DType operand_type, int nt) {
  if (UseBf16Tiles(operand_type, causal, T)) {
    AttentionForward16(out, lse, q, k, v, B, T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask,
                       nt);
    return;
  }
  const int64_t group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  const int64_t nblocks = (T + kQBlock - 1) / kQBlock;
  const int64_t items = B * NH * nblocks;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(nt, items)))
  {
    static thread_local std::vector<float> tile;  // (kQBlock, T) scores / probabilities
    tile.resize(static_cast<size_t>(kQBlock * T));
    float* S = tile.data();
    // Later blocks see more keys: hand them out largest first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t blk = nblocks - 1 - it % nblocks, bh = it / nblocks;
      const int64_t b = bh / NH, h = bh % NH, kvh = h / group;
      const int64_t t0 = blk * kQBlock, t1 = std::min(T, t0 + kQBlock), nq = t1 - t0;
      const float* qb = q + (b * T + t0) * q_stride + h * HS;
      const float* kb = k + b * T * kv_stride + kvh * HS;
      const float* vb = v + b * T * kv_stride + kvh * HS;
      const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
      // Keys this block may see: up to its last query when causal, never past a padded tail.
      const int64_t nk = std::min(causal ? t1 : T, KeyEnd(km, T));
      float* lse_row = lse + (b * NH + h) * T + t0;
      float* ob = out + (b * T + t0) * C + h * HS;
      if (nk == 0) {  // no visible key at all
        for (int64_t i = 0; i < nq; ++i) {
          std::fill_n(ob + i * C, HS, 0.0f);
          lse_row[i] = 0.0f;
        }
        continue;
      }
      // S(nq, nk) = scale * Q_blk K^T
      Sgemm(false, true, nq, nk, HS, scale, qb, q_stride, kb, kv_stride, 0.0f, S, nk, 1);
      for (int64_t i = 0; i < nq; ++i)
        lse_row[i] = SoftmaxRow(S + i * nk, std::min(causal ? t0 + i + 1 : T, nk), nk, km);
      // O_blk(nq, HS) = P V
      Sgemm(false, false, nq, HS, nk, 1.0f, S, nk, vb, kv_stride, 0.0f, ob, C, 1);
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                       int64_t kv_stride, bool causal, const int32_t* key_mask,
                       DType operand_type, int nt) {
  if (UseBf16Tiles(operand_type, causal, T)) {
    AttentionBackward16(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, q_stride,
                        kv_stride, causal, key_mask, nt);
    return;
  }
  const int64_t group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  const int64_t nblocks = (T + kQBlock - 1) / kQBlock;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(nt, B * NKV)))
  {
    static thread_local std::vector<float> tiles;  // P and dP/dS, (kQBlock, T) each
    tiles.resize(static_cast<size_t>(2 * kQBlock * T));
    float* P = tiles.data();
    float* dS = P + kQBlock * T;
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < B * NKV; ++bk) {
      const int64_t b = bk / NKV, kvh = bk % NKV;
      const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
      const int64_t key_end = KeyEnd(km, T);
      const float* kb = k + b * T * kv_stride + kvh * HS;
      const float* vb = v + b * T * kv_stride + kvh * HS;
      float* dkb = dk + b * T * kv_stride + kvh * HS;
      float* dvb = dv + b * T * kv_stride + kvh * HS;
      for (int64_t t = 0; t < T; ++t) {
        std::fill_n(dkb + t * kv_stride, HS, 0.0f);
        std::fill_n(dvb + t * kv_stride, HS, 0.0f);
      }
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t blk = 0; blk < nblocks; ++blk) {
          const int64_t t0 = blk * kQBlock, t1 = std::min(T, t0 + kQBlock), nq = t1 - t0;
          const float* qb = q + (b * T + t0) * q_stride + h * HS;
          const float* dob = dout + (b * T + t0) * C + h * HS;
          const float* ob = out + (b * T + t0) * C + h * HS;
          const float* lse_row = lse + (b * NH + h) * T + t0;
          const int64_t nk = std::min(causal ? t1 : T, key_end);  // keys this block may see
          if (nk == 0) {  // no visible key: dq = 0, nothing for dk, dv
            for (int64_t i = 0; i < nq; ++i)
              std::fill_n(dq + (b * T + t0 + i) * q_stride + h * HS, HS, 0.0f);
            continue;
          }
          // P = exp(scale * Q K^T - lse); dP = dO V^T; dS = P (dP - D) scale.
          Sgemm(false, true, nq, nk, HS, scale, qb, q_stride, kb, kv_stride, 0.0f, P, nk, 1);
          Sgemm(false, true, nq, nk, HS, 1.0f, dob, C, vb, kv_stride, 0.0f, dS, nk, 1);
          for (int64_t i = 0; i < nq; ++i) {
            const float D = Dot(dob + i * C, ob + i * C, HS);
            GradRow(P + i * nk, dS + i * nk, lse_row[i], D, scale,
                    std::min(causal ? t0 + i + 1 : T, nk), nk, km);
          }
          // dQ_blk = dS K (=);  dK += dS^T Q_blk;  dV += P^T dO_blk.
          Sgemm(false, false, nq, HS, nk, 1.0f, dS, nk, kb, kv_stride, 0.0f,
                dq + (b * T + t0) * q_stride + h * HS, q_stride, 1);
          Sgemm(true, false, nk, HS, nq, 1.0f, dS, nk, qb, q_stride, 1.0f, dkb, kv_stride, 1);
          Sgemm(true, false, nk, HS, nq, 1.0f, P, nk, dob, C, 1.0f, dvb, kv_stride, 1);
        }
      }
    }
  }
}

// One query row per (sequence, head) against the first T cached rows: the scores, their softmax
// (SoftmaxRow, as the forward) and the weighted sum of the value rows.
void AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                     int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                     int64_t q_stride, int64_t kv_stride, int nt) {
  const int64_t group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  const int64_t items = B * NH;
  const int threads = T * HS * items < 65536 ? 1 : static_cast<int>(std::min<int64_t>(nt, items));
#pragma omp parallel num_threads(threads)
  {
    static thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(T));
    float* s = scores.data();
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / NH, h = it % NH, kvh = h / group;
      const float* qh = q + b * q_stride + h * HS;
      const float* kb = k + b * cache_rows * kv_stride + kvh * HS;
      const float* vb = v + b * cache_rows * kv_stride + kvh * HS;
      for (int64_t t = 0; t < T; ++t) s[t] = scale * Dot(qh, kb + t * kv_stride, HS);
      SoftmaxRow(s, T, T, nullptr);
      float* o = out + b * C + h * HS;
      std::fill_n(o, HS, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const float p = s[t];
        const float* vr = vb + t * kv_stride;
#pragma omp simd
        for (int64_t e = 0; e < HS; ++e) o[e] += p * vr[e];
      }
    }
  }
}

}  // namespace traind::engine::cpu
