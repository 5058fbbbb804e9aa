// GpuBackend: each op checks nothing itself beyond what the launchers check; it launches on the
// backend's stream and keeps the first error. Built twice (nvcc build and simt build).
#include "backend/cuda/gpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "backend/cuda/attention_tc.h"
#include "backend/cuda/batch_uploader.h"
#include "backend/cuda/cudnn_sdpa.h"
#include "backend/device_registry.h"
#include "backend/cuda/host_staging.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
#include "core/half.h"

TRAIND_GPU_BEGIN

DeviceCapabilities GpuBackend::capabilities() const {
#if defined(TRAIND_SIMT)
  return DeviceCapabilitiesOf(DeviceKind::kSimt);
#else
  return DeviceCapabilitiesOf(DeviceKind::kCuda);
#endif
}

GpuBackend::~GpuBackend() {
  for (cudaGraphExec_t g : graphs_) (void)dev::GraphDestroy(g);
  for (cudaEvent_t e : markers_) (void)dev::EventDestroy(e);
  for (AdamWTable& t : adamw_tables_) (void)dev::Free(t.chunks);
  if (scratch_ != nullptr) (void)dev::Free(scratch_);
  if (sumsq_ != nullptr) (void)dev::Free(sumsq_);
  if (flag_ != nullptr) (void)dev::Free(flag_);
  if (stream_ != nullptr) (void)dev::StreamDestroy(stream_);
}

Status GpuBackend::Init() {
  TRAIND_RETURN_IF_ERROR(dev::StreamCreate(&stream_));
  void* p = nullptr;
  TRAIND_RETURN_IF_ERROR(dev::Malloc(&p, sizeof(double)));
  sumsq_ = static_cast<double*>(p);
  TRAIND_RETURN_IF_ERROR(dev::Malloc(&p, sizeof(int)));
  flag_ = static_cast<int*>(p);
  return Status::Ok();
}

void GpuBackend::Record(const Status& s) {
  if (s.ok() || !status_.ok()) return;
  status_ = s;
  std::fprintf(stderr, "traind %s backend: %s\n", name_.c_str(), s.ToString().c_str());
}

Status GpuBackend::MemoryInfo(size_t* free_bytes, size_t* total_bytes) const {
  return dev::MemGetInfo(free_bytes, total_bytes);
}

Status GpuBackend::BeginCapture() {
  if (capturing_) return Status::FailedPrecondition("BeginCapture: already capturing");
  TRAIND_RETURN_IF_ERROR(dev::BeginCapture(stream_));
  capturing_ = true;
  return Status::Ok();
}

Result<int> GpuBackend::EndCapture() {
  if (!capturing_) return Status::FailedPrecondition("EndCapture without BeginCapture");
  capturing_ = false;
  cudaGraphExec_t graph = nullptr;
  TRAIND_RETURN_IF_ERROR(dev::EndCapture(stream_, &graph));
  graphs_.push_back(graph);
  return static_cast<int>(graphs_.size()) - 1;
}

Status GpuBackend::Replay(int graph) {
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) {
    return Status::FailedPrecondition("Replay: no captured graph " + std::to_string(graph));
  }
  return dev::GraphLaunch(graphs_[static_cast<size_t>(graph)], stream_);
}

Result<std::unique_ptr<BatchUpload>> GpuBackend::MakeBatchUpload(size_t slot_bytes) {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<BatchUploader> u,
                          BatchUploader::Create(slot_bytes, stream_));
  return std::unique_ptr<BatchUpload>(std::move(u));
}

Result<std::unique_ptr<HostStaging>> GpuBackend::MakeHostStaging(int slots, size_t slot_bytes) {
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostStaging> h,
                          PinnedHostStaging::Create(slots, slot_bytes, stream_));
  return std::unique_ptr<HostStaging>(std::move(h));
}

void* GpuBackend::Alloc(size_t bytes) {
  void* p = nullptr;
  Status s = dev::Malloc(&p, bytes == 0 ? 1 : bytes);
  return s.ok() ? p : nullptr;  // out of memory is reported to the caller as nullptr
}

void GpuBackend::Free(void* ptr) {
  if (ptr != nullptr) Record(dev::Free(ptr));
}

void GpuBackend::CopyHostToDevice(void* dst, const void* src, size_t bytes) {
  Record(dev::MemcpyAsync(dst, src, bytes, dev::CopyKind::kHostToDevice, stream_));
  if (!capturing_) Record(dev::StreamSynchronize(stream_));  // `src` may be freed on return
}

void GpuBackend::CopyDeviceToHost(void* dst, const void* src, size_t bytes) {
  Record(dev::MemcpyAsync(dst, src, bytes, dev::CopyKind::kDeviceToHost, stream_));
  Record(dev::StreamSynchronize(stream_));
}

void GpuBackend::CopyDeviceToHost2D(void* dst, size_t dst_pitch, const void* src,
                                    size_t src_pitch, size_t width, size_t height) {
  Record(dev::Memcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                            dev::CopyKind::kDeviceToHost, stream_));
  Record(dev::StreamSynchronize(stream_));
}

void GpuBackend::CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  Record(dev::MemcpyAsync(dst, src, bytes, dev::CopyKind::kDeviceToDevice, stream_));
}

void GpuBackend::Memset0(void* dst, size_t bytes) {
  Record(dev::MemsetAsync(dst, 0, bytes, stream_));
}

void GpuBackend::Synchronize() { Record(dev::StreamSynchronize(stream_)); }

Result<int> GpuBackend::NewMarker() {
  cudaEvent_t e = nullptr;
  TRAIND_RETURN_IF_ERROR(dev::EventCreate(&e));
  markers_.push_back(e);
  return static_cast<int>(markers_.size()) - 1;
}

Status GpuBackend::RecordMarker(int marker) {
  if (marker < 0 || marker >= static_cast<int>(markers_.size())) {
    return Status::InvalidArgument("RecordMarker: no marker " + std::to_string(marker));
  }
  if (capturing_) return Status::FailedPrecondition("RecordMarker: the stream is being captured");
  return dev::EventRecord(markers_[static_cast<size_t>(marker)], stream_);
}

Status GpuBackend::WaitMarker(int marker) {
  if (marker < 0 || marker >= static_cast<int>(markers_.size())) {
    return Status::InvalidArgument("WaitMarker: no marker " + std::to_string(marker));
  }
  if (device_ >= 0) TRAIND_RETURN_IF_ERROR(dev::SetDevice(device_));
  return dev::EventSynchronize(markers_[static_cast<size_t>(marker)]);
}

void GpuBackend::EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N,
                                  int64_t C, bool accumulate) {
  Record(gpu::EmbeddingForward(out, ids, table, N, C, accumulate, stream_));
}
void GpuBackend::EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                                   int64_t C) {
  Record(gpu::EmbeddingBackward(dtable, dout, ids, N, C, stream_));
}
void GpuBackend::ScaleRows(float* x, const float* w, int64_t N, int64_t C) {
  Record(gpu::ScaleRows(x, w, N, C, stream_));
}
void GpuBackend::RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  Record(gpu::RowDot(out, a, b, N, C, stream_));
}
void GpuBackend::AddBias(float* out, const float* bias, int64_t N, int64_t OC) {
  Record(gpu::AddBias(out, bias, N, OC, stream_));
}
void GpuBackend::BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) {
  Record(gpu::BiasBackward(dbias, dout, N, OC, stream_));
}
void GpuBackend::BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC,
                                     void* dout16, DType type) {
  Record(gpu::BiasBackwardRounded(dbias, dout, N, OC, dout16, type, stream_));
}
void GpuBackend::Add(float* out, const float* a, const float* b, int64_t n) {
  Record(gpu::Add(out, a, b, n, stream_));
}
void GpuBackend::Scale(float* x, float s, int64_t n) { Record(gpu::Scale(x, s, n, stream_)); }

double GpuBackend::SumSquares(const float* x, int64_t n) {
  Record(dev::MemsetAsync(sumsq_, 0, sizeof(double), stream_));
  Record(gpu::SumSquares(sumsq_, x, n, stream_));
  double out = 0.0;
  CopyDeviceToHost(&out, sumsq_, sizeof(double));
  return out;
}

bool GpuBackend::HasNonFinite(const float* x, int64_t n) {
  Record(dev::MemsetAsync(flag_, 0, sizeof(int), stream_));
  Record(gpu::FlagNonFinite(flag_, x, n, stream_));
  int flag = 0;
  CopyDeviceToHost(&flag, flag_, sizeof(int));
  return flag != 0;
}

void GpuBackend::AccumulateSumSquares(double* acc, const float* x, int64_t n) {
  Record(gpu::SumSquares(acc, x, n, stream_));
}

void GpuBackend::AccumulateSum(double* acc, const float* x, int64_t n, const float* weight) {
  Record(gpu::WeightedSum(acc, x, n, weight, stream_));
}

void GpuBackend::Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  Record(gpu::Cast(dst, dst_type, src, src_type, n, stream_));
}

void GpuBackend::Dequantize4bit(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                                int64_t ld, DType out_type) {
  Record(gpu::Dequantize4bitRows(q, cols, r0, r1, out, ld, out_type, stream_));
}

void GpuBackend::Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
                         const uint64_t* key, uint64_t stream, bool accumulate) {
  Record(gpu::Dropout(out, inp, inp_type, n, p, key, stream, accumulate, stream_));
}

void GpuBackend::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int64_t N, int64_t C,
                                  float eps) {
  Record(gpu::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, stream_));
}
void GpuBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int64_t N, int64_t C) {
  Record(
      gpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream_));
}
void GpuBackend::RmsNormForward(float* out, float* rstd, const float* inp, const float* weight,
                                int64_t N, int64_t C, float eps) {
  Record(gpu::RmsNormForward(out, rstd, inp, weight, N, C, eps, stream_));
}
void GpuBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int64_t N, int64_t C) {
  Record(gpu::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, stream_));
}
void GpuBackend::LayerNormForwardRounded(void* out16, DType out_type, float* /*out32*/,
                                         float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t N,
                                         int64_t C, float eps) {
  Record(gpu::ResidualNormForward(nullptr, out16, out_type, mean, rstd, inp, nullptr, weight, bias,
                                  N, C, eps, false, stream_));
}
void GpuBackend::RmsNormForwardRounded(void* out16, DType out_type, float* /*out32*/, float* rstd,
                                       const float* inp, const float* weight, int64_t N, int64_t C,
                                       float eps) {
  Record(gpu::ResidualNormForward(nullptr, out16, out_type, nullptr, rstd, inp, nullptr, weight,
                                  nullptr, N, C, eps, true, stream_));
}
void GpuBackend::ResidualNormForward(float* res, void* out, DType out_type, float* /*scratch*/,
                                     float* mean, float* rstd, const float* a, const float* b,
                                     const float* weight, const float* bias, int64_t N, int64_t C,
                                     float eps, bool rms) {
  Record(gpu::ResidualNormForward(res, out, out_type, mean, rstd, a, b, weight, bias, N, C, eps,
                                  rms, stream_));
}
void GpuBackend::HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight,
                                    int64_t N, int64_t n_heads, int64_t HS, int64_t row_stride,
                                    float eps) {
  Record(gpu::HeadRmsNormForward(x, saved, rstd, weight, N, n_heads, HS, row_stride, eps, stream_));
}
void GpuBackend::HeadRmsNormBackward(float* dx, float* dweight, const float* saved,
                                     const float* weight, const float* rstd, int64_t N,
                                     int64_t n_heads, int64_t HS, int64_t row_stride) {
  Record(gpu::HeadRmsNormBackward(dx, dweight, saved, weight, rstd, N, n_heads, HS, row_stride,
                                  stream_));
}
void GpuBackend::GeluForward(float* out, const float* inp, int64_t n) {
  Record(gpu::GeluForward(out, inp, n, stream_));
}
void GpuBackend::GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  Record(gpu::GeluBackward(dinp, inp, dout, n, stream_));
}
void GpuBackend::GeluErfForward(float* out, const float* inp, int64_t n) {
  Record(gpu::GeluErfForward(out, inp, n, stream_));
}
void GpuBackend::GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  Record(gpu::GeluErfBackward(dinp, inp, dout, n, stream_));
}
void GpuBackend::TanhForward(float* out, const float* inp, int64_t n) {
  Record(gpu::TanhForward(out, inp, n, stream_));
}
void GpuBackend::TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) {
  Record(gpu::TanhBackward(dinp, out, dout, n, stream_));
}
void GpuBackend::SwiGluForward(float* out, const float* inp, int64_t N, int64_t H) {
  Record(gpu::SwiGluForward(out, inp, N, H, stream_));
}
void GpuBackend::SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                                int64_t H) {
  Record(gpu::SwiGluBackward(dinp, inp, dout, N, H, stream_));
}
void GpuBackend::GeGluForward(float* out, const float* inp, int64_t N, int64_t H) {
  Record(gpu::GeGluForward(out, inp, N, H, stream_));
}
void GpuBackend::GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                               int64_t H) {
  Record(gpu::GeGluBackward(dinp, inp, dout, N, H, stream_));
}
void GpuBackend::Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS,
                      int64_t row_stride, float theta, bool inverse, int64_t pos_offset,
                      const RopeScaling& scaling, const int32_t* positions) {
  Record(gpu::Rope(x, B, T, n_heads, HS, row_stride, theta, inverse, pos_offset, scaling, stream_,
                   positions));
}
void GpuBackend::AttentionDecode(float* out, const float* q, const float* k, const float* v,
                                 int64_t B, int64_t T, int64_t cache_rows, int64_t NH,
                                 int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                 int64_t window) {
  Record(gpu::AttentionDecode(out, q, k, v, B, T, cache_rows, NH, NKV, HS, q_stride, kv_stride,
                              window, stream_));
}
// 16-bit jobs (operand_type bf16/fp16) with a head size the tensor-core kernels have take them
// (attention_tc.cu), converting the fp32 tensors at the op boundary; fp32 jobs keep attention.cu.
static bool UseTensorCoreAttention(DType operand_type, int64_t HS) {
  return operand_type != DType::kF32 && gpu::AttentionTcSupportsHeadSize(HS);
}

bool GpuBackend::EnsureScratch(int64_t floats, const char* op) {
  if (floats <= scratch_floats_) return true;  // first step only: the shapes of a job do not change
  if (capturing_) {
    Record(Status::FailedPrecondition(std::string(op) +
                                      ": scratch must be allocated before graph capture (run a "
                                      "step first)"));
    return false;
  }
  Record(dev::StreamSynchronize(stream_));
  if (scratch_ != nullptr) Record(dev::Free(scratch_));
  scratch_ = nullptr;
  scratch_floats_ = 0;
  void* p = nullptr;
  const Status s = dev::Malloc(&p, static_cast<size_t>(floats) * sizeof(float));
  if (!s.ok()) {
    Record(s);
    return false;
  }
  scratch_ = static_cast<float*>(p);
  scratch_floats_ = floats;
  return true;
}

void GpuBackend::AttentionForward(float* out, float* lse, const float* q, const float* k,
                                  const float* v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                  int64_t HS, int64_t q_stride, int64_t kv_stride, bool causal,
                                  const int32_t* key_mask, DType operand_type,
                                  int64_t window, const int32_t* doc_start) {
  if (UseTensorCoreAttention(operand_type, HS)) {
    if (!EnsureScratch(gpu::AttentionTcF32WorkspaceFloats(B, T, NH, NKV, HS), "AttentionForward"))
      return;
    Record(gpu::AttentionTcForwardF32(out, lse, q, k, v, operand_type, B, T, NH, NKV, HS, q_stride,
                                      kv_stride, {causal, key_mask, window, doc_start}, scratch_,
                                      stream_));
    return;
  }
  Record(gpu::AttentionForward(out, lse, q, k, v, B, T, NH, NKV, HS, q_stride, kv_stride, causal,
                               key_mask, window, stream_, doc_start));
}
void GpuBackend::AttentionBackward(float* dq, float* dk, float* dv, const float* dout,
                                   const float* out, const float* lse, const float* q,
                                   const float* k, const float* v, int64_t B, int64_t T, int64_t NH,
                                   int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                   bool causal, const int32_t* key_mask,
                                   DType operand_type, int64_t window,
                                   const int32_t* doc_start) {
  if (UseTensorCoreAttention(operand_type, HS)) {
    if (!EnsureScratch(gpu::AttentionTcF32WorkspaceFloats(B, T, NH, NKV, HS), "AttentionBackward"))
      return;
    Record(gpu::AttentionTcBackwardF32(dq, dk, dv, dout, out, lse, q, k, v, operand_type, B, T, NH,
                                       NKV, HS, q_stride, kv_stride,
                                       {causal, key_mask, window, doc_start}, scratch_, stream_));
    return;
  }
  if (!EnsureScratch(B * NH * T, "AttentionBackward")) return;
  Record(gpu::AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, q_stride,
                                kv_stride, causal, key_mask, window, scratch_, stream_,
                                doc_start));
}
// 16-bit attention tensors: the tensor-core kernels read them as they are (fp32 gradients, dq
// accumulated in place: the only scratch is the backward's row deltas). A head size without a
// tensor-core kernel, or strides/pointers it cannot load, widens them into scratch_ (q, k, v with
// their strides; a fused qkv row once) for attention.cu's fp32 kernels.
static bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
static bool UseTensorCore16(int64_t HS, int64_t q_stride, int64_t kv_stride,
                            std::initializer_list<const void*> ptrs) {
  if (!gpu::AttentionTcSupportsHeadSize(HS) || q_stride % 8 != 0 || kv_stride % 8 != 0)
    return false;
  for (const void* p : ptrs)
    if (!Aligned16(p)) return false;
  return true;
}
// Floats of scratch_ the widened q, k, v take; *fused: q, k, v are one qkv row (widened once).
static int64_t Widened16Floats(const void* q, const void* k, const void* v, int64_t N, int64_t QW,
                               int64_t KW, int64_t q_stride, int64_t kv_stride, bool* fused) {
  const auto* q16 = static_cast<const uint16_t*>(q);
  *fused = q_stride == kv_stride && static_cast<const uint16_t*>(k) == q16 + QW &&
           static_cast<const uint16_t*>(v) == q16 + QW + KW;
  return *fused ? N * q_stride : N * (q_stride + 2 * kv_stride);
}
// Widens q, k, v (16-bit `type`, N rows) into ws with their strides: the spans from each tensor's
// first element to its last row's last head element (columns between the heads come along).
void GpuBackend::WidenAttention16(float* ws, bool fused, const void* q, const void* k,
                                  const void* v, DType type, int64_t N, int64_t QW, int64_t KW,
                                  int64_t q_stride, int64_t kv_stride, const float** qf,
                                  const float** kf, const float** vf) {
  if (fused) {
    Cast(ws, DType::kF32, q, type, (N - 1) * q_stride + QW + 2 * KW);
    *qf = ws;
    *kf = ws + QW;
    *vf = ws + QW + KW;
    return;
  }
  float* kw = ws + N * q_stride;
  float* vw = kw + N * kv_stride;
  Cast(ws, DType::kF32, q, type, (N - 1) * q_stride + QW);
  Cast(kw, DType::kF32, k, type, (N - 1) * kv_stride + KW);
  Cast(vw, DType::kF32, v, type, (N - 1) * kv_stride + KW);
  *qf = ws;
  *kf = kw;
  *vf = vw;
}

void GpuBackend::SetSdpaSelectorForTesting(std::unique_ptr<SdpaSelector> selector) {
  sdpa_ = std::move(selector);
}

// The cuDNN SDPA path (cudnn_sdpa.h): off unless TRAIND_CUDNN_SDPA is set; a shape's first call
// runs the self-check (both paths on this call's inputs, outside graph capture), then the
// verdict stands.
bool GpuBackend::CudnnAttentionForward16(void* out, float* lse, const void* q, const void* k,
                                         const void* v, DType type, int64_t B, int64_t T,
                                         int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                                         int64_t kv_stride, bool causal, const int32_t* key_mask,
                                         int64_t window, const int32_t* doc_start) {
  if (sdpa_ == nullptr) {
    const bool on = CudnnSdpaSwitchOn();
    sdpa_ = std::make_unique<SdpaSelector>(on, on ? MakeCudnnSdpaPath() : nullptr);
  }
  SdpaShape shape;
  shape.type = type;
  shape.B = B, shape.T = T, shape.NH = NH, shape.NKV = NKV, shape.HS = HS;
  shape.q_stride = q_stride, shape.kv_stride = kv_stride;
  shape.causal = causal;
  shape.key_mask = key_mask != nullptr;
  shape.window = window > 0;
  shape.doc_start = doc_start != nullptr;
  const AttentionTcMasks masks{causal, key_mask, window, doc_start};
  auto self_check = [&]() -> Result<SdpaCheck> {
    const int64_t n_out = B * T * NH * HS, n_lse = B * NH * T;
    void* p = nullptr;
    const size_t out_bytes = (static_cast<size_t>(n_out) * 2 + 255) / 256 * 256;
    TRAIND_RETURN_IF_ERROR(dev::Malloc(&p, out_bytes + static_cast<size_t>(n_lse) * sizeof(float)));
    void* out2 = p;  // 256-byte aligned, as cuDNN's tensors must be
    float* lse2 = reinterpret_cast<float*>(static_cast<char*>(p) + out_bytes);
    Status st = gpu::AttentionTcForward(out, lse, q, k, v, type, B, T, NH, NKV, HS, q_stride,
                                        kv_stride, masks, stream_);
    if (st.ok()) st = sdpa_->path()->Forward(out2, lse2, q, k, v, shape, stream_);
    std::vector<uint16_t> o1(static_cast<size_t>(n_out)), o2(o1.size());
    std::vector<float> l1(static_cast<size_t>(n_lse)), l2(l1.size());
    auto down = [&](void* dst, const void* src, size_t bytes) {
      if (st.ok()) st = dev::MemcpyAsync(dst, src, bytes, dev::CopyKind::kDeviceToHost, stream_);
    };
    down(o1.data(), out, o1.size() * 2);
    down(o2.data(), out2, o2.size() * 2);
    down(l1.data(), lse, l1.size() * 4);
    down(l2.data(), lse2, l2.size() * 4);
    if (st.ok()) st = dev::StreamSynchronize(stream_);
    (void)dev::StreamSynchronize(stream_);
    (void)dev::Free(p);
    TRAIND_RETURN_IF_ERROR(st);
    SdpaCheck c;
    auto widen = [type](uint16_t h) { return type == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h); };
    for (size_t i = 0; i < o1.size(); ++i) {
      const double a = widen(o1[i]), b = widen(o2[i]);
      c.out_scale = std::max(c.out_scale, std::fabs(a));
      const double d = std::fabs(a - b);
      if (std::isnan(d) || d > c.out_diff) c.out_diff = d;  // a NaN sticks
    }
    for (size_t i = 0; i < l1.size(); ++i) {
      c.lse_scale = std::max(c.lse_scale, std::fabs(double{l1[i]}));
      const double d = std::fabs(double{l1[i]} - l2[i]);
      if (std::isnan(d) || d > c.lse_diff) c.lse_diff = d;
    }
    return c;
  };
  if (!sdpa_->UsePath(shape, !capturing_, self_check)) return false;
  Record(sdpa_->path()->Forward(out, lse, q, k, v, shape, stream_));
  return true;
}

void GpuBackend::AttentionForward16(void* out, float* lse, const void* q, const void* k,
                                    const void* v, DType type, int64_t B, int64_t T, int64_t NH,
                                    int64_t NKV, int64_t HS, int64_t q_stride, int64_t kv_stride,
                                    bool causal, const int32_t* key_mask, int64_t window,
                                    const int32_t* doc_start) {
  if (UseTensorCore16(HS, q_stride, kv_stride, {out, q, k, v})) {
    if (CudnnAttentionForward16(out, lse, q, k, v, type, B, T, NH, NKV, HS, q_stride, kv_stride,
                                causal, key_mask, window, doc_start))
      return;
    Record(gpu::AttentionTcForward(out, lse, q, k, v, type, B, T, NH, NKV, HS, q_stride, kv_stride,
                                   {causal, key_mask, window, doc_start}, stream_));
    return;
  }
  const int64_t N = B * T, QW = NH * HS, KW = NKV * HS;
  bool fused = false;
  const int64_t wf = Widened16Floats(q, k, v, N, QW, KW, q_stride, kv_stride, &fused);
  if (!EnsureScratch(wf + N * QW, "AttentionForward16")) return;
  const float *qf, *kf, *vf;
  WidenAttention16(scratch_, fused, q, k, v, type, N, QW, KW, q_stride, kv_stride, &qf, &kf, &vf);
  float* of = scratch_ + wf;
  Record(gpu::AttentionForward(of, lse, qf, kf, vf, B, T, NH, NKV, HS, q_stride, kv_stride, causal,
                               key_mask, window, stream_, doc_start));
  Cast(out, type, of, DType::kF32, N * QW);
}
void GpuBackend::AttentionBackward16(float* dq, float* dk, float* dv, const void* dout,
                                     const void* out, const float* lse, const void* q,
                                     const void* k, const void* v, DType type, int64_t B,
                                     int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                                     int64_t q_stride, int64_t kv_stride, bool causal,
                                     const int32_t* key_mask, int64_t window,
                                     const int32_t* doc_start) {
  if (UseTensorCore16(HS, q_stride, kv_stride, {dq, dk, dv, dout, out, q, k, v})) {
    if (!EnsureScratch(gpu::AttentionTcBackwardF32GradsScratchFloats(B, T, NH),
                       "AttentionBackward16"))
      return;
    Record(gpu::AttentionTcBackwardF32Grads(dq, dk, dv, dout, out, lse, q, k, v, type, B, T, NH,
                                            NKV, HS, q_stride, kv_stride,
                                            {causal, key_mask, window, doc_start}, scratch_,
                                            stream_));
    return;
  }
  const int64_t N = B * T, QW = NH * HS, KW = NKV * HS;
  bool fused = false;
  const int64_t wf = Widened16Floats(q, k, v, N, QW, KW, q_stride, kv_stride, &fused);
  if (!EnsureScratch(wf + 2 * N * QW + B * NH * T, "AttentionBackward16")) return;
  const float *qf, *kf, *vf;
  WidenAttention16(scratch_, fused, q, k, v, type, N, QW, KW, q_stride, kv_stride, &qf, &kf, &vf);
  float* dof = scratch_ + wf;
  float* of = dof + N * QW;
  Cast(dof, DType::kF32, dout, type, N * QW);
  Cast(of, DType::kF32, out, type, N * QW);
  Record(gpu::AttentionBackward(dq, dk, dv, dof, of, lse, qf, kf, vf, B, T, NH, NKV, HS, q_stride,
                                kv_stride, causal, key_mask, window, of + N * QW, stream_,
                                doc_start));
}
void GpuBackend::SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets,
                                     int64_t N, int64_t V, int64_t Vp, float grad_scale,
                                     bool compute_grad, const float* device_scale,
                                     void* grad16, DType grad16_type) {
  Record(gpu::SoftmaxCrossEntropy(logits, losses, targets, N, V, Vp, grad_scale, compute_grad,
                                  device_scale, stream_));
  // The 16-bit gradient: in place, then rounded (one more pass; the CPU fuses it).
  if (compute_grad && grad16 != nullptr) Cast(grad16, grad16_type, logits, DType::kF32, N * Vp);
}
void GpuBackend::AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float bias_correction1, float bias_correction2, float grad_scale) {
  Record(gpu::AdamW(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bias_correction1,
                    bias_correction2, grad_scale, stream_));
}

void GpuBackend::AdamWFromScalars(float* param, const float* grad, float* m, float* v, int64_t n,
                                  const StepScalars* s, float beta1, float beta2, float eps,
                                  float weight_decay) {
  Record(gpu::AdamWFromScalars(param, grad, m, v, n, s, beta1, beta2, eps, weight_decay, stream_));
}

void GpuBackend::AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                                      const AdamWRun* runs, int64_t n_runs, const StepScalars* s,
                                      float beta1, float beta2, float eps) {
  if (n_runs < 0) {
    Record(Status::InvalidArgument("AdamWRunsFromScalars: negative run count " +
                                   std::to_string(n_runs)));
    return;
  }
  auto same = [&](const AdamWTable& t) {
    if (t.runs.size() != static_cast<size_t>(n_runs)) return false;
    for (int64_t i = 0; i < n_runs; ++i) {
      const AdamWRun& a = t.runs[static_cast<size_t>(i)];
      if (a.offset != runs[i].offset || a.numel != runs[i].numel ||
          !(a.weight_decay == runs[i].weight_decay))
        return false;
    }
    return true;
  };
  const AdamWTable* table = nullptr;
  for (const AdamWTable& t : adamw_tables_)
    if (same(t)) table = &t;
  if (table == nullptr) {
    if (capturing_) {
      Record(Status::FailedPrecondition(
          "AdamWRunsFromScalars: a runs table first seen during graph capture (its device copy "
          "is made outside capture: run a step first)"));
      return;
    }
    const std::vector<gpu::AdamWChunk> chunks = gpu::AdamWChunksOf(runs, n_runs);
    AdamWTable t;
    t.runs.assign(runs, runs + n_runs);
    t.n_chunks = static_cast<int64_t>(chunks.size());
    const size_t bytes = chunks.size() * sizeof(gpu::AdamWChunk);
    if (bytes > 0) {
      const Status st = dev::Malloc(&t.chunks, bytes);
      if (!st.ok()) {
        Record(st);
        return;
      }
      Record(dev::MemcpyAsync(t.chunks, chunks.data(), bytes, dev::CopyKind::kHostToDevice,
                              stream_));
      Record(dev::StreamSynchronize(stream_));  // `chunks` is freed on return
    }
    adamw_tables_.push_back(std::move(t));
    table = &adamw_tables_.back();
  }
  Record(gpu::AdamWChunksFromScalars(param, grad, m, v,
                                     static_cast<const gpu::AdamWChunk*>(table->chunks),
                                     table->n_chunks, s, beta1, beta2, eps, stream_));
}

void GpuBackend::SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr,
                           float momentum, float dampening, float weight_decay, bool nesterov,
                           bool first_step, float grad_scale, const StepScalars* s) {
  Record(gpu::SgdUpdate(param, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov,
                        first_step, grad_scale, s, stream_));
}

void GpuBackend::AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum,
                                        int64_t B, int64_t R, int64_t C, float beta2t, float eps1,
                                        float grad_scale) {
  Record(gpu::AdafactorFactoredStats(grad, row, col, row_sum, B, R, C, beta2t, eps1, grad_scale,
                                     stream_));
}

void GpuBackend::AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t,
                                       float eps1, float grad_scale) {
  Record(gpu::AdafactorSecondMoment(grad, v, n, beta2t, eps1, grad_scale, stream_));
}

void GpuBackend::AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row,
                                           const float* col, const double* row_sum, const float* v,
                                           int64_t B, int64_t R, int64_t C, float grad_scale) {
  Record(gpu::AdafactorUpdateSumSquares(acc, grad, row, col, row_sum, v, B, R, C, grad_scale,
                                        stream_));
}

void GpuBackend::AdafactorApply(float* param, float* m, const float* grad, const float* row,
                                const float* col, const double* row_sum, const float* v,
                                const double* sums, int64_t B, int64_t R, int64_t C,
                                float grad_scale, float rel_step, float eps2, bool scale_parameter,
                                float clip_threshold, float beta1, float weight_decay) {
  Record(gpu::AdafactorApply(param, m, grad, row, col, row_sum, v, sums, B, R, C, grad_scale,
                             rel_step, eps2, scale_parameter, clip_threshold, beta1, weight_decay,
                             stream_));
}

void GpuBackend::AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes,
                                    uint8_t* v_codes, float* m_absmax, float* v_absmax,
                                    const float* code_m, const float* code_v, int64_t n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay,
                                    float bias_correction1, float bias_correction2,
                                    float grad_scale, const StepScalars* s) {
  Record(gpu::AdamW8bitBlockwise(param, grad, m_codes, v_codes, m_absmax, v_absmax, code_m, code_v,
                                 n, lr, beta1, beta2, eps, weight_decay, bias_correction1,
                                 bias_correction2, grad_scale, s, stream_));
}

TRAIND_GPU_END
