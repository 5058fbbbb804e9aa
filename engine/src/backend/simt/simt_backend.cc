// The simt twin of the CUDA backend: GpuBackend's kernels run under the emulator on host memory;
// the GEMM (cuBLASLt on a device) is the CPU backend's, which reads the same host pointers.
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_backend.h"
#include "backend/simt/simt.h"

TRAIND_GPU_BEGIN
namespace {

class SimtBackend final : public GpuBackend {
 public:
  explicit SimtBackend(std::unique_ptr<Backend> cpu) : GpuBackend("simt"), cpu_(std::move(cpu)) {}
  Status Start() { return Init(); }

  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            DType ab_type, DType c_type) override {
    // As cublasLtMatmul on a capturing stream: recorded into the graph, not run.
    Backend* cpu = cpu_.get();
    auto run = [=] {
      cpu->Gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type);
    };
    simt::detail::StreamState* st = simt::detail::StateOf(stream());
    if (st != nullptr && st->capture != nullptr) {
      st->capture->push_back(run);
    } else {
      run();
    }
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

}  // namespace
TRAIND_GPU_END

namespace traind::engine {

Result<std::unique_ptr<Backend>> MakeSimtBackend(int cpu_threads) {
  auto backend = std::make_unique<gpu::SimtBackend>(MakeCpuBackend(cpu_threads));
  TRAIND_RETURN_IF_ERROR(backend->Start());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace traind::engine
