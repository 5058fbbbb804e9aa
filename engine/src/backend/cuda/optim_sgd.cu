// SGD update (torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay; cpu_optim.h), in
// place on n elements: reads p, g (+ buf) and writes p (+ buf): 12 bytes (20 with momentum) and
// ~6 FLOPs per element -> n = 124M with momentum: 2.5 GB: 0.83 ms on an H100 (3.0 TB/s). With
// device StepScalars (capturable): lr and the gradient multiplier read on the device.
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/optim_kernels.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, float neg_lr,
                           float momentum, float one_minus_damp, float wd, bool nesterov,
                           bool first, float gs, const StepScalars* s) {
  if (s != nullptr) {  // uniform across the grid: no barrier here
    if (s->skip_nonfinite != 0 && !isfinite(s->grad_sq)) return;
    neg_lr = -s->lr;
    gs *= StepGradMultiplier(s->grad_sq, s->loss_scale, s->max_grad_norm);
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float p = param[i];
    float g = grad[i] * gs + wd * p;
    if (momentum != 0.0f) {
      const float b = first ? g : buf[i] * momentum + one_minus_damp * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    param[i] = p + neg_lr * g;
  }
}

}  // namespace

Status SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                 float dampening, float weight_decay, bool nesterov, bool first_step,
                 float grad_scale, const StepScalars* s, cudaStream_t stream) {
  if (n < 0) return Status::InvalidArgument("SgdUpdate: negative size " + std::to_string(n));
  if (momentum != 0.0f && buf == nullptr)
    return Status::InvalidArgument("SgdUpdate: momentum " + std::to_string(momentum) +
                                   " without a momentum buffer");
  if (n == 0) return Status::Ok();
  const float neg_lr = static_cast<float>(-static_cast<double>(lr));
  const float one_minus_damp = static_cast<float>(1.0 - static_cast<double>(dampening));
  return GPU_LAUNCH(sgd_kernel, GridFor(n, kThreads), kThreads, 0, stream, param, grad, buf, n,
                    neg_lr, momentum, one_minus_damp, weight_decay, nesterov, first_step,
                    grad_scale, s);
}

TRAIND_GPU_END
