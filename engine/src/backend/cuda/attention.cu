// Causal self-attention of the GPU backend: our own tiled flash-style kernels (online softmax, no
// (T,T) buffer), GQA (query head h reads kv head h / (NH/NKV)), strided q/k/v rows.
//   forward : one thread per query, K/V tiles of BK rows staged in shared memory; writes out and
//             lse (B, NH, T).
//   backward: D = rowsum(dout * out) (B, NH, T) into scratch; dk/dv with one thread per key over
//             the query tiles of every head of its group (sums the group, writes =); dq with one
//             thread per query over the key tiles (writes =). No atomics: deterministic.
// FLOPs (causal halves the square): forward 2*B*NH*T^2*HS, backward 5*B*NH*T^2*HS (recomputes P
// twice). Bytes: q,k,v,out,lse read/written once per call plus re-reads through L2 (compute-bound
// at T >= 512). Roofline on an H100 at 790 TFLOP/s (bf16 tensor cores; these fp32 kernels do not
// use them yet, so the fp32 SIMT bound of ~67 TFLOP/s is the honest target today):
//   B=8, NH=12, T=1024, HS=64: forward 12.9 GFLOP -> 16 us @790T / 190 us @67T;
//   backward 32 GFLOP -> 41 us @790T / 480 us @67T.
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
};

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
  const int64_t j_end = last < d.T - 1 ? last : d.T - 1;  // causal: keys <= the block's last query
  for (int64_t j0 = 0; j0 <= j_end; j0 += tile) {
    __syncthreads();  // the previous tile is no longer read
    for (int64_t e = threadIdx.x; e < tile * d.HS; e += blockDim.x) {
      const int64_t j = j0 + e / d.HS, c = e % d.HS;
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + c;
      ks[e] = j < d.T ? k[off] : 0.0f;
      vs[e] = j < d.T ? v[off] : 0.0f;
    }
    __syncthreads();
    if (!active || j0 > i) continue;
    const int64_t n = (i - j0 + 1) < tile ? (i - j0 + 1) : tile;
    float sc[32];
    float tile_max = -INFINITY;
    for (int64_t jj = 0; jj < n; ++jj) {
      float s = 0.0f;
      for (int64_t e = 0; e < d.HS; ++e) s += qi[e] * ks[jj * d.HS + e];
      sc[jj] = s * d.scale;
      tile_max = fmaxf(tile_max, sc[jj]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= corr;
    for (int64_t e = 0; e < d.HS; ++e) acc[e] *= corr;
    for (int64_t jj = 0; jj < n; ++jj) {
      const float p = expf(sc[jj] - m_new);
      l += p;
      for (int64_t e = 0; e < d.HS; ++e) acc[e] += p * vs[jj * d.HS + e];
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
  for (int64_t e = 0; e < d.HS; ++e) out[(b * d.T + i) * d.NH * d.HS + h * d.HS + e] = acc[e] * inv;
  lse[(b * d.NH + h) * d.T + i] = m + logf(l);
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
  float kj[kMaxHS], vj[kMaxHS], dkj[kMaxHS], dvj[kMaxHS];
  if (active)
    for (int64_t e = 0; e < d.HS; ++e) {
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + e;
      kj[e] = k[off];
      vj[e] = v[off];
      dkj[e] = 0.0f;
      dvj[e] = 0.0f;
    }
  const int64_t i_begin = blockIdx.x * int64_t{kKeysPerBlock};  // earlier queries see no key here
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = i_begin; i0 < d.T; i0 += tile) {
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
      if (!active) continue;
      for (int64_t ii = 0; ii < tile; ++ii) {
        const int64_t i = i0 + ii;
        if (i < j || i >= d.T) continue;
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
  const int64_t j_end = last < d.T - 1 ? last : d.T - 1;
  for (int64_t j0 = 0; j0 <= j_end; j0 += tile) {
    __syncthreads();
    for (int64_t e = threadIdx.x; e < tile * d.HS; e += blockDim.x) {
      const int64_t j = j0 + e / d.HS, c = e % d.HS;
      const int64_t off = (b * d.T + j) * d.kv_stride + kvh * d.HS + c;
      ks[e] = j < d.T ? k[off] : 0.0f;
      vs[e] = j < d.T ? v[off] : 0.0f;
    }
    __syncthreads();
    if (!active || j0 > i) continue;
    const int64_t n = (i - j0 + 1) < tile ? (i - j0 + 1) : tile;
    for (int64_t jj = 0; jj < n; ++jj) {
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

Dims MakeDims(int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride) {
  return Dims{T, NH, NKV, HS, q_stride, kv_stride, 1.0f / sqrtf(static_cast<float>(HS))};
}

}  // namespace

Status AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                        int64_t kv_stride, cudaStream_t stream) {
  const Dims d = MakeDims(T, NH, NKV, HS, q_stride, kv_stride);
  TRAIND_RETURN_IF_ERROR(CheckDims("AttentionForward", B, d));
  if (B == 0 || T == 0) return Status::Ok();
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
                         int64_t q_stride, int64_t kv_stride, float* scratch, cudaStream_t stream) {
  const Dims d = MakeDims(T, NH, NKV, HS, q_stride, kv_stride);
  TRAIND_RETURN_IF_ERROR(CheckDims("AttentionBackward", B, d));
  if (B == 0 || T == 0) return Status::Ok();
  const int tile = TileRows(HS);
  TRAIND_RETURN_IF_ERROR(GPU_LAUNCH(attention_delta_kernel, GridFor(B * T * NH, 256), 256, 0,
                                    stream, scratch, dout, out, B, d));
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
