// GpuBackend: the Backend of backend.h on a CUDA device, or on the simt emulator, through the same
// kernels (kernels.h) and the device-runtime layer (device.h). The GEMM is left to the subclass:
// cuBLASLt on a real device (cuda_backend.cc), the CPU backend's GEMM under simt (simt_backend.cc).
// Work is issued on one stream owned by the backend. Bad input to an op (a shape a kernel cannot
// take) does not abort: the op does nothing and status() reports the first such error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cudnn_sdpa.h"  // SdpaSelector
#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

class GpuBackend : public Backend {
 public:
  ~GpuBackend() override;
  std::string name() const override { return name_; }
  bool Supports(Op /*op*/) const override { return true; }  // every op has a kernel
  // DeviceCapabilitiesOf(kCuda), or (kSimt) under the emulator (gpu_backend.cc).
  DeviceCapabilities capabilities() const override;

  // The first error an op hit (OK when none).
  const Status& status() const override { return status_; }
  // Free and total device memory in bytes (cudaMemGetInfo; a nominal 16 GiB under simt), for the
  // metrics.
  Status MemoryInfo(size_t* free_bytes, size_t* total_bytes) const override;
  cudaStream_t stream() const { return stream_; }
  // Floats of attention's device scratch (below) allocated so far: outside the model's plan.
  int64_t attention_scratch_floats() const { return scratch_floats_; }

  // Graph capture of the ops issued between BeginCapture and EndCapture (they are recorded, not
  // run); Replay(id) runs a captured sequence again. Ops that return values to the host
  // (SumSquares, HasNonFinite, copies to the host) must not be issued while capturing.
  bool SupportsGraphs() const override { return true; }
  Status BeginCapture() override;
  Result<int> EndCapture() override;
  Status Replay(int graph) override;
  // Pinned slots and a copy stream (BatchUploader).
  Result<std::unique_ptr<BatchUpload>> MakeBatchUpload(size_t slot_bytes) override;
  // Pinned slots and a copy stream ordered with the compute stream (PinnedHostStaging).
  Result<std::unique_ptr<HostStaging>> MakeHostStaging(int slots, size_t slot_bytes) override;
  // Markers are CUDA events (timing off) recorded on the compute stream; WaitMarker sets the
  // backend's device on the calling thread first (the current device is per thread) and
  // synchronizes on the event.
  Result<int> NewMarker() override;
  Status RecordMarker(int marker) override;
  Status WaitMarker(int marker) override;

  void* Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyHostToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes) override;
  void CopyDeviceToHost2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                          size_t width, size_t height) override;
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override;
  void Memset0(void* dst, size_t bytes) override;
  void Synchronize() override;

  void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                        bool accumulate) override;
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                         int64_t C) override;
  void AddBias(float* out, const float* bias, int64_t N, int64_t OC) override;
  void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) override;
  // The column sums and the rounding in one pass over dout (elementwise.cu); GeluBackwardBias's
  // default composition (GeluBackward, then this) is then two passes.
  void BiasBackwardRounded(float* dbias, const float* dout, int64_t N, int64_t OC, void* dout16,
                           DType type) override;
  void ScaleRows(float* x, const float* w, int64_t N, int64_t C) override;
  void RowDot(float* out, const float* a, const float* b, int64_t N, int64_t C) override;
  void Add(float* out, const float* a, const float* b, int64_t n) override;
  void Scale(float* x, float s, int64_t n) override;
  double SumSquares(const float* x, int64_t n) override;
  bool HasNonFinite(const float* x, int64_t n) override;
  void AccumulateSumSquares(double* acc, const float* x, int64_t n) override;
  void AccumulateSum(double* acc, const float* x, int64_t n, const float* weight) override;
  void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) override;
  void Dequantize4bit(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out, int64_t ld,
                      DType out_type) override;
  void Dropout(float* out, const void* inp, DType inp_type, int64_t n, float p,
               const uint64_t* key, uint64_t stream, bool accumulate) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C) override;
  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override;
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override;
  // The norm with its output rounded to 16 bits in one kernel (norm.cu); out32 is not used.
  void LayerNormForwardRounded(void* out16, DType out_type, float* out32, float* mean,
                               float* rstd, const float* inp, const float* weight,
                               const float* bias, int64_t N, int64_t C, float eps) override;
  void RmsNormForwardRounded(void* out16, DType out_type, float* out32, float* rstd,
                             const float* inp, const float* weight, int64_t N, int64_t C,
                             float eps) override;
  // The residual add and the norm after it in one kernel (norm.cu); scratch is not used.
  void ResidualNormForward(float* res, void* out, DType out_type, float* scratch, float* mean,
                           float* rstd, const float* a, const float* b, const float* weight,
                           const float* bias, int64_t N, int64_t C, float eps, bool rms) override;
  void HeadRmsNormForward(float* x, float* saved, float* rstd, const float* weight, int64_t N,
                          int64_t n_heads, int64_t HS, int64_t row_stride, float eps) override;
  void HeadRmsNormBackward(float* dx, float* dweight, const float* saved, const float* weight,
                           const float* rstd, int64_t N, int64_t n_heads, int64_t HS,
                           int64_t row_stride) override;
  void GeluForward(float* out, const float* inp, int64_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void GeluErfForward(float* out, const float* inp, int64_t n) override;
  void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void TanhForward(float* out, const float* inp, int64_t n) override;
  void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) override;
  void SwiGluForward(float* out, const float* inp, int64_t N, int64_t H) override;
  void SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                      int64_t H) override;
  void GeGluForward(float* out, const float* inp, int64_t N, int64_t H) override;
  void GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                     int64_t H) override;
  void Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
            float theta, bool inverse, int64_t pos_offset = 0,
            const RopeScaling& scaling = RopeScaling{},
            const int32_t* positions = nullptr) override;
  void AttentionDecode(float* out, const float* q, const float* k, const float* v, int64_t B,
                       int64_t T, int64_t cache_rows, int64_t NH, int64_t NKV, int64_t HS,
                       int64_t q_stride, int64_t kv_stride, int64_t window = 0) override;
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, int64_t q_stride,
                        int64_t kv_stride, bool causal = true, const int32_t* key_mask = nullptr,
                        DType operand_type = DType::kF32, int64_t window = 0,
                        const int32_t* doc_start = nullptr) override;
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                         int64_t q_stride, int64_t kv_stride, bool causal = true,
                         const int32_t* key_mask = nullptr,
                         DType operand_type = DType::kF32, int64_t window = 0,
                         const int32_t* doc_start = nullptr) override;
  void AttentionForward16(void* out, float* lse, const void* q, const void* k, const void* v,
                          DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                          int64_t q_stride, int64_t kv_stride, bool causal = true,
                          const int32_t* key_mask = nullptr, int64_t window = 0,
                          const int32_t* doc_start = nullptr) override;
  void AttentionBackward16(float* dq, float* dk, float* dv, const void* dout, const void* out,
                           const float* lse, const void* q, const void* k, const void* v,
                           DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                           int64_t q_stride, int64_t kv_stride, bool causal = true,
                           const int32_t* key_mask = nullptr, int64_t window = 0,
                           const int32_t* doc_start = nullptr) override;
  void SoftmaxCrossEntropy(float* logits, float* losses, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float grad_scale, bool compute_grad,
                           const float* device_scale, void* grad16 = nullptr,
                           DType grad16_type = DType::kBF16) override;
  void AdamW(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bias_correction1,
             float bias_correction2, float grad_scale) override;
  void AdamWFromScalars(float* param, const float* grad, float* m, float* v, int64_t n,
                        const StepScalars* s, float beta1, float beta2, float eps,
                        float weight_decay) override;
  // One launch over every run (adamw.cu's chunk table). The device copy of a runs table is made
  // on its first use, outside graph capture, and kept for the backend's life (a job's runs are
  // fixed), so a captured launch reads a table that never moves; a table first seen while
  // capturing records FAILED_PRECONDITION (run a step first, as the trainer does).
  void AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                            const AdamWRun* runs, int64_t n_runs, const StepScalars* s,
                            float beta1, float beta2, float eps) override;
  void SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                 float dampening, float weight_decay, bool nesterov, bool first_step,
                 float grad_scale, const StepScalars* s) override;
  void AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                              int64_t R, int64_t C, float beta2t, float eps1,
                              float grad_scale) override;
  void AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                             float grad_scale) override;
  void AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                                 const double* row_sum, const float* v, int64_t B, int64_t R,
                                 int64_t C, float grad_scale) override;
  void AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                      const double* row_sum, const float* v, const double* sums, int64_t B,
                      int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                      bool scale_parameter, float clip_threshold, float beta1,
                      float weight_decay) override;
  void AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes,
                          float* m_absmax, float* v_absmax, const float* code_m,
                          const float* code_v, int64_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float bias_correction1,
                          float bias_correction2, float grad_scale, const StepScalars* s) override;

 protected:
  // `device`: the CUDA device the backend runs on (WaitMarker selects it on other threads); -1
  // under simt (one emulated device).
  explicit GpuBackend(std::string name, int device = -1)
      : name_(std::move(name)), device_(device) {}
  // Creates the stream and the small device scalars; call once from the factory.
  Status Init();
  // Keeps the first error and reports it on stderr once.
  void Record(const Status& s);

 public:
  // Replaces the choice of the cuDNN SDPA path (cudnn_sdpa.h; default: made on the first 16-bit
  // attention from TRAIND_CUDNN_SDPA and MakeCudnnSdpaPath) by `selector`, e.g. a test's with a
  // stand-in path.
  void SetSdpaSelectorForTesting(std::unique_ptr<SdpaSelector> selector);

 private:
  // AttentionForward16 on cuDNN's path when the selector takes this call (true: done).
  bool CudnnAttentionForward16(void* out, float* lse, const void* q, const void* k, const void* v,
                               DType type, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HS, int64_t q_stride, int64_t kv_stride, bool causal,
                               const int32_t* key_mask, int64_t window, const int32_t* doc_start);
  std::unique_ptr<SdpaSelector> sdpa_;

 private:
  std::string name_;
  int device_ = -1;
  Status status_;
  cudaStream_t stream_ = nullptr;
  double* sumsq_ = nullptr;   // device scalar for SumSquares
  int* flag_ = nullptr;       // device flag for HasNonFinite
  // Grows scratch_ to `floats` (outside graph capture; false and the error recorded otherwise).
  bool EnsureScratch(int64_t floats, const char* op);
  // AttentionForward16/Backward16 without the tensor-core kernel: q, k, v widened into ws
  // (gpu_backend.cc).
  void WidenAttention16(float* ws, bool fused, const void* q, const void* k, const void* v,
                        DType type, int64_t N, int64_t QW, int64_t KW, int64_t q_stride,
                        int64_t kv_stride, const float** qf, const float** kf, const float** vf);

  // Attention's device scratch, grown on demand: the backward's B*NH*T row deltas (the fp32
  // kernels, and the tensor-core kernels on 16-bit tensors), or the 16-bit copies of fp32 tensors
  // (AttentionForward/Backward with a 16-bit operand type) and the fp32 copies of 16-bit ones
  // (AttentionForward16/Backward16 without a tensor-core kernel).
  float* scratch_ = nullptr;
  int64_t scratch_floats_ = 0;
  // AdamWRunsFromScalars' device chunk tables, one per distinct runs table seen (usually one).
  struct AdamWTable {
    std::vector<AdamWRun> runs;  // the host table it was made from
    void* chunks = nullptr;      // device gpu::AdamWChunk[n_chunks]
    int64_t n_chunks = 0;
  };
  std::vector<AdamWTable> adamw_tables_;
  std::vector<cudaGraphExec_t> graphs_;  // by id
  std::vector<cudaEvent_t> markers_;     // by id; only grown before the step loop
  bool capturing_ = false;
};

TRAIND_GPU_END
