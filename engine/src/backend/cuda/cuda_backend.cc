// The CUDA backend: GpuBackend's kernels on a device plus cuBLASLt GEMMs, and its factory, which
// fails cleanly (no abort, no exception) where there is no driver or no device.
#include "backend/cuda/cuda_backend.h"

#include <memory>
#include <string>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gpu_backend.h"

TRAIND_GPU_BEGIN
namespace {

class CudaBackend final : public GpuBackend {
 public:
  explicit CudaBackend(int device) : GpuBackend("cuda:" + std::to_string(device)) {}
  Status Start(const CudaBackendOptions& options) {
    TRAIND_RETURN_IF_ERROR(Init());
    TRAIND_ASSIGN_OR_RETURN(gemm_, CublasLtGemm::Create(options.allow_tf32));
    return Status::Ok();
  }

  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            DType ab_type, DType c_type) override {
    Record(gemm_->Run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type,
                      c_type, stream()));
  }

 private:
  std::unique_ptr<CublasLtGemm> gemm_;
};

}  // namespace
TRAIND_GPU_END

namespace traind::engine {

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device, const CudaBackendOptions& options) {
  std::string why;
  const int count = gpu::dev::DeviceCount(&why);
  if (count == 0)
    return Status::FailedPrecondition("no CUDA device (" + why +
                                      "); run with --device cpu or on a machine with a GPU");
  if (device < 0 || device >= count)
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                                   std::to_string(count) + " found)");
  TRAIND_RETURN_IF_ERROR(gpu::dev::SetDevice(device));
  auto backend = std::make_unique<gpu::CudaBackend>(device);
  TRAIND_RETURN_IF_ERROR(backend->Start(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace traind::engine
