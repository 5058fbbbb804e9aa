// Tensor-core flash attention (FlashAttention-2) on 16-bit q, k, v (bf16 or fp16) with fp32
// accumulation: mma.sync m16n8k16, ldmatrix (.trans for the operands read along their rows'
// columns), cp.async into shared tiles (rows of 64/128/256 elements XOR-swizzled in 16-byte chunks,
// 80/96 padded by 16 bytes, so the eight rows of every ldmatrix hit distinct banks). Under simt
// the same code runs on the warp-collective emulation of backend/simt/simt_tc.h.
//
// Masks (block-uniform loops, per-element predicates): causal, the key padding mask, a sliding
// window, packed examples (doc_start: query i of row b sees key j only when
// j >= doc_start[b*T + i]), and the tails of T (rows past T zero-filled by cp.async and masked).
// A query that sees no key gets out = 0, lse = 0 and no gradient. GQA: query head h reads kv head
// h / (NH/NKV).
//
// Forward: one block per (query tile of 16*warps rows, head, sequence); each warp owns 16 query
// rows. Q is staged once (its fragments then held in registers for head sizes <= 128); K and V
// tiles are double-buffered (tile j+1 is copied with cp.async while tile j is used). S = Q K^T in
// registers, online softmax per row (max and rescale with two shuffles in the quad of lanes that
// share a row), P rounded to 16 bits and reused straight from the S accumulators as the A operand
// of O += P V. Writes out (16-bit) and lse (fp32, natural log).
// Backward: a pre-pass computes D = rowsum(dO * O) and zeroes the fp32 dq accumulator; then one
// block per (key tile of 16*warps keys, kv head, dimension slice, sequence): each warp owns 16 keys
// and loops over the query tiles of every head of its group (Q, dO, lse, D double-buffered where
// shared memory allows), recomputing S^T = K Q^T and dP^T = V dO^T, P^T = exp(S^T - lse),
// dS^T = P^T (dP^T - D); dV += P^T dO and dK += dS^T Q stay in registers (written once, =; GQA
// sums in them); dS goes through shared memory for dQ += dS K, added with fp32 atomics; a last pass
// rounds dq to 16 bits. Head dim 256 splits dK/dV/dQ into two 128-wide slices (blockIdx.y) so the
// accumulators fit in registers.
//
// FLOPs (non-causal; causal about half): forward 4*B*NH*T^2*HS, backward 10*B*NH*T^2*HS (S and
// dP recomputed, dV, dK, dQ). H100 roofline at 790 bf16 TFLOP/s: B=8, NH=12, T=1024, HS=64:
// forward 25.8 GFLOP -> >= 33 us, backward 64 GFLOP -> >= 82 us (not yet measured on a GPU).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_tc.h"
#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/tc_ops.cuh"

TRAIND_GPU_BEGIN
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A shared tile of rows x D 16-bit elements, addressed by (row, 16-byte chunk).
template <int D>
struct Tile {
  static constexpr bool kSwizzle = D % 64 == 0;
  static constexpr int kStride = kSwizzle ? D : D + 8;  // elements per row
  static constexpr int kChunks = D / 8;
  __device__ __forceinline__ static int Off(int row, int chunk) {
    return row * kStride + ((kSwizzle ? (chunk ^ (row & 7)) : chunk) << 3);
  }
};

struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t T, NH, NKV, q_stride, kv_stride;
  float scale;       // 1/sqrt(HS)
  float scale_log2;  // scale * log2(e)
  bool causal;
  const int32_t* key_mask;
  int64_t window;
  const int32_t* doc_start;
  // backward
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* dq_acc;          // (B*T rows of dq_acc_stride floats, NH heads of HS)
  int64_t dq_acc_stride;  // NH*HS (the scratch accumulator) or q_stride (fp32 dq itself)
  bool grads_f32;         // dq (accumulated in place), dk, dv fp32, else `type`
  float* delta;           // (B, NH, T)
};

// Whether query i of sequence b sees key j (ds: doc_start of query i, 0 when none).
__device__ __forceinline__ bool Visible(const Params& p, int64_t b, int64_t i, int64_t j, int ds) {
  if (i >= p.T || j >= p.T || j < ds) return false;
  if (p.causal && j > i) return false;
  if (p.window > 0 && i - j >= p.window) return false;
  return p.key_mask == nullptr || p.key_mask[b * p.T + j] != 0;
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ int DocStart(const Params& p, int64_t b, int64_t i) {
  return (p.doc_start != nullptr && i < p.T) ? p.doc_start[b * p.T + i] : 0;
}

// cp.async of kRows rows (from row0 on; rows >= T zero-filled) of D elements into a tile.
// `g` points at row 0 of the sequence, at the head's first element.
template <typename T16, int D, int kRows, int kThreads>
__device__ __forceinline__ void LoadTile(T16* s, const T16* g, int64_t row0, int64_t T,
                                         int64_t stride) {
  using L = Tile<D>;
  for (int idx = threadIdx.x; idx < kRows * L::kChunks; idx += kThreads) {
    const int r = idx / L::kChunks, c = idx % L::kChunks;
    const int64_t row = row0 + r;
    const bool valid = row < T;
    tc::CpAsync16(s + L::Off(r, c), valid ? g + row * stride + c * 8 : g, valid);
  }
}

template <typename T16>
__device__ __forceinline__ T16 FromFloat(float x) {
  if constexpr (std::is_same_v<T16, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// ---------------------------------------------------------------- forward
template <int D>
struct FwdCfg {
  static constexpr int kWarps = D == 256 ? 2 : 4;
  static constexpr int kBr = 16 * kWarps;                          // query rows per block
  static constexpr int kBc = D == 64 ? 64 : (D == 256 ? 16 : 32);  // keys per tile
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSmemBytes = (kBr + 4 * kBc) * Tile<D>::kStride * 2;
  static_assert(kSmemBytes <= 48 * 1024, "forward tiles exceed 48 KiB of shared memory");
};

// long function: one fused kernel (FA2 forward): the tile loop keeps its accumulators in registers
// long function: one fused kernel (FA2 forward): the tile loop keeps its accumulators in registers
template <typename T16, int D>
__global__ void __launch_bounds__(FwdCfg<D>::kThreads, 1) attn_tc_fwd_kernel(Params p) {
  using C = FwdCfg<D>;
  using L = Tile<D>;
  constexpr int kBc = C::kBc;
  GPU_DYNAMIC_SHARED(T16, smem);
  T16* sQ = smem;
  T16* sK = sQ + C::kBr * L::kStride;  // two buffers of kBc rows
  T16* sV = sK + 2 * kBc * L::kStride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * C::kBr;
  const int64_t kvh = h / (p.NH / p.NKV);
  const int64_t T = p.T;
  const T16* qg = static_cast<const T16*>(p.q) + b * T * p.q_stride + h * D;
  const T16* kg = static_cast<const T16*>(p.k) + b * T * p.kv_stride + kvh * D;
  const T16* vg = static_cast<const T16*>(p.v) + b * T * p.kv_stride + kvh * D;

  const int64_t row0 = q0 + warp * 16 + (lane >> 2), row1 = row0 + 8;
  const int ds0 = DocStart(p, b, row0), ds1 = DocStart(p, b, row1);
  // Packed rows: keys before the earliest example start of the block's queries are skipped. The
  // minimum goes through the first word of the Q tile (the tiles fill all 48 KiB), before Q lands.
  int ds_min = 0;
  if (p.doc_start != nullptr) {
    int* s_ds_min = reinterpret_cast<int*>(smem);
    if (threadIdx.x == 0) *s_ds_min = 0x7fffffff;
    __syncthreads();
    atomicMin(s_ds_min, row1 < T && ds1 < ds0 ? ds1 : (row0 < T ? ds0 : 0x7fffffff));
    __syncthreads();
    ds_min = *s_ds_min;
    __syncthreads();
  }

  LoadTile<T16, D, C::kBr, C::kThreads>(sQ, qg, q0, T, p.q_stride);
  tc::CpAsyncCommit();

  // Key tiles any query of the block can see (block-uniform).
  const int64_t n_kt = (T + kBc - 1) / kBc;
  int64_t kt_begin = 0, kt_end = n_kt;
  if (p.causal) kt_end = Min64(n_kt, (Min64(q0 + C::kBr, T) - 1) / kBc + 1);
  if (p.window > 0 && q0 - p.window + 1 > 0) kt_begin = (q0 - p.window + 1) / kBc;
  if (ds_min > kt_begin * kBc) kt_begin = Min64(ds_min, T - 1) / kBc;
  if (kt_begin >= kt_end) kt_begin = kt_end - 1;  // keep one tile: rows that see nothing get 0

  LoadTile<T16, D, kBc, C::kThreads>(sK, kg, kt_begin * kBc, T, p.kv_stride);
  LoadTile<T16, D, kBc, C::kThreads>(sV, vg, kt_begin * kBc, T, p.kv_stride);
  tc::CpAsyncCommit();

  float o[D / 8][4];
  GPU_UNROLL
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  // Head sizes up to 128 keep the warp's Q fragments in registers (loaded once, at the first key
  // tile); 256 re-reads them from shared memory per tile (its O accumulators need the registers).
  constexpr bool kQInRegs = D <= 128;
  uint32_t qf[kQInRegs ? D / 16 : 1][4];

  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = static_cast<int>((kt - kt_begin) & 1);
    if (kt + 1 < kt_end) {
      LoadTile<T16, D, kBc, C::kThreads>(sK + (buf ^ 1) * kBc * L::kStride, kg, (kt + 1) * kBc, T,
                                         p.kv_stride);
      LoadTile<T16, D, kBc, C::kThreads>(sV + (buf ^ 1) * kBc * L::kStride, vg, (kt + 1) * kBc, T,
                                         p.kv_stride);
      tc::CpAsyncCommit();
      tc::CpAsyncWait<1>();
    } else {
      tc::CpAsyncWait<0>();
    }
    __syncthreads();
    const T16* k_s = sK + buf * kBc * L::kStride;
    const T16* v_s = sV + buf * kBc * L::kStride;
    const int mi = lane >> 3;
    if constexpr (kQInRegs) {
      if (kt == kt_begin) {
        GPU_UNROLL
        for (int kk = 0; kk < D / 16; ++kk)
          tc::Ldmatrix4<false>(qf[kk], sQ + L::Off(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      }
    }

    // S = Q K^T for this warp's 16 rows and the tile's kBc keys.
    float s[kBc / 8][4];
    GPU_UNROLL
    for (int j = 0; j < kBc / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    GPU_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qs[4];
      if constexpr (!kQInRegs)
        tc::Ldmatrix4<false>(qs, sQ + L::Off(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      const uint32_t* qa = kQInRegs ? qf[kQInRegs ? kk : 0] : qs;
      GPU_UNROLL
      for (int nn = 0; nn < kBc / 16; ++nn) {
        uint32_t kb[4];
        tc::Ldmatrix4<false>(kb,
                             k_s + L::Off(nn * 16 + (mi >> 1) * 8 + (lane & 7), 2 * kk + (mi & 1)));
        tc::Mma<T16>(s[2 * nn], qa, kb);
        tc::Mma<T16>(s[2 * nn + 1], qa, kb + 2);
      }
    }

    // Mask, scale to log2 units, online softmax.
    const int64_t key0 = kt * kBc;
    float mx0 = -INFINITY, mx1 = -INFINITY;
    GPU_UNROLL
    for (int j = 0; j < kBc / 8; ++j) {
      GPU_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int64_t key = key0 + 8 * j + 2 * t + (i & 1);
        const bool vis = i < 2 ? Visible(p, b, row0, key, ds0) : Visible(p, b, row1, key, ds1);
        s[j][i] = vis ? s[j][i] * p.scale_log2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float base0 = mn0 == -INFINITY ? 0.0f : mn0;
    const float base1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float al0 = exp2f(m0 - base0), al1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    l0 *= al0;
    l1 *= al1;
    GPU_UNROLL
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= al0;
      o[j][1] *= al0;
      o[j][2] *= al1;
      o[j][3] *= al1;
    }
    GPU_UNROLL
    for (int j = 0; j < kBc / 8; ++j) {
      s[j][0] = exp2f(s[j][0] - base0);
      s[j][1] = exp2f(s[j][1] - base0);
      s[j][2] = exp2f(s[j][2] - base1);
      s[j][3] = exp2f(s[j][3] - base1);
      l0 += s[j][0] + s[j][1];
      l1 += s[j][2] + s[j][3];
    }

    // O += P V, P taken from the S accumulators as the A fragments.
    GPU_UNROLL
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pa[4] = {tc::Pack2<T16>(s[2 * kk][0], s[2 * kk][1]),
                        tc::Pack2<T16>(s[2 * kk][2], s[2 * kk][3]),
                        tc::Pack2<T16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                        tc::Pack2<T16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      GPU_UNROLL
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t vb[4];
        tc::Ldmatrix4<true>(vb,
                            v_s + L::Off(kk * 16 + (mi & 1) * 8 + (lane & 7), 2 * dd + (mi >> 1)));
        tc::Mma<T16>(o[2 * dd], pa, vb);
        tc::Mma<T16>(o[2 * dd + 1], pa, vb + 2);
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's copies
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  T16* out = static_cast<T16*>(p.out);
  const int64_t ld = p.NH * D;
  GPU_UNROLL
  for (int j = 0; j < D / 8; ++j) {
    const int col = 8 * j + 2 * t;
    if (row0 < T)
      *reinterpret_cast<uint32_t*>(out + (b * T + row0) * ld + h * D + col) =
          tc::Pack2<T16>(o[j][0] * inv0, o[j][1] * inv0);
    if (row1 < T)
      *reinterpret_cast<uint32_t*>(out + (b * T + row1) * ld + h * D + col) =
          tc::Pack2<T16>(o[j][2] * inv1, o[j][3] * inv1);
  }
  if (t == 0) {
    float* lse = p.lse + (b * p.NH + h) * T;
    if (row0 < T) lse[row0] = l0 > 0.0f ? m0 * kLn2 + logf(l0) : 0.0f;
    if (row1 < T) lse[row1] = l1 > 0.0f ? m1 * kLn2 + logf(l1) : 0.0f;
  }
}

// ---------------------------------------------------------------- backward
// One warp per (b, t, h) row of out: delta = sum(dout * out) in fp32, and the row of the dq
// accumulator zeroed.
template <typename T16, int D>
__global__ void attn_tc_bwd_pre_kernel(Params p, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // warp-uniform
  const T16* o = static_cast<const T16*>(p.out) + row * D;
  const T16* dout = static_cast<const T16*>(p.dout) + row * D;
  const int64_t h = row % p.NH, bt = row / p.NH;
  float* dq_acc = p.dq_acc + bt * p.dq_acc_stride + h * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) {
    acc += tc::ToFloat(o[d]) * tc::ToFloat(dout[d]);
    dq_acc[d] = 0.0f;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t b = bt / p.T, tt = bt % p.T;
    p.delta[(b * p.NH + h) * p.T + tt] = acc;
  }
}

// dq (q's layout) = the accumulator rounded to 16 bits.
template <typename T16, int D>
__global__ void attn_tc_dq_kernel(Params p, int64_t n) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / D, d = idx % D;
    const int64_t h = row % p.NH, bt = row / p.NH;
    static_cast<T16*>(p.dq)[bt * p.q_stride + h * D + d] = FromFloat<T16>(p.dq_acc[idx]);
  }
}

template <int D>
struct BwdCfg {
  static constexpr int kWarps = D == 64 ? 4 : (D == 256 ? 1 : 2);
  static constexpr int kBc = 16 * kWarps;           // keys per block
  static constexpr int kBr = D <= 96 ? 32 : 16;     // queries per tile
  static constexpr int kStages = D == 256 ? 1 : 2;  // Q/dO/lse/delta buffers
  static constexpr int kDS = D == 256 ? 128 : D;    // dK/dV/dQ dims per block
  static constexpr int kSlices = D / kDS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDsStride = kBc + 8;  // dS rows (16-bit), 16-byte multiple
  static constexpr int kSmemBytes =
      2 * ((2 * kBc + 2 * kStages * kBr) * Tile<D>::kStride + kBr * kDsStride) +
      2 * kStages * kBr * 4;
  static_assert(kSmemBytes <= 48 * 1024, "backward tiles exceed 48 KiB of shared memory");
};

template <typename T16, int D>
__device__ __forceinline__ void LoadQueryStep(const Params& p, int64_t b, int64_t h, int64_t qrow0,
                                              T16* sQ, T16* sdO, float* sLse, float* sDelta) {
  using C = BwdCfg<D>;
  const int64_t T = p.T;
  LoadTile<T16, D, C::kBr, C::kThreads>(
      sQ, static_cast<const T16*>(p.q) + b * T * p.q_stride + h * D, qrow0, T, p.q_stride);
  LoadTile<T16, D, C::kBr, C::kThreads>(
      sdO, static_cast<const T16*>(p.dout) + b * T * p.NH * D + h * D, qrow0, T, p.NH * D);
  const float* lse = p.lse + (b * p.NH + h) * T;
  const float* delta = p.delta + (b * p.NH + h) * T;
  for (int i = threadIdx.x; i < C::kBr; i += C::kThreads) {
    const bool valid = qrow0 + i < T;
    tc::CpAsync4(sLse + i, valid ? lse + qrow0 + i : lse, valid);
    tc::CpAsync4(sDelta + i, valid ? delta + qrow0 + i : delta, valid);
  }
}

// long function: one fused kernel (FA2 backward): the tile loop keeps dK, dV in registers
// long function: one fused kernel (FA2 backward): the tile loop keeps dK, dV in registers
template <typename T16, int D>
__global__ void __launch_bounds__(BwdCfg<D>::kThreads, 1) attn_tc_bwd_kernel(Params p) {
  using C = BwdCfg<D>;
  using L = Tile<D>;
  constexpr int kBr = C::kBr, kBc = C::kBc, kDS = C::kDS;
  GPU_DYNAMIC_SHARED(T16, smem);
  T16* sK = smem;
  T16* sV = sK + kBc * L::kStride;
  T16* sQ = sV + kBc * L::kStride;
  T16* sdO = sQ + C::kStages * kBr * L::kStride;
  T16* sdS = sdO + C::kStages * kBr * L::kStride;  // dS[query][key]
  float* sLse = reinterpret_cast<float*>(sdS + kBr * C::kDsStride);
  float* sDelta = sLse + C::kStages * kBr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane & 3, mi = lane >> 3;
  const int64_t b = blockIdx.z;
  const int64_t kvh = blockIdx.y / C::kSlices;
  const int c0 = static_cast<int>(blockIdx.y % C::kSlices) * (kDS / 8);  // first chunk of the slice
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBc;
  const int64_t T = p.T, group = p.NH / p.NKV;

  LoadTile<T16, D, kBc, C::kThreads>(
      sK, static_cast<const T16*>(p.k) + b * T * p.kv_stride + kvh * D, k0, T, p.kv_stride);
  LoadTile<T16, D, kBc, C::kThreads>(
      sV, static_cast<const T16*>(p.v) + b * T * p.kv_stride + kvh * D, k0, T, p.kv_stride);
  tc::CpAsyncCommit();

  // Query tiles that can see a key of this block (block-uniform).
  const int64_t n_qt = (T + kBr - 1) / kBr;
  int64_t qt_begin = 0, qt_end = n_qt;
  if (p.causal) qt_begin = k0 / kBr;
  if (p.window > 0) qt_end = Min64(n_qt, (Min64(k0 + kBc, T) - 1 + p.window - 1) / kBr + 1);
  const int64_t nq = qt_end > qt_begin ? qt_end - qt_begin : 0;
  const int64_t n_steps = group * nq;

  if (n_steps > 0) {
    LoadQueryStep<T16, D>(p, b, kvh * group, qt_begin * kBr, sQ, sdO, sLse, sDelta);
    tc::CpAsyncCommit();
  }

  const int64_t key_r0 = k0 + warp * 16 + (lane >> 2), key_r1 = key_r0 + 8;
  float dk[kDS / 8][4], dv[kDS / 8][4];
  GPU_UNROLL
  for (int j = 0; j < kDS / 8; ++j)
    dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.0f;

  for (int64_t step = 0; step < n_steps; ++step) {
    const int stage = C::kStages == 2 ? static_cast<int>(step & 1) : 0;
    if (C::kStages == 2 && step + 1 < n_steps) {
      const int64_t hn = kvh * group + (step + 1) / nq, qn = (qt_begin + (step + 1) % nq) * kBr;
      const int sn = stage ^ 1;
      LoadQueryStep<T16, D>(p, b, hn, qn, sQ + sn * kBr * L::kStride, sdO + sn * kBr * L::kStride,
                            sLse + sn * kBr, sDelta + sn * kBr);
      tc::CpAsyncCommit();
      tc::CpAsyncWait<1>();
    } else {
      tc::CpAsyncWait<0>();
    }
    __syncthreads();
    const int64_t h = kvh * group + step / nq;
    const int64_t qrow0 = (qt_begin + step % nq) * kBr;
    const T16* q_s = sQ + stage * kBr * L::kStride;
    const T16* do_s = sdO + stage * kBr * L::kStride;
    const float* lse_s = sLse + stage * kBr;
    const float* delta_s = sDelta + stage * kBr;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and the tile's kBr queries.
    float s[kBr / 8][4], dp[kBr / 8][4];
    GPU_UNROLL
    for (int j = 0; j < kBr / 8; ++j)
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
    GPU_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      tc::Ldmatrix4<false>(ka, sK + L::Off(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      tc::Ldmatrix4<false>(va, sV + L::Off(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      GPU_UNROLL
      for (int nn = 0; nn < kBr / 16; ++nn) {
        const int off = L::Off(nn * 16 + (mi >> 1) * 8 + (lane & 7), 2 * kk + (mi & 1));
        uint32_t qb[4], ob[4];
        tc::Ldmatrix4<false>(qb, q_s + off);
        tc::Mma<T16>(s[2 * nn], ka, qb);
        tc::Mma<T16>(s[2 * nn + 1], ka, qb + 2);
        tc::Ldmatrix4<false>(ob, do_s + off);
        tc::Mma<T16>(dp[2 * nn], va, ob);
        tc::Mma<T16>(dp[2 * nn + 1], va, ob + 2);
      }
    }

    // P^T = exp(S^T - lse) (0 where masked), dS^T = P^T (dP^T - D).
    GPU_UNROLL
    for (int j = 0; j < kBr / 8; ++j) {
      GPU_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int ql = 8 * j + 2 * t + (i & 1);
        const int64_t qi = qrow0 + ql;
        const bool vis = Visible(p, b, qi, i < 2 ? key_r0 : key_r1, DocStart(p, b, qi));
        const float pv = vis ? exp2f(s[j][i] * p.scale_log2 - lse_s[ql] * kLog2e) : 0.0f;
        s[j][i] = pv;
        dp[j][i] = pv * (dp[j][i] - delta_s[ql]);
      }
    }

    // dV += P^T dO and dK += dS^T Q over the slice's dims.
    GPU_UNROLL
    for (int kk = 0; kk < kBr / 16; ++kk) {
      uint32_t pa[4] = {tc::Pack2<T16>(s[2 * kk][0], s[2 * kk][1]),
                        tc::Pack2<T16>(s[2 * kk][2], s[2 * kk][3]),
                        tc::Pack2<T16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                        tc::Pack2<T16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      uint32_t da[4] = {tc::Pack2<T16>(dp[2 * kk][0], dp[2 * kk][1]),
                        tc::Pack2<T16>(dp[2 * kk][2], dp[2 * kk][3]),
                        tc::Pack2<T16>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                        tc::Pack2<T16>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
      GPU_UNROLL
      for (int dd = 0; dd < kDS / 16; ++dd) {
        const int off = L::Off(kk * 16 + (mi & 1) * 8 + (lane & 7), c0 + 2 * dd + (mi >> 1));
        uint32_t ob[4], qb[4];
        tc::Ldmatrix4<true>(ob, do_s + off);
        tc::Mma<T16>(dv[2 * dd], pa, ob);
        tc::Mma<T16>(dv[2 * dd + 1], pa, ob + 2);
        tc::Ldmatrix4<true>(qb, q_s + off);
        tc::Mma<T16>(dk[2 * dd], da, qb);
        tc::Mma<T16>(dk[2 * dd + 1], da, qb + 2);
      }
    }

    // dS (rounded as the dK product used it) to shared memory, query-major.
    GPU_UNROLL
    for (int j = 0; j < kBr / 8; ++j) {
      GPU_UNROLL
      for (int i = 0; i < 4; ++i)
        sdS[(8 * j + 2 * t + (i & 1)) * C::kDsStride + warp * 16 + (lane >> 2) + (i >= 2 ? 8 : 0)] =
            FromFloat<T16>(dp[j][i]);
    }
    __syncthreads();

    // dQ[kBr x slice] += dS[kBr x kBc] K[kBc x slice], split over the warps in 16x16 pieces.
    float* dq_acc = p.dq_acc + (b * T + qrow0) * p.dq_acc_stride + h * D + c0 * 8;
    for (int item = warp; item < (kBr / 16) * (kDS / 16); item += C::kWarps) {
      const int rg = item / (kDS / 16), dd = item % (kDS / 16);
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      GPU_UNROLL
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4], kb[4];
        tc::Ldmatrix4<false>(
            a, sdS + (rg * 16 + (lane & 15)) * C::kDsStride + kk * 16 + (lane >> 4) * 8);
        tc::Ldmatrix4<true>(
            kb, sK + L::Off(kk * 16 + (mi & 1) * 8 + (lane & 7), c0 + 2 * dd + (mi >> 1)));
        tc::Mma<T16>(acc[0], a, kb);
        tc::Mma<T16>(acc[1], a, kb + 2);
      }
      GPU_UNROLL
      for (int c = 0; c < 2; ++c) {
        GPU_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int ql = rg * 16 + (lane >> 2) + (i >= 2 ? 8 : 0);
          if (qrow0 + ql < T)
            atomicAdd(
                dq_acc + static_cast<int64_t>(ql) * p.dq_acc_stride + 16 * dd + 8 * c + 2 * t +
                    (i & 1),
                acc[c][i] * p.scale);
        }
      }
    }
    __syncthreads();  // sdS and this stage's buffers are rewritten next
    if (C::kStages == 1 && step + 1 < n_steps) {
      const int64_t hn = kvh * group + (step + 1) / nq, qn = (qt_begin + (step + 1) % nq) * kBr;
      LoadQueryStep<T16, D>(p, b, hn, qn, sQ, sdO, sLse, sDelta);
      tc::CpAsyncCommit();
    }
  }
  tc::CpAsyncWait<0>();

  if (p.grads_f32) {
    float* dkf = static_cast<float*>(p.dk) + b * T * p.kv_stride + kvh * D + c0 * 8;
    float* dvf = static_cast<float*>(p.dv) + b * T * p.kv_stride + kvh * D + c0 * 8;
    GPU_UNROLL
    for (int j = 0; j < kDS / 8; ++j) {
      const int col = 8 * j + 2 * t;
      GPU_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int64_t key = i < 2 ? key_r0 : key_r1;
        if (key < T) {
          dkf[key * p.kv_stride + col + (i & 1)] = dk[j][i] * p.scale;
          dvf[key * p.kv_stride + col + (i & 1)] = dv[j][i];
        }
      }
    }
    return;
  }
  T16* dkg = static_cast<T16*>(p.dk) + b * T * p.kv_stride + kvh * D + c0 * 8;
  T16* dvg = static_cast<T16*>(p.dv) + b * T * p.kv_stride + kvh * D + c0 * 8;
  GPU_UNROLL
  for (int j = 0; j < kDS / 8; ++j) {
    const int col = 8 * j + 2 * t;
    if (key_r0 < T) {
      *reinterpret_cast<uint32_t*>(dkg + key_r0 * p.kv_stride + col) =
          tc::Pack2<T16>(dk[j][0] * p.scale, dk[j][1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + key_r0 * p.kv_stride + col) =
          tc::Pack2<T16>(dv[j][0], dv[j][1]);
    }
    if (key_r1 < T) {
      *reinterpret_cast<uint32_t*>(dkg + key_r1 * p.kv_stride + col) =
          tc::Pack2<T16>(dk[j][2] * p.scale, dk[j][3] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + key_r1 * p.kv_stride + col) =
          tc::Pack2<T16>(dv[j][2], dv[j][3]);
    }
  }
}

// ---------------------------------------------------------------- fp32 boundary
// dst (rows, cols) contiguous 16-bit = src's first cols columns of rows of src_stride floats.
template <typename T16>
__global__ void attn_tc_pack_kernel(const float* src, int64_t src_stride, T16* dst, int64_t rows,
                                    int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = FromFloat<T16>(src[(i / cols) * src_stride + i % cols]);
}
// The first cols columns of dst's rows (dst_stride floats) = src (rows, cols) widened (=).
template <typename T16>
__global__ void attn_tc_unpack_kernel(const T16* src, float* dst, int64_t dst_stride, int64_t rows,
                                      int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[(i / cols) * dst_stride + i % cols] = tc::ToFloat(src[i]);
}

Status Pack(DType type, const float* src, int64_t src_stride, void* dst, int64_t rows, int64_t cols,
            cudaStream_t stream) {
  const dim3 grid(GridFor(rows * cols, 256));
  if (type == DType::kBF16)
    return GPU_LAUNCH((attn_tc_pack_kernel<__nv_bfloat16>), grid, dim3(256), 0, stream, src,
                      src_stride, static_cast<__nv_bfloat16*>(dst), rows, cols);
  return GPU_LAUNCH((attn_tc_pack_kernel<__half>), grid, dim3(256), 0, stream, src, src_stride,
                    static_cast<__half*>(dst), rows, cols);
}
Status Unpack(DType type, const void* src, float* dst, int64_t dst_stride, int64_t rows,
              int64_t cols, cudaStream_t stream) {
  const dim3 grid(GridFor(rows * cols, 256));
  if (type == DType::kBF16)
    return GPU_LAUNCH((attn_tc_unpack_kernel<__nv_bfloat16>), grid, dim3(256), 0, stream,
                      static_cast<const __nv_bfloat16*>(src), dst, dst_stride, rows, cols);
  return GPU_LAUNCH((attn_tc_unpack_kernel<__half>), grid, dim3(256), 0, stream,
                    static_cast<const __half*>(src), dst, dst_stride, rows, cols);
}

// The fp32 wrappers' workspace: 16-bit q, k, v, out, dout, dq, dk, dv (each padded to 64
// elements), then the backward's fp32 scratch.
struct Workspace {
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float* scratch;
};
int64_t Pad64(int64_t n) { return (n + 63) / 64 * 64; }
int64_t WorkspaceFloats(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
  return 2 * Pad64(B * T * NH * HS) + 2 * Pad64(B * T * NKV * HS) +
         Pad64(AttentionTcBackwardScratchFloats(B, T, NH, HS));
}
Workspace CarveWorkspace(float* base, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
  const int64_t nq = Pad64(B * T * NH * HS), nkv = Pad64(B * T * NKV * HS);
  uint16_t* p = reinterpret_cast<uint16_t*>(base);
  Workspace w{};
  w.q = p;
  w.k = p + nq;
  w.v = p + nq + nkv;
  w.out = p + nq + 2 * nkv;
  w.dout = p + 2 * nq + 2 * nkv;
  w.dq = p + 3 * nq + 2 * nkv;
  w.dk = p + 4 * nq + 2 * nkv;
  w.dv = p + 4 * nq + 3 * nkv;
  const int64_t halves = 4 * nq + 4 * nkv;  // a multiple of 64
  w.scratch = base + halves / 2;
  return w;
}

// ---------------------------------------------------------------- launchers
Status CheckArgs(const char* op, DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                 int64_t HS, int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& m,
                 std::initializer_list<const void*> ptrs) {
  const std::string w = std::string(op) + ": ";
  if (type != DType::kBF16 && type != DType::kF16)
    return Status::InvalidArgument(w + "operand type must be bf16 or fp16");
  if (!AttentionTcSupportsHeadSize(HS))
    return Status::InvalidArgument(w + "head size " + std::to_string(HS) +
                                   " has no tensor-core kernel (64, 80, 96, 128, 256)");
  if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0)
    return Status::InvalidArgument(w + "bad shape B=" + std::to_string(B) +
                                   " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                                   " NKV=" + std::to_string(NKV));
  if (B > 65535 || NH * 2 > 65535 || T > (int64_t{1} << 30))
    return Status::InvalidArgument(w + "shape too large for the grid");
  if (q_stride % 8 != 0 || kv_stride % 8 != 0 || q_stride < NH * HS || kv_stride < NKV * HS)
    return Status::InvalidArgument(
        w + "strides must be multiples of 8 covering the heads (q_stride=" +
        std::to_string(q_stride) + ", kv_stride=" + std::to_string(kv_stride) + ")");
  if (m.window < 0)
    return Status::InvalidArgument(w + "negative window " + std::to_string(m.window));
  for (const void* ptr : ptrs)
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::InvalidArgument(w + "a 16-bit operand is null or not 16-byte aligned");
  return Status::Ok();
}

Params MakeParams(const void* q, const void* k, const void* v, int64_t T, int64_t NH, int64_t NKV,
                  int64_t HS, int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& m) {
  Params p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.T = T;
  p.NH = NH;
  p.NKV = NKV;
  p.q_stride = q_stride;
  p.kv_stride = kv_stride;
  p.scale = 1.0f / std::sqrt(static_cast<float>(HS));
  p.scale_log2 = p.scale * kLog2e;
  p.causal = m.causal;
  p.key_mask = m.key_mask;
  p.window = m.window >= T ? 0 : m.window;
  p.doc_start = m.doc_start;
  return p;
}

template <typename T16, int D>
Status LaunchForward(const Params& p, int64_t B, cudaStream_t stream) {
  using C = FwdCfg<D>;
  const dim3 grid(static_cast<unsigned>((p.T + C::kBr - 1) / C::kBr), static_cast<unsigned>(p.NH),
                  static_cast<unsigned>(B));
  return GPU_LAUNCH((attn_tc_fwd_kernel<T16, D>), grid, dim3(C::kThreads), C::kSmemBytes, stream,
                    p);
}

template <typename T16, int D>
Status LaunchBackward(const Params& p, int64_t B, cudaStream_t stream) {
  using C = BwdCfg<D>;
  const int64_t rows = B * p.T * p.NH;
  const Status pre =
      GPU_LAUNCH((attn_tc_bwd_pre_kernel<T16, D>), dim3(static_cast<unsigned>((rows + 7) / 8)),
                 dim3(256), 0, stream, p, rows);
  if (!pre.ok()) return pre;
  const dim3 grid(static_cast<unsigned>((p.T + C::kBc - 1) / C::kBc),
                  static_cast<unsigned>(p.NKV * C::kSlices), static_cast<unsigned>(B));
  const Status main =
      GPU_LAUNCH((attn_tc_bwd_kernel<T16, D>), grid, dim3(C::kThreads), C::kSmemBytes, stream, p);
  if (!main.ok()) return main;
  if (p.grads_f32) return Status::Ok();  // dq accumulated in place
  const int64_t n = rows * D;
  return GPU_LAUNCH((attn_tc_dq_kernel<T16, D>), dim3(GridFor(n, 256)), dim3(256), 0, stream, p, n);
}

template <typename T16>
Status ForwardFor(int64_t HS, const Params& p, int64_t B, cudaStream_t stream) {
  switch (HS) {
    case 64:
      return LaunchForward<T16, 64>(p, B, stream);
    case 80:
      return LaunchForward<T16, 80>(p, B, stream);
    case 96:
      return LaunchForward<T16, 96>(p, B, stream);
    case 128:
      return LaunchForward<T16, 128>(p, B, stream);
    default:
      return LaunchForward<T16, 256>(p, B, stream);
  }
}

template <typename T16>
Status BackwardFor(int64_t HS, const Params& p, int64_t B, cudaStream_t stream) {
  switch (HS) {
    case 64:
      return LaunchBackward<T16, 64>(p, B, stream);
    case 80:
      return LaunchBackward<T16, 80>(p, B, stream);
    case 96:
      return LaunchBackward<T16, 96>(p, B, stream);
    case 128:
      return LaunchBackward<T16, 128>(p, B, stream);
    default:
      return LaunchBackward<T16, 256>(p, B, stream);
  }
}

}  // namespace

bool AttentionTcSupportsHeadSize(int64_t HS) {
  return HS == 64 || HS == 80 || HS == 96 || HS == 128 || HS == 256;
}

Status AttentionTcForward(void* out, float* lse, const void* q, const void* k, const void* v,
                          DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                          int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                          cudaStream_t stream) {
  Status st = CheckArgs("AttentionTcForward", type, B, T, NH, NKV, HS, q_stride, kv_stride, masks,
                        {out, q, k, v});
  if (!st.ok()) return st;
  if (lse == nullptr) return Status::InvalidArgument("AttentionTcForward: lse is null");
  Params p = MakeParams(q, k, v, T, NH, NKV, HS, q_stride, kv_stride, masks);
  p.out = out;
  p.lse = lse;
  return type == DType::kBF16 ? ForwardFor<__nv_bfloat16>(HS, p, B, stream)
                              : ForwardFor<__half>(HS, p, B, stream);
}

int64_t AttentionTcBackwardScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t HS) {
  return B * T * NH * HS + B * NH * T;
}

int64_t AttentionTcF32WorkspaceFloats(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
  return WorkspaceFloats(B, T, NH, NKV, HS);
}

Status AttentionTcForwardF32(float* out, float* lse, const float* q, const float* k, const float* v,
                             DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                             int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                             float* workspace, cudaStream_t stream) {
  if (workspace == nullptr) return Status::InvalidArgument("AttentionTcForwardF32: no workspace");
  if (type != DType::kBF16 && type != DType::kF16)
    return Status::InvalidArgument("AttentionTcForwardF32: operand type must be bf16 or fp16");
  const Workspace w = CarveWorkspace(workspace, B, T, NH, NKV, HS);
  const int64_t rows = B * T;
  for (const Status& s : {Pack(type, q, q_stride, w.q, rows, NH * HS, stream),
                          Pack(type, k, kv_stride, w.k, rows, NKV * HS, stream),
                          Pack(type, v, kv_stride, w.v, rows, NKV * HS, stream)})
    if (!s.ok()) return s;
  const Status st = AttentionTcForward(w.out, lse, w.q, w.k, w.v, type, B, T, NH, NKV, HS, NH * HS,
                                       NKV * HS, masks, stream);
  if (!st.ok()) return st;
  return Unpack(type, w.out, out, NH * HS, rows, NH * HS, stream);
}

Status AttentionTcBackwardF32(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                              int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                              float* workspace, cudaStream_t stream) {
  if (workspace == nullptr) return Status::InvalidArgument("AttentionTcBackwardF32: no workspace");
  if (type != DType::kBF16 && type != DType::kF16)
    return Status::InvalidArgument("AttentionTcBackwardF32: operand type must be bf16 or fp16");
  const Workspace w = CarveWorkspace(workspace, B, T, NH, NKV, HS);
  const int64_t rows = B * T;
  for (const Status& s : {Pack(type, q, q_stride, w.q, rows, NH * HS, stream),
                          Pack(type, k, kv_stride, w.k, rows, NKV * HS, stream),
                          Pack(type, v, kv_stride, w.v, rows, NKV * HS, stream),
                          Pack(type, out, NH * HS, w.out, rows, NH * HS, stream),
                          Pack(type, dout, NH * HS, w.dout, rows, NH * HS, stream)})
    if (!s.ok()) return s;
  const Status st =
      AttentionTcBackward(w.dq, w.dk, w.dv, w.dout, w.out, lse, w.q, w.k, w.v, type, B, T, NH, NKV,
                          HS, NH * HS, NKV * HS, masks, w.scratch, stream);
  if (!st.ok()) return st;
  for (const Status& s : {Unpack(type, w.dq, dq, q_stride, rows, NH * HS, stream),
                          Unpack(type, w.dk, dk, kv_stride, rows, NKV * HS, stream),
                          Unpack(type, w.dv, dv, kv_stride, rows, NKV * HS, stream)})
    if (!s.ok()) return s;
  return Status::Ok();
}

namespace {

Status Backward(const char* op, bool grads_f32, void* dq, void* dk, void* dv, const void* dout,
                const void* out, const float* lse, const void* q, const void* k, const void* v,
                DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                float* scratch, cudaStream_t stream) {
  Status st = CheckArgs(op, type, B, T, NH, NKV, HS, q_stride, kv_stride, masks,
                        {dq, dk, dv, dout, out, q, k, v});
  if (!st.ok()) return st;
  if (lse == nullptr || scratch == nullptr)
    return Status::InvalidArgument(std::string(op) + ": lse or scratch is null");
  Params p = MakeParams(q, k, v, T, NH, NKV, HS, q_stride, kv_stride, masks);
  p.out = const_cast<void*>(out);
  p.lse = const_cast<float*>(lse);
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.grads_f32 = grads_f32;
  if (grads_f32) {
    p.dq_acc = static_cast<float*>(dq);
    p.dq_acc_stride = q_stride;
    p.delta = scratch;
  } else {
    p.dq_acc = scratch;
    p.dq_acc_stride = NH * HS;
    p.delta = scratch + B * T * NH * HS;
  }
  return type == DType::kBF16 ? BackwardFor<__nv_bfloat16>(HS, p, B, stream)
                              : BackwardFor<__half>(HS, p, B, stream);
}

}  // namespace

Status AttentionTcBackward(void* dq, void* dk, void* dv, const void* dout, const void* out,
                           const float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, const AttentionTcMasks& masks,
                           float* scratch, cudaStream_t stream) {
  return Backward("AttentionTcBackward", false, dq, dk, dv, dout, out, lse, q, k, v, type, B, T,
                  NH, NKV, HS, q_stride, kv_stride, masks, scratch, stream);
}

int64_t AttentionTcBackwardF32GradsScratchFloats(int64_t B, int64_t T, int64_t NH) {
  return B * NH * T;
}

Status AttentionTcBackwardF32Grads(float* dq, float* dk, float* dv, const void* dout,
                                   const void* out, const float* lse, const void* q, const void* k,
                                   const void* v, DType type, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                   const AttentionTcMasks& masks, float* scratch,
                                   cudaStream_t stream) {
  return Backward("AttentionTcBackwardF32Grads", true, dq, dk, dv, dout, out, lse, q, k, v, type,
                  B, T, NH, NKV, HS, q_stride, kv_stride, masks, scratch, stream);
}

TRAIND_GPU_END
