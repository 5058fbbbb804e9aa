// The CUDA backend: GpuBackend's kernels on a device plus cuBLASLt GEMMs, and its factory, which
// fails cleanly (no abort, no exception) where there is no driver or no device.
#include "backend/cuda/cuda_backend.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gpu_backend.h"
#include "core/environment.h"

TRAIND_GPU_BEGIN
namespace {

class CudaBackend final : public GpuBackend {
 public:
  explicit CudaBackend(int device) : GpuBackend("cuda:" + std::to_string(device), device) {}
  Status Start(const CudaBackendOptions& options) {
    TRAIND_RETURN_IF_ERROR(Init());
    TRAIND_ASSIGN_OR_RETURN(gemm_, CublasLtGemm::Create(options.allow_tf32));
    fuse_epilogues_ = !ReadEngineEnvironment().cublaslt_epilogues_off;  // TRAIND_CUBLASLT_EPILOGUES
    return Status::Ok();
  }

  // Bias and GELU in the GEMM's epilogue when cuBLASLt can take them; the separate kernels
  // otherwise (unaligned views, odd widths, or no algorithm for the fused form).
  void LinearForward(float* pre, float* act, const void* inp, const void* weight,
                     const float* bias, int64_t N, int64_t C, int64_t OC, DType type) override {
    GemmEpilogue ep;
    ep.bias = bias;
    ep.gelu_input = act != nullptr ? pre : nullptr;
    float* out = act != nullptr ? act : pre;
    if (fuse_epilogues_ && (bias != nullptr || act != nullptr) && CublasLtGemm::CanFuse(ep, OC)) {
      const Status s = gemm_->Run(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC,
                                  type, DType::kF32, stream(), ep);
      if (s.ok()) return;
      if (s.code() != Status::Code::kUnimplemented) {
        Record(s);
        return;
      }
    }
    GpuBackend::LinearForward(pre, act, inp, weight, bias, N, C, OC, type);
  }

  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            DType ab_type, DType c_type) override {
    Record(gemm_->Run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type,
                      c_type, stream()));
  }

 private:
  std::unique_ptr<CublasLtGemm> gemm_;
  bool fuse_epilogues_ = true;
};

}  // namespace
TRAIND_GPU_END

namespace traind::engine {

Status SelectCudaDevice(int device) {
  std::string why;
  const int count = gpu::dev::DeviceCount(&why);
  if (count == 0)
    return Status::FailedPrecondition("no CUDA device (" + why +
                                      "); run with --device cpu or on a machine with a GPU");
  if (device < 0 || device >= count)
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                                   std::to_string(count) + " found)");
  return gpu::dev::SetDevice(device);
}

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device, const CudaBackendOptions& options) {
  TRAIND_RETURN_IF_ERROR(SelectCudaDevice(device));
  auto backend = std::make_unique<gpu::CudaBackend>(device);
  TRAIND_RETURN_IF_ERROR(backend->Start(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace traind::engine
