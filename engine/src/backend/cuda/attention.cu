// Self-attention of the GPU backend: our own tiled flash-style kernels (online softmax, no (T,T)
// buffer), GQA (query head h reads kv head h / (NH/NKV)), strided q/k/v rows; causal (keys j <= i)
// or not (every key), with an optional key padding mask (key_mask[b*T + j] == 0: key j of
// sequence b gets weight exactly 0; a query that sees no key gets out = 0, lse = 0 and no
// gradient). Causal and not are the same kernels: a block-uniform key range and a predicate; the
// mask is staged per key tile in shared memory (the dk/dv kernels read their own key's flag).
// A sliding window (window > 0: query i also needs i - j < window, HF Mistral) is one more
// predicate, and the block-uniform ranges start at the first key the block's first query reaches
// (forward, dq) or end at the last query that reaches the block's last key (dk/dv): the key and
// query tiles outside every window of a block are skipped.
// Packed rows (doc_start[b*T + i]: the first row of query i's example) are one more predicate
// (j >= doc_start), and the forward and dq kernels start their key range at the earliest example
// start of the block's queries (read by one thread, shared through shared memory), so the key
// tiles of earlier examples are skipped.
//
// Head sizes up to 128 (every GPT-2 / LLaMA config) take the lane-group kernels: TPQ = 1, 2 or 4
// lanes share one query (or key) row, each holding 32 of its head elements in registers
// (interleaved 16-byte groups, so the lanes of a row read different shared-memory banks), with
// dot products summed across the group by warp shuffles; K/V (or Q/dout) tiles staged in shared
// memory and read as 16-byte vectors; the forward updates its online softmax once per chunk of 8
// keys. Loop bounds are block-uniform (the causal and padding masks are predicates), so the
// shuffles never diverge.
//   forward : writes out and lse (B, NH, T).
//   backward: D = rowsum(dout * out) (B, NH, T) into scratch; dk/dv with one lane group per key
//             over the query tiles of every head of its group (sums the group, writes =); dq with
//             one lane group per query over the key tiles (writes =). No atomics: deterministic.
// Wider heads (129..256) take the first kernels (one thread per row, runtime-length loops).
//
// FLOPs (causal halves the square; without it, twice these): forward 2*B*NH*T^2*HS, backward 5*B*NH*T^2*HS (recomputes P
// twice). Bytes: q,k,v,out,lse read/written once per call plus re-reads through L2 (compute-bound
// at T >= 512). These fp32 kernels do not use tensor cores, so the fp32 SIMT rate (~60 TFLOP/s on
// an H100) bounds them: B=8, NH=12, T=1024, HS=64: forward 12.9 GFLOP -> >= 0.2 ms, backward
// 32 GFLOP -> >= 0.5 ms per call. Measured on an H100 (bench/gpu_run.sh profile, 12 layers):
// 0.89 ms forward and 2.8 ms backward per call (11-15 TFLOP/s; the first kernels took 6.9 and
// 37 ms). Tried and measured slower there: 16 head elements per lane (twice the lanes and warps per
// SM, half the registers): 83 ms per step against 75; docs/gpu.md.
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kQueriesPerBlock = 64;  // forward and dq: threads per block, one query each
constexpr int kKeysPerBlock = 64;     // dk/dv: threads per block, one key each
constexpr int kMaxHS = static_cast<int>(kMaxAttentionHeadSize);

// Rows staged per shared tile so that two tiles of HS floats fit in 32 KiB.
int TileRows(int64_t HS) { return HS <= 128 ? 32 : 16; }

struct Dims {
  int64_t T, NH, NKV, HS, q_stride, kv_stride;
  float scale;
  bool causal;
  const int32_t* key_mask;  // (B*T) or null
  int64_t window;           // 0: none; else 0 < window < T (a wider one changes nothing)
  const int32_t* doc_start;  // (B*T) or null: packed rows, query i sees keys >= doc_start[b*T+i]
};

// The first row of query i's example in a packed row (0 without doc_start).
__device__ __forceinline__ int64_t DocStart(const Dims& d, int64_t b, int64_t i) {
  return d.doc_start == nullptr ? 0 : d.doc_start[b * d.T + i];
}

// Whether key j of sequence b is not masked out.
__device__ __forceinline__ bool KeyVisible(const Dims& d, int64_t b, int64_t j) {
  return d.key_mask == nullptr || d.key_mask[b * d.T + j] != 0;
}

// Whether key j is inside query i's window (always without one).
__device__ __forceinline__ bool InWindow(const Dims& d, int64_t i, int64_t j) {
  return d.window == 0 || i - j < d.window;
}

// The first key query i0 (a block's first query) may see: the start of its window, else 0.
__device__ __forceinline__ int64_t FirstKey(const Dims& d, int64_t i0) {
  return d.window > 0 && i0 >= d.window ? i0 - d.window + 1 : 0;
}

// The first key any query of the block i0 .. i0+rows-1 may see: FirstKey's, or the earliest first
// row of their examples when later. Called by one thread of the block (it reads `rows` entries).
__device__ __forceinline__ int64_t BlockFirstKey(const Dims& d, int64_t b, int64_t i0,
                                                 int64_t rows) {
  int64_t first = FirstKey(d, i0);
  if (d.doc_start == nullptr) return first;
  int64_t m = d.T;
  for (int64_t i = i0; i < i0 + rows && i < d.T; ++i) {
    const int64_t s = d.doc_start[b * d.T + i];
    m = s < m ? s : m;
  }
  return m > first ? m : first;
}

// One past the last query that may see key j1 (a block's last key): its window's end, else T.
__device__ __forceinline__ int64_t QueryEnd(const Dims& d, int64_t j1) {
  return d.window > 0 && j1 + d.window < d.T ? j1 + d.window : d.T;
}

__global__ void attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                         const float* v, Dims d, int tile) {
  GPU_DYNAMIC_SHARED(float, ks);  // (tile, HS) keys, then (tile, HS) values
  float* vs = ks + tile * d.HS;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (d.NH / d.NKV);
  const int64_t i = blockIdx.x * int64_t{kQueriesPerBlock} + threadIdx.x;
  const bool active = i < d.T;  // inactive threads still help load tiles and meet the barriers
  float qi[kMaxHS], acc[kMaxHS];
  if (active)
    for (int64_t e = 0; e < d.HS; ++e) {
      qi[e] = q[(b * d.T + i) * d.q_stride + h * d.HS + e];
      acc[e] = 0.0f;
    }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = (blockIdx.x + 1) * int64_t{kQueriesPerBlock} - 1;
  // causal: keys <= the block's last query; a window or packed rows: from the first key one of
  // its queries sees
  const int64_t j_end = d.causal && last < d.T - 1 ? last : d.T - 1;
  __shared__ int64_t first_key;
  if (threadIdx.x == 0)
    first_key = BlockFirstKey(d, b, blockIdx.x * int64_t{kQueriesPerBlock}, kQueriesPerBlock);
  __syncthreads();
  const int64_t j_begin = first_key;
  const int64_t di = active ? DocStart(d, b, i) : 0;
  for (int64_t j0 = j_begin; j0 <= j_end; j0 += tile) {
    __syncthreads();  // the previous tile is no longer read
    for (int64_t e = threadIdx.x; e < tile * d.HS; e += blockDim.x) {
      const int64_t j = j0 + e / d.HS, c = e % d.HS;
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + c;
      ks[e] = j < d.T ? k[off] : 0.0f;
      vs[e] = j < d.T ? v[off] : 0.0f;
    }
    __syncthreads();
    if (!active || (d.causal && j0 > i)) continue;
    const int64_t lim = d.causal ? i - j0 + 1 : d.T - j0;
    const int64_t n = lim < tile ? lim : tile;
    float sc[32];
    float tile_max = -INFINITY;
    for (int64_t jj = 0; jj < n; ++jj) {
      float s = 0.0f;
      for (int64_t e = 0; e < d.HS; ++e) s += qi[e] * ks[jj * d.HS + e];
      sc[jj] = KeyVisible(d, b, j0 + jj) && InWindow(d, i, j0 + jj) && j0 + jj >= di
                   ? s * d.scale
                   : -INFINITY;
      tile_max = fmaxf(tile_max, sc[jj]);
    }
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;  // no visible key yet
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= corr;
    for (int64_t e = 0; e < d.HS; ++e) acc[e] *= corr;
    for (int64_t jj = 0; jj < n; ++jj) {
      if (sc[jj] == -INFINITY) continue;
      const float p = expf(sc[jj] - m_new);
      l += p;
      for (int64_t e = 0; e < d.HS; ++e) acc[e] += p * vs[jj * d.HS + e];
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0: no visible key, out = 0
  for (int64_t e = 0; e < d.HS; ++e) out[(b * d.T + i) * d.NH * d.HS + h * d.HS + e] = acc[e] * inv;
  lse[(b * d.NH + h) * d.T + i] = l > 0.0f ? m + logf(l) : 0.0f;
}

// D[b, h, i] = sum_e dout[i, h, e] * out[i, h, e]: one thread per (b, i, h).
__global__ void attention_delta_kernel(float* D, const float* dout, const float* out, int64_t B,
                                       Dims d) {
  const int64_t total = B * d.T * d.NH;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = p % d.NH, row = p / d.NH;  // row = b*T + i
    const float* a = dout + row * d.NH * d.HS + h * d.HS;
    const float* o = out + row * d.NH * d.HS + h * d.HS;
    float s = 0.0f;
    for (int64_t e = 0; e < d.HS; ++e) s += a[e] * o[e];
    const int64_t b = row / d.T, i = row % d.T;
    D[(b * d.NH + h) * d.T + i] = s;
  }
}

// dk, dv for one key per thread, summed over the query heads of its kv group.
__global__ void attention_dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                                      const float* D, const float* q, const float* k,
                                      const float* v, Dims d, int tile) {
  GPU_DYNAMIC_SHARED(float, qs);  // (tile, HS) queries, (tile, HS) dout, (tile) lse, (tile) D
  float* dos = qs + tile * d.HS;
  float* ls = dos + tile * d.HS;
  float* ds_ = ls + tile;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, group = d.NH / d.NKV;
  const int64_t j = blockIdx.x * int64_t{kKeysPerBlock} + threadIdx.x;
  const bool active = j < d.T;
  const bool visible = active && KeyVisible(d, b, j);  // a masked key gets dk = dv = 0
  float kj[kMaxHS], vj[kMaxHS], dkj[kMaxHS], dvj[kMaxHS];
  if (active)
    for (int64_t e = 0; e < d.HS; ++e) {
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + e;
      kj[e] = k[off];
      vj[e] = v[off];
      dkj[e] = 0.0f;
      dvj[e] = 0.0f;
    }
  // causal: earlier queries see no key here; a window: later ones neither
  const int64_t i_begin = d.causal ? blockIdx.x * int64_t{kKeysPerBlock} : 0;
  const int64_t i_end = QueryEnd(d, (blockIdx.x + 1) * int64_t{kKeysPerBlock} - 1);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = i_begin; i0 < i_end; i0 += tile) {
      __syncthreads();
      for (int64_t e = threadIdx.x; e < tile * d.HS; e += blockDim.x) {
        const int64_t i = i0 + e / d.HS, c = e % d.HS;
        qs[e] = i < d.T ? q[(b * d.T + i) * d.q_stride + h * d.HS + c] : 0.0f;
        dos[e] = i < d.T ? dout[(b * d.T + i) * d.NH * d.HS + h * d.HS + c] : 0.0f;
      }
      for (int64_t e = threadIdx.x; e < tile; e += blockDim.x) {
        const int64_t i = i0 + e;
        ls[e] = i < d.T ? lse[(b * d.NH + h) * d.T + i] : 0.0f;
        ds_[e] = i < d.T ? D[(b * d.NH + h) * d.T + i] : 0.0f;
      }
      __syncthreads();
      if (!visible) continue;
      for (int64_t ii = 0; ii < tile; ++ii) {
        const int64_t i = i0 + ii;
        if ((d.causal && i < j) || i >= d.T || !InWindow(d, i, j) || j < DocStart(d, b, i))
          continue;
        const float* qi = qs + ii * d.HS;
        const float* doi = dos + ii * d.HS;
        float s = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < d.HS; ++e) {
          s += qi[e] * kj[e];
          dp += doi[e] * vj[e];
        }
        const float p = expf(s * d.scale - ls[ii]);
        const float dsc = p * (dp - ds_[ii]) * d.scale;
        for (int64_t e = 0; e < d.HS; ++e) {
          dvj[e] += p * doi[e];
          dkj[e] += dsc * qi[e];
        }
      }
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < d.HS; ++e) {
    const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + e;
    dk[off] = dkj[e];
    dv[off] = dvj[e];
  }
}

// dq for one query per thread over the key tiles it sees.
__global__ void attention_dq_kernel(float* dq, const float* dout, const float* lse, const float* D,
                                    const float* q, const float* k, const float* v, Dims d,
                                    int tile) {
  GPU_DYNAMIC_SHARED(float, ks);  // (tile, HS) keys, then (tile, HS) values
  float* vs = ks + tile * d.HS;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (d.NH / d.NKV);
  const int64_t i = blockIdx.x * int64_t{kQueriesPerBlock} + threadIdx.x;
  const bool active = i < d.T;
  float qi[kMaxHS], doi[kMaxHS], dqi[kMaxHS];
  float li = 0.0f, Di = 0.0f;
  if (active) {
    for (int64_t e = 0; e < d.HS; ++e) {
      qi[e] = q[(b * d.T + i) * d.q_stride + h * d.HS + e];
      doi[e] = dout[(b * d.T + i) * d.NH * d.HS + h * d.HS + e];
      dqi[e] = 0.0f;
    }
    li = lse[(b * d.NH + h) * d.T + i];
    Di = D[(b * d.NH + h) * d.T + i];
  }
  const int64_t last = (blockIdx.x + 1) * int64_t{kQueriesPerBlock} - 1;
  const int64_t j_end = d.causal && last < d.T - 1 ? last : d.T - 1;
  __shared__ int64_t first_key;
  if (threadIdx.x == 0)
    first_key = BlockFirstKey(d, b, blockIdx.x * int64_t{kQueriesPerBlock}, kQueriesPerBlock);
  __syncthreads();
  const int64_t j_begin = first_key;
  const int64_t di = active ? DocStart(d, b, i) : 0;
  for (int64_t j0 = j_begin; j0 <= j_end; j0 += tile) {
    __syncthreads();
    for (int64_t e = threadIdx.x; e < tile * d.HS; e += blockDim.x) {
      const int64_t j = j0 + e / d.HS, c = e % d.HS;
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + c;
      ks[e] = j < d.T ? k[off] : 0.0f;
      vs[e] = j < d.T ? v[off] : 0.0f;
    }
    __syncthreads();
    if (!active || (d.causal && j0 > i)) continue;
    const int64_t lim = d.causal ? i - j0 + 1 : d.T - j0;
    const int64_t n = lim < tile ? lim : tile;
    for (int64_t jj = 0; jj < n; ++jj) {
      if (!KeyVisible(d, b, j0 + jj) || !InWindow(d, i, j0 + jj) || j0 + jj < di) continue;
      const float* kr = ks + jj * d.HS;
      const float* vr = vs + jj * d.HS;
      float s = 0.0f, dp = 0.0f;
      for (int64_t e = 0; e < d.HS; ++e) {
        s += qi[e] * kr[e];
        dp += doi[e] * vr[e];
      }
      const float p = expf(s * d.scale - li);
      const float dsc = p * (dp - Di) * d.scale;
      for (int64_t e = 0; e < d.HS; ++e) dqi[e] += dsc * kr[e];
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < d.HS; ++e) dq[(b * d.T + i) * d.q_stride + h * d.HS + e] = dqi[e];
}

// ---- lane-group kernels (HS <= 128) ----

constexpr int kRows = 64;   // queries (forward, dq) or keys (dk/dv) per block
constexpr int kQuads = 8;   // 16-byte groups of head elements per lane: 32 floats
constexpr int kChunk = 8;   // forward: keys per online-softmax update (independent dot products)
// dq: keys whose dot products run together (2: 218 registers with the window predicate; 4 spills,
// per ptxas -v for sm_90). dk/dv take one query at a time (238 registers; 2 at a time spills).
constexpr int kDqChunk = 2;

struct alignas(16) Quad {
  float x, y, z, w;
};

template <int TPQ>
struct Group {
  static constexpr int kHSP = 32 * TPQ;                 // head size padded with zeros
  static constexpr int kTile = TPQ == 4 ? 32 : 64;      // rows per shared tile (2 tiles <= 32 KiB)
  static constexpr int kThreads = kRows * TPQ;
  // Element t (0..3) of lane group-member `sub`'s quad `q`: the head element it holds.
  static __device__ __forceinline__ int Elem(int sub, int q, int t) { return 4 * (sub + TPQ * q) + t; }
  // The sum of x over the TPQ lanes of a row (consecutive lanes); every lane gets it.
  static __device__ __forceinline__ float Sum(float x) {
    GPU_UNROLL
    for (int o = 1; o < TPQ; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
  // Loads this lane's 32 elements of a row of HS floats (zeros past HS), times `mul`.
  static __device__ __forceinline__ void Load(float (&r)[4 * kQuads], const float* row, int64_t HS,
                                              int sub, float mul) {
    GPU_UNROLL
    for (int q = 0; q < kQuads; ++q)
      GPU_UNROLL
      for (int t = 0; t < 4; ++t) {
        const int e = Elem(sub, q, t);
        r[4 * q + t] = e < HS ? row[e] * mul : 0.0f;
      }
  }
  static __device__ __forceinline__ void Store(float* row, const float (&r)[4 * kQuads], int64_t HS,
                                               int sub, float mul) {
    GPU_UNROLL
    for (int q = 0; q < kQuads; ++q)
      GPU_UNROLL
      for (int t = 0; t < 4; ++t) {
        const int e = Elem(sub, q, t);
        if (e < HS) row[e] = r[4 * q + t] * mul;
      }
  }
  // This lane's part of dot(r, shared row `s` of kHSP floats).
  static __device__ __forceinline__ float Dot(const float (&r)[4 * kQuads], const float* s, int sub) {
    const Quad* s4 = reinterpret_cast<const Quad*>(s);
    float acc = 0.0f;
    GPU_UNROLL
    for (int q = 0; q < kQuads; ++q) {
      const Quad w = s4[sub + TPQ * q];
      acc += r[4 * q] * w.x + r[4 * q + 1] * w.y + r[4 * q + 2] * w.z + r[4 * q + 3] * w.w;
    }
    return acc;
  }
  // r += a * (shared row `s`), this lane's elements.
  static __device__ __forceinline__ void Axpy(float (&r)[4 * kQuads], float a, const float* s,
                                              int sub) {
    const Quad* s4 = reinterpret_cast<const Quad*>(s);
    GPU_UNROLL
    for (int q = 0; q < kQuads; ++q) {
      const Quad w = s4[sub + TPQ * q];
      r[4 * q] += a * w.x;
      r[4 * q + 1] += a * w.y;
      r[4 * q + 2] += a * w.z;
      r[4 * q + 3] += a * w.w;
    }
  }
  // Stages rows r0 .. r0+kTile-1 (head `head`, row stride `stride`) of `src` into `dst`
  // (kTile x kHSP, zeros past T and past HS); all threads of the block call it.
  static __device__ __forceinline__ void Stage(float* dst, const float* src, int64_t b, int64_t r0,
                                               int64_t head, int64_t stride, const Dims& d) {
    for (int idx = threadIdx.x; idx < kTile * kHSP; idx += kThreads) {
      const int r = idx / kHSP, c = idx % kHSP;
      const int64_t row = r0 + r;
      dst[idx] = row < d.T && c < d.HS ? src[(b * d.T + row) * stride + head * d.HS + c] : 0.0f;
    }
  }
  // dst[r] = 1 when key r0 + r exists and is not masked, else 0 (kTile floats); only with a mask.
  static __device__ __forceinline__ void StageMask(float* dst, int64_t b, int64_t r0,
                                                   const Dims& d) {
    for (int r = threadIdx.x; r < kTile; r += kThreads)
      dst[r] = r0 + r < d.T && d.key_mask[b * d.T + r0 + r] != 0 ? 1.0f : 0.0f;
  }
};

template <int TPQ>
__global__ void __launch_bounds__(kRows * TPQ)
    attention_forward_group_kernel(float* out, float* lse, const float* q, const float* k,
                                   const float* v, Dims d) {
  using G = Group<TPQ>;
  GPU_DYNAMIC_SHARED(float, ks);  // (kTile, kHSP) keys, then values, then (kTile) key flags
  float* vs = ks + G::kTile * G::kHSP;
  float* kms = vs + G::kTile * G::kHSP;
  const bool masked = d.key_mask != nullptr;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (d.NH / d.NKV);
  const int sub = static_cast<int>(threadIdx.x) % TPQ;
  // Longest first: the last query block sees the most keys, so it is scheduled first.
  const int64_t qblock = gridDim.x - 1 - blockIdx.x;
  const int64_t i = qblock * kRows + threadIdx.x / TPQ;
  const bool active = i < d.T;  // inactive lanes still stage tiles and join the shuffles
  float qi[4 * kQuads], acc[4 * kQuads];
  if (active) {
    G::Load(qi, q + (b * d.T + i) * d.q_stride + h * d.HS, d.HS, sub, d.scale);
  } else {
    GPU_UNROLL
    for (float& x : qi) x = 0.0f;
  }
  GPU_UNROLL
  for (float& x : acc) x = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t block_last = (qblock + 1) * kRows - 1;
  // causal: keys <= the block's last query; else every key. A window: from the first key the
  // block's first query sees.
  const int64_t last = d.causal && block_last < d.T - 1 ? block_last : d.T - 1;
  __shared__ int64_t first_key;  // packed rows: from the earliest example start of the block
  if (threadIdx.x == 0) first_key = BlockFirstKey(d, b, qblock * kRows, kRows);
  __syncthreads();
  const int64_t di = active ? DocStart(d, b, i) : 0;
  for (int64_t j0 = first_key; j0 <= last; j0 += G::kTile) {
    __syncthreads();  // the previous tile is no longer read
    G::Stage(ks, k, b, j0, kvh, d.kv_stride, d);
    G::Stage(vs, v, b, j0, kvh, d.kv_stride, d);
    if (masked) G::StageMask(kms, b, j0, d);
    __syncthreads();
    const int n = static_cast<int>(last - j0 + 1 < G::kTile ? last - j0 + 1 : G::kTile);
    for (int c0 = 0; c0 < n; c0 += kChunk) {
      // All kChunk rows exist in the tile (kTile is a multiple of kChunk): the dot products run
      // without branches, as independent chains; rows past n or the query are masked after.
      float sc[kChunk];
      GPU_UNROLL
      for (int c = 0; c < kChunk; ++c) sc[c] = G::Dot(qi, ks + (c0 + c) * G::kHSP, sub);
      float chunk_max = -INFINITY;
      GPU_UNROLL
      for (int c = 0; c < kChunk; ++c) {
        const int jj = c0 + c;
        const float s = G::Sum(sc[c]);
        const bool visible = active && jj < n && (!d.causal || j0 + jj <= i) &&
                             (!masked || kms[jj] != 0.0f) && InWindow(d, i, j0 + jj) &&
                             j0 + jj >= di;
        sc[c] = visible ? s : -INFINITY;
        chunk_max = fmaxf(chunk_max, sc[c]);
      }
      const float m_new = fmaxf(m, chunk_max);
      if (m_new == -INFINITY) continue;  // no visible key yet (thread-local; no shuffles below)
      const float corr = expf(m - m_new);  // 0 while m is -inf
      l *= corr;
      GPU_UNROLL
      for (float& x : acc) x *= corr;
      GPU_UNROLL
      for (int c = 0; c < kChunk; ++c) {
        if (sc[c] == -INFINITY) continue;
        const float p = expf(sc[c] - m_new);
        l += p;
        G::Axpy(acc, p, vs + (c0 + c) * G::kHSP, sub);
      }
      m = m_new;
    }
  }
  if (!active) return;
  // l = 0 only when no key is visible (every key masked): out = 0, lse = 0.
  G::Store(out + (b * d.T + i) * d.NH * d.HS + h * d.HS, acc, d.HS, sub, l > 0.0f ? 1.0f / l : 0.0f);
  if (sub == 0) lse[(b * d.NH + h) * d.T + i] = l > 0.0f ? m + logf(l) : 0.0f;
}

template <int TPQ>
__global__ void __launch_bounds__(kRows * TPQ)
    attention_dq_group_kernel(float* dq, const float* dout, const float* lse, const float* D,
                              const float* q, const float* k, const float* v, Dims d) {
  using G = Group<TPQ>;
  GPU_DYNAMIC_SHARED(float, ks);  // (kTile, kHSP) keys, then values, then (kTile) key flags
  float* vs = ks + G::kTile * G::kHSP;
  float* kms = vs + G::kTile * G::kHSP;
  const bool masked = d.key_mask != nullptr;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / (d.NH / d.NKV);
  const int sub = static_cast<int>(threadIdx.x) % TPQ;
  // Longest first: the last query block sees the most keys, so it is scheduled first.
  const int64_t qblock = gridDim.x - 1 - blockIdx.x;
  const int64_t i = qblock * kRows + threadIdx.x / TPQ;
  const bool active = i < d.T;
  float qi[4 * kQuads], doi[4 * kQuads], dqi[4 * kQuads];
  float li = 0.0f, Di = 0.0f;
  if (active) {
    G::Load(qi, q + (b * d.T + i) * d.q_stride + h * d.HS, d.HS, sub, 1.0f);
    G::Load(doi, dout + (b * d.T + i) * d.NH * d.HS + h * d.HS, d.HS, sub, 1.0f);
    li = lse[(b * d.NH + h) * d.T + i];
    Di = D[(b * d.NH + h) * d.T + i];
  } else {
    GPU_UNROLL
    for (int e = 0; e < 4 * kQuads; ++e) qi[e] = doi[e] = 0.0f;
  }
  GPU_UNROLL
  for (float& x : dqi) x = 0.0f;
  const int64_t block_last = (qblock + 1) * kRows - 1;
  const int64_t last = d.causal && block_last < d.T - 1 ? block_last : d.T - 1;
  __shared__ int64_t first_key;  // packed rows: from the earliest example start of the block
  if (threadIdx.x == 0) first_key = BlockFirstKey(d, b, qblock * kRows, kRows);
  __syncthreads();
  const int64_t di = active ? DocStart(d, b, i) : 0;
  for (int64_t j0 = first_key; j0 <= last; j0 += G::kTile) {
    __syncthreads();
    G::Stage(ks, k, b, j0, kvh, d.kv_stride, d);
    G::Stage(vs, v, b, j0, kvh, d.kv_stride, d);
    if (masked) G::StageMask(kms, b, j0, d);
    __syncthreads();
    const int n = static_cast<int>(last - j0 + 1 < G::kTile ? last - j0 + 1 : G::kTile);
    for (int c0 = 0; c0 < n; c0 += kDqChunk) {  // block-uniform; rows past n are masked
      float s[kDqChunk], dp[kDqChunk];
      GPU_UNROLL
      for (int c = 0; c < kDqChunk; ++c) {
        s[c] = G::Dot(qi, ks + (c0 + c) * G::kHSP, sub);
        dp[c] = G::Dot(doi, vs + (c0 + c) * G::kHSP, sub);
      }
      GPU_UNROLL
      for (int c = 0; c < kDqChunk; ++c) {
        const int jj = c0 + c;
        const float sv = G::Sum(s[c]) * d.scale, dpv = G::Sum(dp[c]);
        const bool visible = active && jj < n && (!d.causal || j0 + jj <= i) &&
                             (!masked || kms[jj] != 0.0f) && InWindow(d, i, j0 + jj) &&
                             j0 + jj >= di;
        const float p = visible ? expf(sv - li) : 0.0f;
        G::Axpy(dqi, p * (dpv - Di) * d.scale, ks + jj * G::kHSP, sub);
      }
    }
  }
  if (!active) return;
  G::Store(dq + (b * d.T + i) * d.q_stride + h * d.HS, dqi, d.HS, sub, 1.0f);
}

template <int TPQ>
__global__ void __launch_bounds__(kRows * TPQ)
    attention_dkdv_group_kernel(float* dk, float* dv, const float* dout, const float* lse,
                                const float* D, const float* q, const float* k, const float* v,
                                Dims d) {
  using G = Group<TPQ>;
  GPU_DYNAMIC_SHARED(float, qs);  // (kTile, kHSP) queries, (kTile, kHSP) dout, (kTile) lse, D
  float* dos = qs + G::kTile * G::kHSP;
  float* ls = dos + G::kTile * G::kHSP;
  float* Ds = ls + G::kTile;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, group = d.NH / d.NKV;
  const int sub = static_cast<int>(threadIdx.x) % TPQ;
  const int64_t j = blockIdx.x * int64_t{kRows} + threadIdx.x / TPQ;
  const bool active = j < d.T;
  const bool visible = active && KeyVisible(d, b, j);  // a masked key gets dk = dv = 0
  float kj[4 * kQuads], vj[4 * kQuads], dkj[4 * kQuads], dvj[4 * kQuads];
  if (active) {
    G::Load(kj, k + (b * d.T + j) * d.kv_stride + kvh * d.HS, d.HS, sub, 1.0f);
    G::Load(vj, v + (b * d.T + j) * d.kv_stride + kvh * d.HS, d.HS, sub, 1.0f);
  } else {
    GPU_UNROLL
    for (int e = 0; e < 4 * kQuads; ++e) kj[e] = vj[e] = 0.0f;
  }
  GPU_UNROLL
  for (int e = 0; e < 4 * kQuads; ++e) dkj[e] = dvj[e] = 0.0f;
  // Block 0 (the first keys, seen by every later query) has the most work and starts first.
  // causal: earlier queries see no key here; a window: the queries past the last key's window
  // neither
  const int64_t i_begin = d.causal ? blockIdx.x * int64_t{kRows} : 0;
  const int64_t i_end = QueryEnd(d, (blockIdx.x + 1) * int64_t{kRows} - 1);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = i_begin; i0 < i_end; i0 += G::kTile) {
      __syncthreads();
      G::Stage(qs, q, b, i0, h, d.q_stride, d);
      G::Stage(dos, dout, b, i0, h, d.NH * d.HS, d);
      for (int e = threadIdx.x; e < G::kTile; e += G::kThreads) {
        const int64_t i = i0 + e;
        ls[e] = i < d.T ? lse[(b * d.NH + h) * d.T + i] : 0.0f;
        Ds[e] = i < d.T ? D[(b * d.NH + h) * d.T + i] : 0.0f;
      }
      __syncthreads();
      const int n = static_cast<int>(i_end - i0 < G::kTile ? i_end - i0 : G::kTile);
      for (int ii = 0; ii < n; ++ii) {  // block-uniform; the masks are predicates
        const float* qr = qs + ii * G::kHSP;
        const float* dor = dos + ii * G::kHSP;
        const float s = G::Sum(G::Dot(kj, qr, sub)) * d.scale;
        const float dp = G::Sum(G::Dot(vj, dor, sub));
        const bool sees = visible && (!d.causal || i0 + ii >= j) && InWindow(d, i0 + ii, j) &&
                          j >= DocStart(d, b, i0 + ii);
        const float p = sees ? expf(s - ls[ii]) : 0.0f;
        G::Axpy(dvj, p, dor, sub);
        G::Axpy(dkj, p * (dp - Ds[ii]) * d.scale, qr, sub);
      }
    }
  }
  if (!active) return;
  G::Store(dk + (b * d.T + j) * d.kv_stride + kvh * d.HS, dkj, d.HS, sub, 1.0f);
  G::Store(dv + (b * d.T + j) * d.kv_stride + kvh * d.HS, dvj, d.HS, sub, 1.0f);
}

// Lanes per row for head size HS: 1, 2 or 4; 0 when HS > 128 (the one-thread-per-row kernels).
int LanesPerRow(int64_t HS) { return HS <= 32 ? 1 : HS <= 64 ? 2 : HS <= 128 ? 4 : 0; }

template <int TPQ>
Status ForwardGroup(float* out, float* lse, const float* q, const float* k, const float* v,
                    int64_t B, const Dims& d, cudaStream_t stream) {
  using G = Group<TPQ>;
  const dim3 grid(static_cast<unsigned>((d.T + kRows - 1) / kRows), static_cast<unsigned>(d.NH),
                  static_cast<unsigned>(B));
  // + kTile key flags with a mask only (the unmasked launch's shared memory is unchanged)
  const size_t flags = d.key_mask != nullptr ? G::kTile : 0;
  const size_t shmem = (2 * size_t{G::kTile} * G::kHSP + flags) * sizeof(float);
  return GPU_LAUNCH(attention_forward_group_kernel<TPQ>, grid, G::kThreads, shmem, stream, out,
                    lse, q, k, v, d);
}

template <int TPQ>
Status BackwardGroup(float* dq, float* dk, float* dv, const float* dout, const float* lse,
                     const float* D, const float* q, const float* k, const float* v, int64_t B,
                     const Dims& d, cudaStream_t stream) {
  using G = Group<TPQ>;
  const dim3 kv_grid(static_cast<unsigned>((d.T + kRows - 1) / kRows),
                     static_cast<unsigned>(d.NKV), static_cast<unsigned>(B));
  const size_t kv_shmem = (2 * size_t{G::kTile} * G::kHSP + 2 * G::kTile) * sizeof(float);
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(attention_dkdv_group_kernel<TPQ>, kv_grid, G::kThreads,
                                    kv_shmem, stream, dk, dv, dout, lse, D, q, k, v, d));
  const dim3 q_grid(static_cast<unsigned>((d.T + kRows - 1) / kRows),
                    static_cast<unsigned>(d.NH), static_cast<unsigned>(B));
  const size_t flags = d.key_mask != nullptr ? G::kTile : 0;
  const size_t q_shmem = (2 * size_t{G::kTile} * G::kHSP + flags) * sizeof(float);
  return GPU_LAUNCH(attention_dq_group_kernel<TPQ>, q_grid, G::kThreads, q_shmem, stream, dq, dout,
                    lse, D, q, k, v, d);
}

Status CheckDims(const char* op, int64_t B, const Dims& d) {
  if (B < 0 || d.T < 0 || d.NH <= 0 || d.NKV <= 0 || d.NH % d.NKV != 0)
    return Status::InvalidArgument(std::string(op) + ": NH=" + std::to_string(d.NH) +
                                   " must be a positive multiple of NKV=" + std::to_string(d.NKV));
  if (d.HS <= 0 || d.HS > kMaxAttentionHeadSize)
    return Status::InvalidArgument(std::string(op) + ": head size " + std::to_string(d.HS) +
                                   " outside [1, " + std::to_string(kMaxAttentionHeadSize) + "]");
  if (d.q_stride < d.NH * d.HS || d.kv_stride < d.NKV * d.HS)
    return Status::InvalidArgument(std::string(op) + ": row strides (" +
                                   std::to_string(d.q_stride) + ", " + std::to_string(d.kv_stride) +
                                   ") shorter than the heads they hold");
  if (B > 65535 || d.NH > 65535)
    return Status::InvalidArgument(std::string(op) + ": B or NH over 65535");
  return Status::Ok();
}

Status CheckWindow(const char* op, int64_t window) {
  if (window < 0)
    return Status::InvalidArgument(std::string(op) + ": sliding window " + std::to_string(window) +
                                   " is negative (0 = no window)");
  return Status::Ok();
}

// window >= T sees every key a query could: the kernels take it as none.
Dims MakeDims(int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
              bool causal, const int32_t* key_mask, int64_t window, const int32_t* doc_start) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  return Dims{T,     NH,     NKV,      HS, q_stride, kv_stride,
              scale, causal, key_mask, window > 0 && window < T ? window : 0, doc_start};
}

}  // namespace

Status AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                        int64_t kv_stride, bool causal, const int32_t* key_mask, int64_t window,
                        cudaStream_t stream, const int32_t* doc_start) {
  const Dims d =
      MakeDims(T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask, window, doc_start);
  TRAIND_RETURN_IF_ERROR(CheckDims("AttentionForward", B, d));
  TRAIND_RETURN_IF_ERROR(CheckWindow("AttentionForward", window));
  if (B == 0 || T == 0) return Status::Ok();
  switch (LanesPerRow(HS)) {
    case 1: return ForwardGroup<1>(out, lse, q, k, v, B, d, stream);
    case 2: return ForwardGroup<2>(out, lse, q, k, v, B, d, stream);
    case 4: return ForwardGroup<4>(out, lse, q, k, v, B, d, stream);
    default: break;
  }
  const int tile = TileRows(HS);
  const dim3 grid(static_cast<unsigned>((T + kQueriesPerBlock - 1) / kQueriesPerBlock),
                  static_cast<unsigned>(NH), static_cast<unsigned>(B));
  const size_t shmem = 2 * static_cast<size_t>(tile * HS) * sizeof(float);
  return GPU_LAUNCH(attention_forward_kernel, grid, kQueriesPerBlock, shmem, stream, out, lse, q, k,
                    v, d, tile);
}

Status AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal,
                         const int32_t* key_mask, int64_t window, float* scratch,
                         cudaStream_t stream, const int32_t* doc_start) {
  const Dims d =
      MakeDims(T, NH, NKV, HS, q_stride, kv_stride, causal, key_mask, window, doc_start);
  TRAIND_RETURN_IF_ERROR(CheckDims("AttentionBackward", B, d));
  TRAIND_RETURN_IF_ERROR(CheckWindow("AttentionBackward", window));
  if (B == 0 || T == 0) return Status::Ok();
  const int tile = TileRows(HS);
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(attention_delta_kernel, GridFor(B * T * NH, 256), 256, 0,
                                    stream, scratch, dout, out, B, d));
  switch (LanesPerRow(HS)) {
    case 1: return BackwardGroup<1>(dq, dk, dv, dout, lse, scratch, q, k, v, B, d, stream);
    case 2: return BackwardGroup<2>(dq, dk, dv, dout, lse, scratch, q, k, v, B, d, stream);
    case 4: return BackwardGroup<4>(dq, dk, dv, dout, lse, scratch, q, k, v, B, d, stream);
    default: break;
  }
  const dim3 kv_grid(static_cast<unsigned>((T + kKeysPerBlock - 1) / kKeysPerBlock),
                     static_cast<unsigned>(NKV), static_cast<unsigned>(B));
  const size_t kv_shmem = (2 * static_cast<size_t>(tile * HS) + 2 * tile) * sizeof(float);
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(attention_dkdv_kernel, kv_grid, kKeysPerBlock, kv_shmem, stream,
                                    dk, dv, dout, lse, scratch, q, k, v, d, tile));
  const dim3 q_grid(static_cast<unsigned>((T + kQueriesPerBlock - 1) / kQueriesPerBlock),
                    static_cast<unsigned>(NH), static_cast<unsigned>(B));
  const size_t q_shmem = 2 * static_cast<size_t>(tile * HS) * sizeof(float);
  return GPU_LAUNCH(attention_dq_kernel, q_grid, kQueriesPerBlock, q_shmem, stream, dq, dout, lse,
                    scratch, q, k, v, d, tile);
}

TRAIND_GPU_END
