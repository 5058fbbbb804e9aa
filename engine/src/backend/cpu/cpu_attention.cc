// Self-attention on the CPU, flash-style: no (T,T) matrix is kept. Work goes in query blocks of
// up to kQBlock rows against the keys 0..(last query of the block) when causal, else against all
// T keys; each thread keeps its (kQBlock, T) score tiles (rows padded to 16 floats). A key
// padding mask (key_mask[b*T+j] == 0: key j of sequence b is not attended) zeroes those keys'
// probabilities exactly, and the keys after a sequence's last visible one (a padded tail) are
// left out of the products; a query with no visible key gets out = 0, lse = 0 and no gradient.
// A sliding window (window > 0, HF Mistral: query i sees key j only when i - j < window) starts a
// block's tile at the first key its first query's window reaches (rounded down to 16): the keys
// before it are skipped, not masked, and each row's softmax starts at its own window.
// Packed rows (doc_start: the first row of each query's example) work the same way: a block's
// tile starts at the first row of its earliest example (rounded down to 16), so the key blocks of
// earlier examples cost nothing, and each row's softmax starts at its own example's first key.
// The fp32 products (Q K^T, P V, dO V^T, dS K, dS^T Q, P^T dO) are register-blocked loops on the
// calling thread (TileProduct: per 4 rows only the causal band's columns and sums; K^T, and in
// the backward V^T, transposed once per (b, kv head); the library GEMMs cost more per call than
// these small products take), threads split (b, head, block) in the forward and (b, kv head) in
// the backward, so each thread owns the dk/dv rows it accumulates (deterministic).
// Forward saves lse (log-sum-exp of the scaled scores per query); backward recomputes P from it.
// GQA: query head h reads kv head h / (NH/NKV).
// bf16 operands (operand_type kBF16), two ways, both with fp32 accumulation into fp32 tiles, so
// the softmax, lse, D and the dk/dv sums stay fp32 (PyTorch autocast's attention):
//  - bidirectional T >= 256 where oneDNN has native bf16 kernels (AttentionForward16): q, k, v
//    (and dout in backward) are rounded once per call into per-head packed bf16 copies, the
//    probabilities and dS per tile, and every product is a oneDNN bf16 matmul. Query blocks of
//    kQBlock16 rows; a tile's keys are rounded up to a multiple of kKeyQuantum (the extra keys
//    are masked or past the causal limit, so they get exactly zero weight) to bound the distinct
//    GEMM shapes oneDNN compiles when sequences have different padded lengths.
//  - elsewhere (causal, short), where the CPU has AVX512-BF16 and the head size is even
//    (AttentionForwardDp): the fp32 path's loops and causal bands with bf16 pair operands and
//    vdpbf16ps (see "bf16 tile products on the CPU's own dot-product instruction" below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_transpose.h"

namespace traind::engine::cpu {
namespace {

constexpr int64_t kQBlock = 64;
constexpr int64_t kQBlock16 = 128;
constexpr int64_t kKeyQuantum = 64;

// Row i of a score tile holds query t = t0 + i against the tile's keys 0..n-1; only keys
// lo <= j < valid may be attended (causal: valid = t + 1 in tile columns; a sliding window moves
// lo up), and of those only the ones with km[j] != 0 when km is not null. In place: s -> softmax
// probabilities (exactly 0 where masked); returns the lse (0 when no key is visible, the row then
// all zeros).
TRAIND_CPU_CLONES float SoftmaxRow(float* s, int64_t lo, int64_t valid, int64_t n,
                                   const int32_t* km) {
  std::fill(s, s + std::min(lo, n), 0.0f);
  if (lo >= valid) {  // no key left between the window and the causal limit
    std::fill(s + std::min(lo, n), s + n, 0.0f);
    return 0.0f;
  }
  s += lo;
  valid -= lo;
  n -= lo;
  if (km != nullptr) km += lo;
  const float mx = km == nullptr ? MaxF(s, valid) : MaxWhereF(s, km, valid);
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

// p = exp(s - lse) on the visible keys [lo, valid) (0 elsewhere); ds = p * (dp - D) * scale, in
// place in dp.
TRAIND_CPU_CLONES void GradRow(float* s, float* dp, float lse, float D, float scale, int64_t lo,
                               int64_t valid, int64_t n, const int32_t* km) {
  lo = std::min(lo, n);
  valid = std::max(valid, lo);
  for (int64_t j = 0; j < lo; ++j) {
    s[j] = 0.0f;
    dp[j] = 0.0f;
  }
  if (km == nullptr) {
    for (int64_t j = lo; j < valid; ++j) {
      const float p = ExpFlushF(s[j] - lse);
      s[j] = p;
      dp[j] = p * (dp[j] - D) * scale;
    }
  } else {
    for (int64_t j = lo; j < valid; ++j) {
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

// A sliding window (backend.h: query i sees key j only when i - j < window) as the kernels use
// it: 0 when there is none or when it spans every key (window >= T changes nothing).
int64_t EffectiveWindow(int64_t window, int64_t T) { return window > 0 && window < T ? window : 0; }

// The first key of a tile for queries from t0 on: the first key query t0's window reaches,
// rounded down to a multiple of 16 (so the tile's panel columns stay 16-aligned and its key
// pairs whole); 0 without a window. The keys before it are outside every window of the block and
// are skipped, not masked.
int64_t WindowKeyStart(int64_t t0, int64_t window) {
  if (window <= 0 || t0 < window) return 0;
  return (t0 - window + 1) / 16 * 16;
}

// The first tile column query t = t0 + i may see (keys from k0 on in the tile): 0 without a window.
int64_t WindowLo(int64_t t, int64_t k0, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, t - window + 1 - k0) : 0;
}

// Packed rows (ds: the sequence's doc_start, or null): the first key of a tile for the queries
// t0..t1-1 is also at least the first row of the earliest of their examples (rounded down to 16),
// so the key blocks of earlier examples are skipped, not masked.
int64_t TileKeyStart(int64_t t0, int64_t t1, int64_t window, const int32_t* ds) {
  int64_t k0 = WindowKeyStart(t0, window);
  if (ds != nullptr) {
    int64_t first = t1;
    for (int64_t t = t0; t < t1; ++t) first = std::min<int64_t>(first, ds[t]);
    k0 = std::max<int64_t>(k0, std::max<int64_t>(0, first) / 16 * 16);
  }
  return k0;
}

// The first tile column query t may see: its window's (WindowLo) and, in a packed row, its
// example's first row.
int64_t RowLo(int64_t t, int64_t k0, int64_t window, const int32_t* ds) {
  const int64_t lo = WindowLo(t, k0, window);
  return ds != nullptr ? std::max<int64_t>(lo, ds[t] - k0) : lo;
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

// ---- fp32 tile products (hand-blocked; the library GEMMs cost more per call than these small
// products do) ----
//
// C (M x N) = alpha * A B, or C += alpha * A B: A's element (m, k) at a[m * rsa + k * csa] (so A
// or A^T, any strides), B's row k at b + k * ldb with N contiguous floats. Register blocks of 4
// rows x 64 columns (16 vectors of 16 floats: zmm registers on AVX-512, two ymm each on AVX2).
// The causal band: row m needs only columns n < m + n_diag (every column when n_diag < 0) and
// sums only k in [m - k_lo_diag, m + k_hi_diag) (every k when < 0); a block of rows takes the
// union of its rows' ranges (columns rounded up to 16), so the entries outside a row's band get
// exact products of zeros (the probabilities and dS are exactly 0 there) or are never read.
// Any N: the callers pad their score tiles to a multiple of 16 columns so no partial block runs.
constexpr int64_t kVec = 16;

struct Band {
  int64_t n_diag = -1;
  int64_t k_lo_diag = -1;
  int64_t k_hi_diag = -1;
};

template <int MR, int NV>
__attribute__((always_inline)) inline void TileBlock(const float* a, int64_t rsa, int64_t csa,
                                                     const float* b, int64_t ldb, int64_t k0,
                                                     int64_t k1, float alpha, bool accumulate,
                                                     float* c, int64_t ldc) {
  Vec16 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec16{};
  for (int64_t k = k0; k < k1; ++k) {
    Vec16 bv[NV];
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * ldb + v * kVec, sizeof(Vec16));
    for (int r = 0; r < MR; ++r) {
      const float s = a[r * rsa + k * csa];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      float* dst = c + r * ldc + v * kVec;
      Vec16 out = alpha * acc[r][v];
      if (accumulate) {
        Vec16 old;
        __builtin_memcpy(&old, dst, sizeof(Vec16));
        out += old;
      }
      __builtin_memcpy(dst, &out, sizeof(Vec16));
    }
  }
}

// The same for the last w < 16 columns (only head sizes that are not a multiple of 16 get here).
template <int MR>
__attribute__((always_inline)) inline void TileBlockPartial(const float* a, int64_t rsa,
                                                            int64_t csa, const float* b,
                                                            int64_t ldb, int64_t k0, int64_t k1,
                                                            float alpha, bool accumulate, float* c,
                                                            int64_t ldc, int64_t w) {
  Vec16 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = Vec16{};
  for (int64_t k = k0; k < k1; ++k) {
    Vec16 bv{};
    __builtin_memcpy(&bv, b + k * ldb, static_cast<size_t>(w) * sizeof(float));
    for (int r = 0; r < MR; ++r) acc[r] += a[r * rsa + k * csa] * bv;
  }
  for (int r = 0; r < MR; ++r) {
    const Vec16 out = alpha * acc[r];
    float* dst = c + r * ldc;
    for (int64_t j = 0; j < w; ++j) dst[j] = accumulate ? dst[j] + out[j] : out[j];
  }
}

// Rows m0..m0+MR-1 of C, columns [n0, n1) (at most 64), summing k in [kc0, kc1) of the band;
// `first`: the first k slice, which writes (or adds to) C even where the band leaves it no k.
template <int MR>
__attribute__((always_inline)) inline void TileRows(int64_t m0, int64_t n0, int64_t n1,
                                                    int64_t kc0, int64_t kc1, bool first,
                                                    float alpha, const float* a, int64_t rsa,
                                                    int64_t csa, const float* b, int64_t ldb,
                                                    bool accumulate, float* c, int64_t ldc,
                                                    const Band& band) {
  const int64_t last = m0 + MR - 1;
  int64_t n_end = n1;
  if (band.n_diag >= 0) n_end = std::min(n1, (last + band.n_diag + kVec - 1) / kVec * kVec);
  if (n_end <= n0) return;
  const int64_t k0 = band.k_lo_diag >= 0 ? std::max(kc0, m0 - band.k_lo_diag) : kc0;
  const int64_t k1 = band.k_hi_diag >= 0 ? std::min(kc1, last + band.k_hi_diag) : kc1;
  if (k0 >= k1 && (!first || accumulate)) return;  // nothing to add
  const float* ar = a + m0 * rsa;
  float* cr = c + m0 * ldc;
  int64_t n = n0;
  for (; n + 4 * kVec <= n_end; n += 4 * kVec)
    TileBlock<MR, 4>(ar, rsa, csa, b + n, ldb, k0, k1, alpha, accumulate, cr + n, ldc);
  for (; n + kVec <= n_end; n += kVec)
    TileBlock<MR, 1>(ar, rsa, csa, b + n, ldb, k0, k1, alpha, accumulate, cr + n, ldc);
  if (n < n_end)
    TileBlockPartial<MR>(ar, rsa, csa, b + n, ldb, k0, k1, alpha, accumulate, cr + n, ldc, n_end - n);
}

// Slices of 128 k by 64 columns, every row block within a slice: the slice of B (at most 32 KiB)
// stays in the L1 cache while the rows stream past it (long keys at T = 1024).
TRAIND_CPU_CLONES void TileProduct(int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                                   int64_t rsa, int64_t csa, const float* b, int64_t ldb,
                                   bool accumulate, float* c, int64_t ldc, Band band) {
  constexpr int64_t kSliceK = 128, kSliceN = 4 * kVec;
  for (int64_t kc = 0; kc < K; kc += kSliceK) {
    const int64_t kc1 = std::min(K, kc + kSliceK);
    const bool add = accumulate || kc > 0;
    for (int64_t n0 = 0; n0 < N; n0 += kSliceN) {
      const int64_t n1 = std::min(N, n0 + kSliceN);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        TileRows<4>(m, n0, n1, kc, kc1, kc == 0, alpha, a, rsa, csa, b, ldb, add, c, ldc, band);
      for (; m < M; ++m)
        TileRows<1>(m, n0, n1, kc, kc1, kc == 0, alpha, a, rsa, csa, b, ldb, add, c, ldc, band);
    }
  }
}

int64_t RoundUp16(int64_t n) { return (n + kVec - 1) / kVec * kVec; }

// Row stride of a transposed (HS, n) panel: n rounded up to 16, plus 16 floats when that is a
// multiple of 256 (a 1 KiB multiple: the rows a product slice reads would share L1 sets).
int64_t PanelStride(int64_t n) {
  const int64_t r = RoundUp16(n);
  return r % 256 == 0 ? r + kVec : r;
}

// xt (HS x cols, row stride ld) = the first `rows` rows of x (row stride `stride`, HS floats
// each) transposed, zero columns from `rows` to `cols`.
TRAIND_CPU_CLONES void TransposeRows(float* xt, int64_t ld, const float* x, int64_t stride,
                                     int64_t rows, int64_t cols, int64_t HS) {
  TransposeBlock(xt, ld, x, stride, rows, HS);
  for (int64_t e = 0; e < HS; ++e) std::fill(xt + e * ld + rows, xt + e * ld + cols, 0.0f);
}

// SoftmaxRow, then the row's probabilities in bf16 into p16 (zeros outside [lo, valid)).
float SoftmaxRow16(float* s, int64_t lo, int64_t valid, int64_t n, const int32_t* km,
                   uint16_t* p16) {
  const float lse = SoftmaxRow(s, lo, valid, n, km);
  F32ToBf16Span(p16, s, n);
  return lse;
}

// GradRow, then P and dS in bf16 into p16 and ds16.
void GradRow16(float* s, float* dp, float lse, float D, float scale, int64_t lo, int64_t valid,
               int64_t n, const int32_t* km, uint16_t* p16, uint16_t* ds16) {
  GradRow(s, dp, lse, D, scale, lo, valid, n, km);
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

// Where oneDNN's bf16 tiles pay: measured on the 2-core AVX512-BF16 VM (1 thread, HS 64),
// bidirectional T=512 (bert) runs 1.45x faster than fp32 forward and backward; causal tiles at
// T=128..1024 and short sequences gain nothing through oneDNN (the conversions and per-product
// calls cost what the bf16 products save), so they take the dot-product tiles below where the CPU
// has them, else fp32 (operand_type is a permission).

// Keys a bf16 tile spans: the visible ones rounded up to kKeyQuantum (never past T).
int64_t KeysForTile(int64_t visible, int64_t T) {
  return std::min(T, (visible + kKeyQuantum - 1) / kKeyQuantum * kKeyQuantum);
}

void AttentionForward16(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                        int64_t q_stride, int64_t kv_stride, bool causal,
                        const int32_t* key_mask, int64_t window, int nt,
                        const int32_t* doc_start) {
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
      // The tile's keys: k0 (the block's window or example start) up to the last visible one.
      const int32_t* ds = doc_start != nullptr ? doc_start + b * T : nullptr;
      const int64_t k0 = TileKeyStart(t0, t1, window, ds);
      const int64_t visible = std::min(causal ? t1 : T, KeyEnd(km, T));
      float* lse_row = lse + (b * NH + h) * T + t0;
      float* ob = out + (b * T + t0) * C + h * HS;
      if (visible <= k0) {  // no visible key at all
        for (int64_t i = 0; i < nq; ++i) {
          std::fill_n(ob + i * C, HS, 0.0f);
          lse_row[i] = 0.0f;
        }
        continue;
      }
      const int64_t nk = KeysForTile(visible - k0, T - k0);
      // S(nq, nk) = scale * Q_blk K^T; P = softmax; O_blk(nq, HS) = P V.
      Gemm16(false, true, nq, nk, HS, scale, qb, HS, kb + k0 * HS, HS, 0.0f, S, nk);
      for (int64_t i = 0; i < nq; ++i) {
        lse_row[i] = SoftmaxRow16(S + i * nk, RowLo(t0 + i, k0, window, ds),
                                  std::min(causal ? t0 + i + 1 : T, visible) - k0, nk,
                                  km != nullptr ? km + k0 : nullptr, p16.data() + i * nk);
      }
      Gemm16(false, false, nq, HS, nk, 1.0f, p16.data(), nk, vb + k0 * HS, HS, 0.0f, ob, C);
    }
  }
}

void AttentionBackward16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal,
                         const int32_t* key_mask, int64_t window, int nt,
                         const int32_t* doc_start) {
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
          const int32_t* ds = doc_start != nullptr ? doc_start + b * T : nullptr;
          const int64_t k0 = TileKeyStart(t0, t1, window, ds);  // the tile's first key
          const int64_t visible = std::min(causal ? t1 : T, key_end);
          if (visible <= k0) {  // no visible key: dq = 0, nothing for dk, dv
            for (int64_t i = 0; i < nq; ++i)
              std::fill_n(dq + (b * T + t0 + i) * q_stride + h * HS, HS, 0.0f);
            continue;
          }
          const int64_t nk = KeysForTile(visible - k0, T - k0);
          const uint16_t* kt = kb + k0 * HS;
          // P = exp(scale * Q K^T - lse); dP = dO V^T; dS = P (dP - D) scale (fp32 tiles).
          Gemm16(false, true, nq, nk, HS, scale, qb, HS, kt, HS, 0.0f, P, nk);
          Gemm16(false, true, nq, nk, HS, 1.0f, dob16, HS, vb + k0 * HS, HS, 0.0f, dS, nk);
          for (int64_t i = 0; i < nq; ++i) {
            const float D = Dot(dob + i * C, ob + i * C, HS);
            GradRow16(P + i * nk, dS + i * nk, lse_row[i], D, scale, RowLo(t0 + i, k0, window, ds),
                      std::min(causal ? t0 + i + 1 : T, visible) - k0, nk,
                      km != nullptr ? km + k0 : nullptr, P16 + i * nk, dS16 + i * nk);
          }
          // dQ_blk = dS K (=);  dK += dS^T Q_blk;  dV += P^T dO_blk (fp32 sums over blocks).
          Gemm16(false, false, nq, HS, nk, 1.0f, dS16, nk, kt, HS, 0.0f,
                 dq + (b * T + t0) * q_stride + h * HS, q_stride);
          Gemm16(true, false, nk, HS, nq, 1.0f, dS16, nk, qb, HS, 1.0f, dkb + k0 * kv_stride,
                 kv_stride);
          Gemm16(true, false, nk, HS, nq, 1.0f, P16, nk, dob16, HS, 1.0f, dvb + k0 * kv_stride,
                 kv_stride);
        }
      }
    }
  }
}

// ---- the loops both tile kinds (fp32, bf16 dot products) share ----

// A query block of one (sequence, head): queries t0..t0+nq-1 against the nk keys k0..k0+nk-1 it
// may see (from the first key the window of query t0 reaches, rounded down to 16: WindowKeyStart;
// to its last query when causal, never past a padded tail; nk > 0); km: the key mask of those
// keys (the sequence's from k0 on), or null. Tile column c is key k0 + c.
struct QueryBlock {
  int64_t b, h, kvh, t0, nq, k0, nk;
  const int32_t* km;
  int64_t window;  // EffectiveWindow: 0 = none
  bool causal;
  const int32_t* ds = nullptr;  // packed rows: the sequence's doc_start (k0 is at most its first)
  // The tile columns query t0 + i may attend: [Lo(i), Valid(i)).
  int64_t Lo(int64_t i) const { return RowLo(t0 + i, k0, window, ds); }
  int64_t Valid(int64_t i) const { return causal ? std::min(t0 + i + 1 - k0, nk) : nk; }
  // The products' bands in tile coordinates. Scores: row i needs the columns < i + t0 + 1 - k0
  // (causal). P V and dS K: row i sums the columns [i - (window reach), i + t0 + 1 - k0). dS^T Q
  // and P^T dO (rows: the tile's keys, summing queries): key row m sums the queries
  // [m + k0 - t0 (causal), m + k0 + window - t0). Every band is the true range or wider (the
  // probabilities and dS are exactly 0 outside a row's range).
  Band Scores() const { return Band{causal ? t0 + 1 - k0 : -1, -1, -1}; }
  Band Keys() const {
    return Band{-1, window > 0 ? std::max<int64_t>(0, k0 + window - 1 - t0) : -1,
                causal ? t0 + 1 - k0 : -1};
  }
  Band Queries() const {
    return Band{-1, causal ? t0 - k0 : -1,
                window > 0 ? std::max<int64_t>(0, k0 + window - t0) : -1};
  }
};

// The forward: one parallel region; pack(bk, b, kvh, key_end) for every (sequence, kv head),
// split across the threads, a barrier, then block(QueryBlock) for every (sequence, head, query
// block) handed out dynamically, later blocks (more keys) first. A block with no visible key gets
// out = 0 and lse = 0 here.
template <class Pack, class Block>
void ForwardBlocks(float* out, float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                   int64_t HS, bool causal, const int32_t* key_mask, int64_t window,
                   const int32_t* doc_start, int nt, Pack&& pack, Block&& block) {
  const int64_t group = NH / NKV, C = NH * HS;
  const int64_t nblocks = (T + kQBlock - 1) / kQBlock, items = B * NH * nblocks;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(nt, items)))
  {
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < B * NKV; ++bk) {
      const int64_t b = bk / NKV;
      pack(bk, b, bk % NKV, KeyEnd(key_mask != nullptr ? key_mask + b * T : nullptr, T));
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t blk = nblocks - 1 - it % nblocks, bh = it / nblocks;
      const int64_t b = bh / NH, h = bh % NH;
      const int64_t t0 = blk * kQBlock, t1 = std::min(T, t0 + kQBlock);
      const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
      const int32_t* ds = doc_start != nullptr ? doc_start + b * T : nullptr;
      const int64_t k0 = TileKeyStart(t0, t1, window, ds);
      const int64_t end = std::min(causal ? t1 : T, KeyEnd(km, T));
      const QueryBlock qb{b, h, h / group, t0, t1 - t0, k0, std::max<int64_t>(0, end - k0),
                          km != nullptr ? km + k0 : nullptr, window, causal, ds};
      if (qb.nk == 0) {  // no visible key at all
        for (int64_t i = 0; i < qb.nq; ++i) {
          std::fill_n(out + (b * T + t0 + i) * C + h * HS, HS, 0.0f);
          lse[(b * NH + h) * T + t0 + i] = 0.0f;
        }
        continue;
      }
      block(qb);
    }
  }
}

// The backward: threads split (sequence, kv head), so each owns the dk/dv rows it sums
// (deterministic): they are zeroed, kv(b, kvh, key_end) prepares the head's panels, then
// block(QueryBlock) runs for each query head of the group and each query block with a visible
// key (one without gets dq = 0 here).
template <class Kv, class Block>
void BackwardBlocks(float* dq, float* dk, float* dv, int64_t B, int64_t T, int64_t NH,
                    int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride, bool causal,
                    const int32_t* key_mask, int64_t window, const int32_t* doc_start, int nt,
                    Kv&& kv, Block&& block) {
  const int64_t group = NH / NKV;
  const int64_t nblocks = (T + kQBlock - 1) / kQBlock;
#pragma omp parallel for num_threads(static_cast <int>(std::min <int64_t>(nt, B * NKV))) \
    schedule(static)
  for (int64_t bk = 0; bk < B * NKV; ++bk) {
    const int64_t b = bk / NKV, kvh = bk % NKV;
    const int32_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
    const int64_t key_end = KeyEnd(km, T);
    for (int64_t t = 0; t < T; ++t) {
      std::fill_n(dk + (b * T + t) * kv_stride + kvh * HS, HS, 0.0f);
      std::fill_n(dv + (b * T + t) * kv_stride + kvh * HS, HS, 0.0f);
    }
    kv(b, kvh, key_end);
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t blk = 0; blk < nblocks; ++blk) {
        const int64_t t0 = blk * kQBlock, t1 = std::min(T, t0 + kQBlock);
        const int32_t* ds = doc_start != nullptr ? doc_start + b * T : nullptr;
        const int64_t k0 = TileKeyStart(t0, t1, window, ds);
        const int64_t end = std::min(causal ? t1 : T, key_end);
        const QueryBlock qb{b,  h,  kvh, t0, t1 - t0, k0, std::max<int64_t>(0, end - k0),
                            km != nullptr ? km + k0 : nullptr, window, causal, ds};
        if (qb.nk == 0) {  // no visible key: dq = 0, nothing for dk, dv
          for (int64_t i = 0; i < qb.nq; ++i)
            std::fill_n(dq + (b * T + t0 + i) * q_stride + h * HS, HS, 0.0f);
          continue;
        }
        block(qb);
      }
    }
  }
}

// ---- bf16 tile products on the CPU's own dot-product instruction (AVX512-BF16 vdpbf16ps) ----
//
// Where oneDNN's bf16 matmuls do not pay (causal, short sequences: a library call per small
// product), the products run as the fp32 TileProduct above, with bf16 operand pairs: vdpbf16ps
// multiplies two bf16 pairs per fp32 lane and adds both products to the lane, so a 32-bit word
// holding elements k = 2p (low half) and 2p + 1 (high half) of a row is one step of the sum.
// Operand A's pair (m, p) is the word a[m * rsa + p * csa]; B's pair row p is N words at
// b + p * ldb (word n: elements 2p and 2p + 1 of column n). The callers pack:
//   - rows of q, dout and the probabilities/dS as they are (pairs of adjacent columns),
//   - K^T and V^T panels as pair rows of head-size pairs (word (p, key j): k[j][2p], k[j][2p+1]),
//   - K, V, the block's q and dout rows as key/query pair rows (word (p, e): x[2p][e], x[2p+1][e]),
//   - P and dS as query pair rows for the sums over queries (dK, dV).
// Every element a pair adds past a row's band or a tile's end is an exact zero (a probability or
// dS outside the causal band, a padding word), so a band widened to whole pairs adds nothing.
// Accumulation is fp32 throughout; the softmax, lse, D and the dk/dv sums stay fp32 as on the
// oneDNN path (PyTorch autocast's attention: bf16 matmul operands, fp32 accumulation).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRAIND_DPBF16 1
#define TRAIND_DPBF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,bmi2")))

// bf16 bits of x (core/half.h's F32ToBF16: nearest even, NaN quiet) in the low 16 bits.
inline uint32_t Bf16Bits(float x) { return F32ToBF16(x); }

// dst[p] = (src[2p], src[2p + 1]) in bf16 for p < ceil(n / 2); an odd n's last word has a zero
// high half. vcvtne2ps2bf16 rounds as F32ToBF16 (nearest even; NaN quiet).
TRAIND_DPBF16_TARGET void RowWords(uint32_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh w = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i / 2, (__m512i)w);
  }
  for (; i + 1 < n; i += 2) dst[i / 2] = Bf16Bits(src[i]) | Bf16Bits(src[i + 1]) << 16;
  if (i < n) dst[i / 2] = Bf16Bits(src[i]);
}

// The same from bf16 bits (a 16-bit job's tensors): the words are the bits themselves.
inline void RowWords(uint32_t* dst, const uint16_t* src, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n / 2) * sizeof(uint32_t));
  if (n % 2 != 0) dst[n / 2] = src[n - 1];
}

// x[j..j+16) in bf16, each zero-extended to 32 bits (zeros for a null row).
__attribute__((always_inline)) TRAIND_DPBF16_TARGET inline __m512i Bf16Lanes(const float* x,
                                                                             int64_t j) {
  if (x == nullptr) return _mm512_setzero_si512();
  // (The maskz forms: GCC 12 warns of the plain forms' undefined pass-through operand.)
  return _mm512_maskz_cvtepu16_epi32(0xffff, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + j)));
}

// dst[j] = (lo[j], hi[j]) in bf16 for j < n; a null row stands for zeros.
TRAIND_DPBF16_TARGET void PairWords(uint32_t* dst, const float* lo, const float* hi, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i high = _mm512_maskz_slli_epi32(0xffff, Bf16Lanes(hi, j), 16);
    _mm512_storeu_si512(dst + j, _mm512_or_si512(Bf16Lanes(lo, j), high));
  }
  for (; j < n; ++j)
    dst[j] = (lo != nullptr ? Bf16Bits(lo[j]) : 0u) | (hi != nullptr ? Bf16Bits(hi[j]) << 16 : 0u);
}

// dst[j] = (lo[j], hi[j]) from bf16 bits; a null row stands for zeros.
inline void PairWords(uint32_t* dst, const uint16_t* lo, const uint16_t* hi, int64_t n) {
  if (lo != nullptr && hi != nullptr) {
    for (int64_t j = 0; j < n; ++j) dst[j] = lo[j] | static_cast<uint32_t>(hi[j]) << 16;
  } else if (lo != nullptr) {
    for (int64_t j = 0; j < n; ++j) dst[j] = lo[j];
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = hi != nullptr ? static_cast<uint32_t>(hi[j]) << 16 : 0u;
  }
}

// Dot of two rows of n <= 512 elements: fp32 as Dot, bf16 widened first (the same bits).
inline float RowDot(const float* a, const float* b, int64_t n) { return Dot(a, b, n); }
inline float RowDot(const uint16_t* a, const uint16_t* b, int64_t n) {
  float wa[512], wb[512];
  for (int64_t i = 0; i < n; ++i) {
    wa[i] = BF16ToF32(a[i]);
    wb[i] = BF16ToF32(b[i]);
  }
  return Dot(wa, wb, n);
}

// The (HS/2, cols) pair panel of the first `rows` rows of x (row stride `stride`; fp32 or bf16
// bits): word (p, j) at kt[p * ld + j] holds x[j][2p], x[j][2p + 1]; zero words for j in
// [rows, cols).
template <class In>
TRAIND_DPBF16_TARGET void PackPairPanel(uint32_t* kt, int64_t ld, const In* x, int64_t stride,
                                        int64_t rows, int64_t cols, int64_t HS) {
  const int64_t H2 = HS / 2;
  uint32_t w[16 * 256];  // 16 rows of words, HS <= 512
  int64_t j0 = 0;
  for (; j0 < rows; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, rows - j0);
    for (int64_t j = 0; j < nj; ++j) RowWords(w + j * H2, x + (j0 + j) * stride, HS);
    for (int64_t p = 0; p < H2; ++p)
      for (int64_t j = 0; j < nj; ++j) kt[p * ld + j0 + j] = w[j * H2 + p];
  }
  for (int64_t p = 0; p < H2; ++p) std::fill(kt + p * ld + rows, kt + p * ld + cols, 0u);
}

// Row pairs of the first `rows` rows of x: word (p, e) at xi[p * HS + e] holds x[2p][e],
// x[2p + 1][e], for p < pairs; rows at or past `rows` are zeros.
template <class In>
TRAIND_DPBF16_TARGET void PackRowPairs(uint32_t* xi, const In* x, int64_t stride, int64_t rows,
                                       int64_t pairs, int64_t HS) {
  for (int64_t p = 0; p < pairs; ++p) {
    const In* lo = 2 * p < rows ? x + 2 * p * stride : nullptr;
    const In* hi = 2 * p + 1 < rows ? x + (2 * p + 1) * stride : nullptr;
    PairWords(xi + p * HS, lo, hi, HS);
  }
}

// Register block: MR rows x NV vectors of 16 fp32 columns over the pairs [p0, p1); `mask`: the
// columns of the last vector (all 16 but for a head size that is no multiple of 16).
template <int MR, int NV>
__attribute__((always_inline)) TRAIND_DPBF16_TARGET inline void DpBlock(
    const uint32_t* a, int64_t rsa, int64_t csa, const uint32_t* b, int64_t ldb, int64_t p0,
    int64_t p1, float alpha, bool accumulate, float* c, int64_t ldc, __mmask16 mask) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) {
      const uint32_t* src = b + p * ldb + v * kVec;
      const __m512i x = v + 1 < NV ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi32(mask, src);
      bv[v] = (__m512bh)x;
    }
    for (int r = 0; r < MR; ++r) {
      uint32_t word;
      __builtin_memcpy(&word, a + r * rsa + p * csa, sizeof(word));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      float* dst = c + r * ldc + v * kVec;
      const __mmask16 m = v + 1 < NV ? static_cast<__mmask16>(0xffff) : mask;
      __m512 out = _mm512_mul_ps(scale, acc[r][v]);
      if (accumulate) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, dst));
      _mm512_mask_storeu_ps(dst, m, out);
    }
  }
}

// TileRows with pairs: rows m0..m0+MR-1, columns [n0, n1), pairs [pc0, pc1) of the slice; the
// band's k range (in elements) widened to whole pairs.
template <int MR>
__attribute__((always_inline)) TRAIND_DPBF16_TARGET inline void DpRows(
    int64_t m0, int64_t n0, int64_t n1, int64_t pc0, int64_t pc1, bool first, float alpha,
    const uint32_t* a, int64_t rsa, int64_t csa, const uint32_t* b, int64_t ldb, bool accumulate,
    float* c, int64_t ldc, const Band& band) {
  const int64_t last = m0 + MR - 1;
  int64_t n_end = n1;
  if (band.n_diag >= 0) n_end = std::min(n1, RoundUp16(last + band.n_diag));
  if (n_end <= n0) return;
  const int64_t p0 = band.k_lo_diag >= 0 ? std::max(pc0, (m0 - band.k_lo_diag) >> 1) : pc0;
  const int64_t p1 = band.k_hi_diag >= 0 ? std::min(pc1, (last + band.k_hi_diag + 1) >> 1) : pc1;
  if (p0 >= p1 && (!first || accumulate)) return;  // nothing to add
  const uint32_t* ar = a + m0 * rsa;
  float* cr = c + m0 * ldc;
  const __mmask16 all = 0xffff;
  int64_t n = n0;
  for (; n + 4 * kVec <= n_end; n += 4 * kVec)
    DpBlock<MR, 4>(ar, rsa, csa, b + n, ldb, p0, p1, alpha, accumulate, cr + n, ldc, all);
  for (; n + kVec <= n_end; n += kVec)
    DpBlock<MR, 1>(ar, rsa, csa, b + n, ldb, p0, p1, alpha, accumulate, cr + n, ldc, all);
  if (n < n_end) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n_end - n)) - 1u);
    DpBlock<MR, 1>(ar, rsa, csa, b + n, ldb, p0, p1, alpha, accumulate, cr + n, ldc, tail);
  }
}

// C (M x N) = alpha A B (or += with accumulate) over P pairs, in slices of 64 pairs by 64
// columns (a 16 KiB slice of B stays in L1 while the rows stream past), as TileProduct.
TRAIND_DPBF16_TARGET void DpProduct(int64_t M, int64_t N, int64_t P, float alpha,
                                    const uint32_t* a, int64_t rsa, int64_t csa, const uint32_t* b,
                                    int64_t ldb, bool accumulate, float* c, int64_t ldc,
                                    Band band) {
  constexpr int64_t kSliceP = 64, kSliceN = 4 * kVec;
  for (int64_t pc = 0; pc < P; pc += kSliceP) {
    const int64_t pc1 = std::min(P, pc + kSliceP);
    const bool add = accumulate || pc > 0;
    for (int64_t n0 = 0; n0 < N; n0 += kSliceN) {
      const int64_t n1 = std::min(N, n0 + kSliceN);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        DpRows<4>(m, n0, n1, pc, pc1, pc == 0, alpha, a, rsa, csa, b, ldb, add, c, ldc, band);
      for (; m < M; ++m)
        DpRows<1>(m, n0, n1, pc, pc1, pc == 0, alpha, a, rsa, csa, b, ldb, add, c, ldc, band);
    }
  }
}

// In: float, or uint16_t for bf16 bits (a 16-bit job's tensors, read as they are).
template <class In>
void AttentionForwardDp(float* out, float* lse, const In* q, const In* k, const In* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                        int64_t q_stride, int64_t kv_stride, bool causal,
                        const int32_t* key_mask, int64_t window, int nt,
                        const int32_t* doc_start) {
  const int64_t H2 = HS / 2, C = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t T16 = PanelStride(T), TP = (T + 1) / 2;
  // Per (sequence, kv head): the K^T pair panel (H2 x T16 words) and V's key pairs (TP x HS
  // words), both zero past the sequence's visible keys.
  const int64_t per = H2 * T16 + TP * HS;
  static thread_local std::vector<uint32_t> kv_pack;
  kv_pack.resize(static_cast<size_t>(B * NKV * per));
  uint32_t* packs = kv_pack.data();
  // Per thread: the (kQBlock, T16) scores / probabilities; the block's q rows, then P's rows.
  static thread_local std::vector<float> tile;
  static thread_local std::vector<uint32_t> words;
  ForwardBlocks(
      out, lse, B, T, NH, NKV, HS, causal, key_mask, window, doc_start, nt,
      [&](int64_t bk, int64_t b, int64_t kvh, int64_t key_end) {
        uint32_t* kt = packs + bk * per;
        PackPairPanel(kt, T16, k + b * T * kv_stride + kvh * HS, kv_stride, key_end, T16, HS);
        PackRowPairs(kt + H2 * T16, v + b * T * kv_stride + kvh * HS, kv_stride, key_end, TP,
                     HS);
      },
      [&](const QueryBlock& qb) {
        tile.resize(static_cast<size_t>(kQBlock * T16));
        words.resize(static_cast<size_t>(kQBlock * (H2 + TP)));
        float* S = tile.data();
        uint32_t* qw = words.data();
        uint32_t* pw = qw + kQBlock * H2;
        const int64_t t0 = qb.t0, nq = qb.nq, nk = qb.nk;
        // The tile's keys from k0 (even: WindowKeyStart is a multiple of 16).
        const uint32_t* KT = packs + (qb.b * NKV + qb.kvh) * per + qb.k0;
        const uint32_t* VI = packs + (qb.b * NKV + qb.kvh) * per + H2 * T16 + qb.k0 / 2 * HS;
        for (int64_t i = 0; i < nq; ++i)
          RowWords(qw + i * H2, q + (qb.b * T + t0 + i) * q_stride + qb.h * HS, HS);
        const int64_t ld = PanelStride(nk), np = (nk + 1) / 2;
        DpProduct(nq, RoundUp16(nk), H2, scale, qw, H2, 1, KT, T16, false, S, ld, qb.Scores());
        float* lse_row = lse + (qb.b * NH + qb.h) * T + t0;
        for (int64_t i = 0; i < nq; ++i) {
          lse_row[i] = SoftmaxRow(S + i * ld, qb.Lo(i), qb.Valid(i), nk, qb.km);
          RowWords(pw + i * np, S + i * ld, nk);
        }
        DpProduct(nq, HS, np, 1.0f, pw, np, 1, VI, HS, false,
                  out + (qb.b * T + t0) * C + qb.h * HS, C, qb.Keys());
      });
}

template <class In>
void AttentionBackwardDp(float* dq, float* dk, float* dv, const In* dout, const In* out,
                         const float* lse, const In* q, const In* k, const In* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal,
                         const int32_t* key_mask, int64_t window, int nt,
                         const int32_t* doc_start) {
  const int64_t H2 = HS / 2, C = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t T16 = PanelStride(T), TP = (T + 1) / 2, QP = kQBlock / 2;
  // Per thread: fp32 P and dP/dS tiles, (kQBlock, T16) each; words: K^T and V^T pair panels
  // (H2 x T16 each), K's key pairs (TP x HS); the block's q and dout rows (kQBlock x H2 each) and
  // query pairs (QP x HS each); dS's rows (kQBlock x TP); dS's and P's query pairs (QP x T each).
  static thread_local std::vector<float> tiles;
  static thread_local std::vector<uint32_t> words;
  auto panels = [&] {
    tiles.resize(static_cast<size_t>(2 * kQBlock * T16));
    words.resize(static_cast<size_t>(2 * H2 * T16 + TP * HS + 2 * kQBlock * H2 + 2 * QP * HS +
                                     kQBlock * TP + 2 * QP * T));
    return words.data();
  };
  BackwardBlocks(
      dq, dk, dv, B, T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask, window, doc_start, nt,
      [&](int64_t b, int64_t kvh, int64_t key_end) {
        uint32_t* KT = panels();
        uint32_t* VT = KT + H2 * T16;
        uint32_t* KI = VT + H2 * T16;
        const In* kb = k + b * T * kv_stride + kvh * HS;
        PackPairPanel(KT, T16, kb, kv_stride, key_end, T16, HS);
        PackPairPanel(VT, T16, v + b * T * kv_stride + kvh * HS, kv_stride, key_end, T16, HS);
        PackRowPairs(KI, kb, kv_stride, key_end, TP, HS);
      },
      [&](const QueryBlock& qb) {
        float* P = tiles.data();
        float* dS = P + kQBlock * T16;
        // The panels from the tile's first key k0 (even: WindowKeyStart is a multiple of 16).
        const uint32_t* KT = words.data() + qb.k0;
        const uint32_t* VT = words.data() + H2 * T16 + qb.k0;
        const uint32_t* KI = words.data() + 2 * H2 * T16 + qb.k0 / 2 * HS;
        uint32_t* qw = words.data() + 2 * H2 * T16 + TP * HS;
        uint32_t* dow = qw + kQBlock * H2;
        uint32_t* qi = dow + kQBlock * H2;
        uint32_t* doi = qi + QP * HS;
        uint32_t* dsw = doi + QP * HS;
        uint32_t* dsi = dsw + kQBlock * TP;
        uint32_t* pi = dsi + QP * T;
        const int64_t b = qb.b, h = qb.h, t0 = qb.t0, nq = qb.nq, nk = qb.nk;
        const In* qb_rows = q + (b * T + t0) * q_stride + h * HS;
        const In* dob = dout + (b * T + t0) * C + h * HS;
        const In* ob = out + (b * T + t0) * C + h * HS;
        const float* lse_row = lse + (b * NH + h) * T + t0;
        const int64_t nqp = (nq + 1) / 2;
        for (int64_t i = 0; i < nq; ++i) {
          RowWords(qw + i * H2, qb_rows + i * q_stride, HS);
          RowWords(dow + i * H2, dob + i * C, HS);
        }
        PackRowPairs(qi, qb_rows, q_stride, nq, nqp, HS);
        PackRowPairs(doi, dob, C, nq, nqp, HS);
        const int64_t ld = PanelStride(nk), nk16 = RoundUp16(nk), np = (nk + 1) / 2;
        // P = exp(scale * Q K^T - lse); dP = dO V^T; dS = P (dP - D) scale (fp32 tiles).
        DpProduct(nq, nk16, H2, scale, qw, H2, 1, KT, T16, false, P, ld, qb.Scores());
        DpProduct(nq, nk16, H2, 1.0f, dow, H2, 1, VT, T16, false, dS, ld, qb.Scores());
        for (int64_t i = 0; i < nq; ++i) {
          const float D = RowDot(dob + i * C, ob + i * C, HS);
          GradRow(P + i * ld, dS + i * ld, lse_row[i], D, scale, qb.Lo(i), qb.Valid(i), nk,
                  qb.km);
          RowWords(dsw + i * np, dS + i * ld, nk);
        }
        for (int64_t p = 0; p < nqp; ++p) {
          const bool pair = 2 * p + 1 < nq;
          PairWords(dsi + p * nk, dS + 2 * p * ld, pair ? dS + (2 * p + 1) * ld : nullptr, nk);
          PairWords(pi + p * nk, P + 2 * p * ld, pair ? P + (2 * p + 1) * ld : nullptr, nk);
        }
        // dQ_blk = dS K (=), row i over its visible keys; dK += dS^T Q_blk and dV += P^T dO_blk,
        // key row j (from k0) over the block's queries that see it (QueryBlock's bands).
        DpProduct(nq, HS, np, 1.0f, dsw, np, 1, KI, HS, false,
                  dq + (b * T + t0) * q_stride + h * HS, q_stride, qb.Keys());
        float* dkb = dk + (b * T + qb.k0) * kv_stride + qb.kvh * HS;
        float* dvb = dv + (b * T + qb.k0) * kv_stride + qb.kvh * HS;
        DpProduct(nk, HS, nqp, 1.0f, dsi, 1, nk, qi, HS, true, dkb, kv_stride, qb.Queries());
        DpProduct(nk, HS, nqp, 1.0f, pi, 1, nk, doi, HS, true, dvb, kv_stride, qb.Queries());
      });
}
#endif  // TRAIND_DPBF16

// Which bf16 tiles a request gets: the dot-product tiles wherever the CPU has them (also faster
// than oneDNN's matmuls for bidirectional bert T=512: forward 7.6 vs 8.4 ms, backward 12.4-13.3
// vs 15.1-15.7, `ops_bench attn`), else oneDNN's bf16 matmuls where they were measured to pay,
// else none (fp32).
enum class Bf16Tiles { kNone, kDotProducts, kOneDnn };

bool dot_products_disabled = false;  // SetBf16DotProductsForTesting
bool bf16_tiles_disabled = false;    // SetBf16AttentionTilesForTesting

}  // namespace

bool Bf16DotProductsNative() {
#if TRAIND_DPBF16
  static const bool native = __builtin_cpu_supports("avx512bf16") != 0;
  return native && !dot_products_disabled;
#else
  return false;
#endif
}

void SetBf16DotProductsForTesting(bool enabled) { dot_products_disabled = !enabled; }
void SetBf16AttentionTilesForTesting(bool enabled) { bf16_tiles_disabled = !enabled; }

namespace {

Bf16Tiles ChooseBf16Tiles(DType operand_type, bool causal, int64_t T, int64_t HS) {
  if (operand_type != DType::kBF16 || bf16_tiles_disabled) return Bf16Tiles::kNone;
  if (HS % 2 == 0 && HS <= 512 && Bf16DotProductsNative()) return Bf16Tiles::kDotProducts;
  if (!causal && T >= 256 && Bf16TileProductsNative()) return Bf16Tiles::kOneDnn;
  return Bf16Tiles::kNone;
}

}  // namespace

bool UseBf16Tiles(DType operand_type, bool causal, int64_t T, int64_t HS) {
  return ChooseBf16Tiles(operand_type, causal, T, HS) != Bf16Tiles::kNone;
}

void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                      int64_t kv_stride, bool causal, const int32_t* key_mask,
                      DType operand_type, int64_t window, int nt, const int32_t* doc_start) {
  window = EffectiveWindow(window, T);
  const Bf16Tiles bf16 = ChooseBf16Tiles(operand_type, causal, T, HS);
  if (bf16 != Bf16Tiles::kNone) {
#if TRAIND_DPBF16
    if (bf16 == Bf16Tiles::kDotProducts) {
      AttentionForwardDp(out, lse, q, k, v, B, T, NH, NKV, HS, q_stride, kv_stride, causal,
                         key_mask, window, nt, doc_start);
      return;
    }
#endif
    AttentionForward16(out, lse, q, k, v, B, T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask,
                       window, nt, doc_start);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  const int64_t T16 = PanelStride(T);
  // K^T of every (sequence, kv head), (HS, T16) each, zero past the sequence's visible keys.
  static thread_local std::vector<float> kt_pack;
  kt_pack.resize(static_cast<size_t>(B * NKV * HS * T16));
  float* kts = kt_pack.data();
  static thread_local std::vector<float> tile;  // per thread: (kQBlock, T16) scores / probabilities
  ForwardBlocks(
      out, lse, B, T, NH, NKV, HS, causal, key_mask, window, doc_start, nt,
      [&](int64_t bk, int64_t b, int64_t kvh, int64_t key_end) {
        TransposeRows(kts + bk * HS * T16, T16, k + b * T * kv_stride + kvh * HS, kv_stride,
                      key_end, T16, HS);
      },
      [&](const QueryBlock& qb) {
        tile.resize(static_cast<size_t>(kQBlock * T16));
        float* S = tile.data();
        const int64_t b = qb.b, h = qb.h, t0 = qb.t0, nq = qb.nq, nk = qb.nk;
        // The tile's keys k0..k0+nk-1: K^T's columns and V's rows from k0 (k0 + nk rounded up
        // to 16 stays within the panel's T16 columns: k0 is a multiple of 16).
        const float* KT = kts + (b * NKV + qb.kvh) * HS * T16 + qb.k0;
        const float* vb = v + (b * T + qb.k0) * kv_stride + qb.kvh * HS;
        float* lse_row = lse + (b * NH + h) * T + t0;
        const int64_t ld = PanelStride(nk);
        // S(nq, nk rounded up to 16) = scale * Q_blk K^T, row i against keys < t0 + i + 1 when
        // causal.
        TileProduct(nq, RoundUp16(nk), HS, scale, q + (b * T + t0) * q_stride + h * HS, q_stride,
                    1, KT, T16, false, S, ld, qb.Scores());
        for (int64_t i = 0; i < nq; ++i)
          lse_row[i] = SoftmaxRow(S + i * ld, qb.Lo(i), qb.Valid(i), nk, qb.km);
        // O_blk(nq, HS) = P V, row i summing over its visible keys.
        TileProduct(nq, HS, nk, 1.0f, S, ld, 1, vb, kv_stride, false,
                    out + (b * T + t0) * C + h * HS, C, qb.Keys());
      });
}

void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                       int64_t kv_stride, bool causal, const int32_t* key_mask,
                       DType operand_type, int64_t window, int nt, const int32_t* doc_start) {
  window = EffectiveWindow(window, T);
  const Bf16Tiles bf16 = ChooseBf16Tiles(operand_type, causal, T, HS);
  if (bf16 != Bf16Tiles::kNone) {
#if TRAIND_DPBF16
    if (bf16 == Bf16Tiles::kDotProducts) {
      AttentionBackwardDp(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, q_stride,
                          kv_stride, causal, key_mask, window, nt, doc_start);
      return;
    }
#endif
    AttentionBackward16(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, q_stride,
                        kv_stride, causal, key_mask, window, nt, doc_start);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t C = NH * HS;
  const int64_t T16 = PanelStride(T);
  // Per thread: P and dP/dS, (kQBlock, T16) each, then K^T and V^T, (HS, T16) each.
  static thread_local std::vector<float> tiles;
  BackwardBlocks(
      dq, dk, dv, B, T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask, window, doc_start, nt,
      [&](int64_t b, int64_t kvh, int64_t key_end) {
        tiles.resize(static_cast<size_t>(2 * (kQBlock + HS) * T16));
        float* KT = tiles.data() + 2 * kQBlock * T16;
        TransposeRows(KT, T16, k + b * T * kv_stride + kvh * HS, kv_stride, key_end, T16, HS);
        TransposeRows(KT + HS * T16, T16, v + b * T * kv_stride + kvh * HS, kv_stride, key_end,
                      T16, HS);
      },
      [&](const QueryBlock& qb) {
        float* P = tiles.data();
        float* dS = P + kQBlock * T16;
        // K^T's and V^T's columns from the tile's first key k0 (a multiple of 16).
        const float* KT = dS + kQBlock * T16 + qb.k0;
        const float* VT = KT + HS * T16;
        const int64_t b = qb.b, h = qb.h, t0 = qb.t0, nq = qb.nq, nk = qb.nk;
        const float* qb_rows = q + (b * T + t0) * q_stride + h * HS;
        const float* dob = dout + (b * T + t0) * C + h * HS;
        const float* ob = out + (b * T + t0) * C + h * HS;
        const float* lse_row = lse + (b * NH + h) * T + t0;
        const int64_t ld = PanelStride(nk), nk16 = RoundUp16(nk);
        // P = exp(scale * Q K^T - lse); dP = dO V^T; dS = P (dP - D) scale. Row i against its
        // visible keys (QueryBlock's bands).
        TileProduct(nq, nk16, HS, scale, qb_rows, q_stride, 1, KT, T16, false, P, ld,
                    qb.Scores());
        TileProduct(nq, nk16, HS, 1.0f, dob, C, 1, VT, T16, false, dS, ld, qb.Scores());
        for (int64_t i = 0; i < nq; ++i) {
          const float D = Dot(dob + i * C, ob + i * C, HS);
          GradRow(P + i * ld, dS + i * ld, lse_row[i], D, scale, qb.Lo(i), qb.Valid(i), nk,
                  qb.km);
        }
        // dQ_blk = dS K (=), row i over its visible keys; dK += dS^T Q_blk and dV += P^T dO_blk,
        // key row j (from k0) over the block's queries that see it.
        TileProduct(nq, HS, nk, 1.0f, dS, ld, 1, k + (b * T + qb.k0) * kv_stride + qb.kvh * HS,
                    kv_stride, false, dq + (b * T + t0) * q_stride + h * HS, q_stride, qb.Keys());
        float* dkb = dk + (b * T + qb.k0) * kv_stride + qb.kvh * HS;
        float* dvb = dv + (b * T + qb.k0) * kv_stride + qb.kvh * HS;
        TileProduct(nk, HS, nq, 1.0f, dS, 1, ld, qb_rows, q_stride, true, dkb, kv_stride,
                    qb.Queries());
        TileProduct(nk, HS, nq, 1.0f, P, 1, ld, dob, C, true, dvb, kv_stride, qb.Queries());
      });
}

// One query row per (sequence, head) against the first T cached rows (the last `window` of
// them with a window): the scores, their softmax (SoftmaxRow, as the forward) and the weighted
// sum of the value rows.
void AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                     int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                     int64_t q_stride, int64_t kv_stride, int64_t window, int nt) {
  if (EffectiveWindow(window, T) > 0) {  // the rows before the window: outside it, not read
    const int64_t first = T - window;
    k += first * kv_stride;
    v += first * kv_stride;
    T = window;
  }
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
      SoftmaxRow(s, 0, T, T, nullptr);
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

// ---- 16-bit attention tensors (AttentionForward16Bit / AttentionBackward16Bit) ----

namespace {

// q, k and v widened to fp32 with their strides (dq, dk, dv share them), per calling thread.
struct Widened {
  const float* q;
  const float* k;
  const float* v;
};

// Widens `cols` elements of each of N rows (stride `stride`) of src into dst (the same stride).
void WidenRows(float* dst, const void* src, DType type, int64_t N, int64_t cols, int64_t stride,
               int nt) {
  if (cols == stride) {
    Cast(dst, DType::kF32, src, type, N * cols, nt);
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = 0; r < N; ++r) Cast(dst + r * stride, DType::kF32, s + r * stride, type, cols, 1);
}

Widened WidenQkv(std::vector<float>* buf, const void* q, const void* k, const void* v, DType type,
                 int64_t N, int64_t QW, int64_t KW, int64_t q_stride, int64_t kv_stride, int nt) {
  const auto* q16 = static_cast<const uint16_t*>(q);
  const auto* k16 = static_cast<const uint16_t*>(k);
  const auto* v16 = static_cast<const uint16_t*>(v);
  if (q_stride == kv_stride && k16 == q16 + QW && v16 == k16 + KW) {  // one fused qkv row
    buf->resize(static_cast<size_t>(N * q_stride));
    float* f = buf->data();
    WidenRows(f, q, type, N, QW + 2 * KW, q_stride, nt);
    return {f, f + QW, f + QW + KW};
  }
  buf->resize(static_cast<size_t>(N * (q_stride + 2 * kv_stride)));
  float* qf = buf->data();
  float* kf = qf + N * q_stride;
  float* vf = kf + N * kv_stride;
  WidenRows(qf, q, type, N, QW, q_stride, nt);
  WidenRows(kf, k, type, N, KW, kv_stride, nt);
  WidenRows(vf, v, type, N, KW, kv_stride, nt);
  return {qf, kf, vf};
}

}  // namespace

void AttentionForward16Bit(void* out, float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, bool causal,
                           const int32_t* key_mask, int64_t window, int nt,
                           const int32_t* doc_start) {
  const int64_t N = B * T, QW = NH * HS;
  static thread_local std::vector<float> qkv_f, out_f;
  out_f.resize(static_cast<size_t>(N * QW));
#if TRAIND_DPBF16
  if (ChooseBf16Tiles(type, causal, T, HS) == Bf16Tiles::kDotProducts) {  // bf16 read as it is
    const auto* q16 = static_cast<const uint16_t*>(q);
    AttentionForwardDp(out_f.data(), lse, q16, static_cast<const uint16_t*>(k),
                       static_cast<const uint16_t*>(v), B, T, NH, NKV, HS, q_stride, kv_stride,
                       causal, key_mask, EffectiveWindow(window, T), nt, doc_start);
    Cast(out, type, out_f.data(), DType::kF32, N * QW, nt);
    return;
  }
#endif
  const Widened w = WidenQkv(&qkv_f, q, k, v, type, N, QW, NKV * HS, q_stride, kv_stride, nt);
  AttentionForward(out_f.data(), lse, w.q, w.k, w.v, B, T, NH, NKV, HS, q_stride, kv_stride,
                   causal, key_mask, type, window, nt, doc_start);
  Cast(out, type, out_f.data(), DType::kF32, N * QW, nt);
}

void AttentionBackward16Bit(float* dq, float* dk, float* dv, const void* dout, const void* out,
                            const float* lse, const void* q, const void* k, const void* v,
                            DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                            int64_t q_stride, int64_t kv_stride, bool causal,
                            const int32_t* key_mask, int64_t window, int nt,
                            const int32_t* doc_start) {
  const int64_t N = B * T, QW = NH * HS;
#if TRAIND_DPBF16
  if (ChooseBf16Tiles(type, causal, T, HS) == Bf16Tiles::kDotProducts) {  // bf16 read as it is
    AttentionBackwardDp(dq, dk, dv, static_cast<const uint16_t*>(dout),
                        static_cast<const uint16_t*>(out), lse, static_cast<const uint16_t*>(q),
                        static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), B, T,
                        NH, NKV, HS, q_stride, kv_stride, causal, key_mask,
                        EffectiveWindow(window, T), nt, doc_start);
    return;
  }
#endif
  static thread_local std::vector<float> qkv_f, dout_out_f;
  const Widened w = WidenQkv(&qkv_f, q, k, v, type, N, QW, NKV * HS, q_stride, kv_stride, nt);
  dout_out_f.resize(static_cast<size_t>(2 * N * QW));
  float* dout_f = dout_out_f.data();
  float* out_f = dout_f + N * QW;
  Cast(dout_f, DType::kF32, dout, type, N * QW, nt);
  Cast(out_f, DType::kF32, out, type, N * QW, nt);
  AttentionBackward(dq, dk, dv, dout_f, out_f, lse, w.q, w.k, w.v, B, T, NH, NKV, HS, q_stride,
                    kv_stride, causal, key_mask, type, window, nt, doc_start);
}

}  // namespace traind::engine::cpu
