// Attention of one new query row per sequence against a key/value cache (generation), GPU backend.
// One block per (sequence, head): the T scores go to shared memory (T <= kMaxDecodeRows), a block
// max and sum give the softmax, then each thread sums the value rows for its head elements. With
// a sliding window only the last `window` rows are read (the launcher moves k, v past the rest).
// Work per call: 4*B*NH*T*HS FLOPs, reading the cached K and V once per head (memory-bound; at
// generation sizes it is a few microseconds per layer).
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 128;

__global__ void attention_decode_kernel(float* out, const float* q, const float* k, const float* v,
                                        int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV,
                                        int64_t HS, int64_t q_stride, int64_t kv_stride,
                                        float scale) {
  GPU_DYNAMIC_SHARED(float, s);  // (T) scores, then probabilities
  __shared__ float red[32];
  const int64_t b = blockIdx.x / NH, h = blockIdx.x % NH, kvh = h / (NH / NKV);
  const float* qh = q + b * q_stride + h * HS;
  const float* kb = k + b * cache_rows * kv_stride + kvh * HS;
  const float* vb = v + b * cache_rows * kv_stride + kvh * HS;
  float mx = -INFINITY;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    float dot = 0.0f;
    for (int64_t e = 0; e < HS; ++e) dot += qh[e] * kb[t * kv_stride + e];
    s[t] = scale * dot;
    mx = fmaxf(mx, s[t]);
  }
  mx = BlockMax(mx, red);
  float sum = 0.0f;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const float p = expf(s[t] - mx);
    s[t] = p;
    sum += p;
  }
  sum = BlockSum(sum, red);  // its barriers also make every s[t] visible below
  const float inv = 1.0f / sum;
  float* o = out + b * NH * HS + h * HS;
  for (int64_t e = threadIdx.x; e < HS; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t = 0; t < T; ++t) acc += s[t] * vb[t * kv_stride + e];
    o[e] = acc * inv;
  }
}

}  // namespace

Status AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                       int64_t q_stride, int64_t kv_stride, int64_t window,
                       cudaStream_t stream) {
  if (NKV <= 0 || NH % NKV != 0)
    return Status::InvalidArgument("AttentionDecode: NH " + std::to_string(NH) +
                                   " is not a multiple of NKV " + std::to_string(NKV));
  if (T < 1 || T > cache_rows || T > kMaxDecodeRows)
    return Status::InvalidArgument("AttentionDecode: T " + std::to_string(T) + " outside [1, " +
                                   std::to_string(cache_rows < kMaxDecodeRows ? cache_rows
                                                                              : kMaxDecodeRows) +
                                   "]");
  if (window < 0)
    return Status::InvalidArgument("AttentionDecode: sliding window " + std::to_string(window) +
                                   " is negative (0 = no window)");
  if (B * NH == 0) return Status::Ok();
  if (window > 0 && window < T) {  // the rows before the window: not read
    k += (T - window) * kv_stride;
    v += (T - window) * kv_stride;
    T = window;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const size_t shmem = static_cast<size_t>(T) * sizeof(float);
  return GPU_LAUNCH(attention_decode_kernel, static_cast<int>(B * NH), kThreads, shmem, stream, out,
                    q, k, v, T, cache_rows, NH, NKV, HS, q_stride, kv_stride, scale);
}

TRAIND_GPU_END
