// Activations of the GPU backend: GELU (tanh approximation, HF "gelu_new"), exact GELU (erf, HF
// "gelu"), tanh, SwiGLU and GeGLU, forward and backward. Memory-bound; roofline on an H100 (3.0 TB/s) per call, fp32:
//   GeluForward    n elements: 8n bytes, ~12n FLOPs            -> n = 32M (B*T*4C): 85 us
//   GeluBackward   12n bytes, ~20n FLOPs                       -> n = 32M: 128 us
//   SwiGluForward  inp (N,2H) -> out (N,H): 12*N*H bytes        -> N*H = 16M: 64 us
//   SwiGluBackward 20*N*H bytes                                  -> N*H = 16M: 107 us
// Gradient contract: activation gradients use = (dinp may alias dout for GELU).
#include <string>

#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/kernels.h"

TRAIND_GPU_BEGIN
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float arg = kGeluScale * (x + cube);
    const float t = tanhf(arg);
    const float sech2 = 1.0f - t * t;
    const float grad =
        0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)

__global__ void gelu_erf_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  }
}

__global__ void gelu_erf_backward_kernel(float* dinp, const float* inp, const float* dout,
                                         int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

__global__ void tanh_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = tanhf(inp[i]);
}

__global__ void tanh_backward_kernel(float* dinp, const float* out, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float y = out[i];
    dinp[i] = dout[i] * (1.0f - y * y);
  }
}

__global__ void swiglu_forward_kernel(float* out, const float* inp, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / H, j = i % H;
    const float g = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t N,
                                       int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / H, j = i % H;
    const float g = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
    const float sig = 1.0f / (1.0f + expf(-g));
    const float d = dout[i];
    dinp[n * 2 * H + j] = d * u * sig * (1.0f + g * (1.0f - sig));
    dinp[n * 2 * H + H + j] = d * g * sig;
  }
}

Status Check(const char* op, int64_t n) {
  if (n < 0)
    return Status::InvalidArgument(std::string(op) + ": negative size " + std::to_string(n));
  return Status::Ok();
}

__global__ void geglu_forward_kernel(float* out, const float* inp, int64_t N, int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / H, j = i % H;
    const float x = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
    // x * sigmoid(2a) = 0.5 x (1 + tanh(a)) without 1 + tanh's cancellation for negative x
    // (the CPU kernel's form).
    const float a = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = x / (1.0f + expf(-2.0f * a)) * u;
  }
}

__global__ void geglu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t N,
                                      int64_t H) {
  const int64_t total = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / H, j = i % H;
    const float x = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j];
    // d/dx [x s(2a)] = s + 2 x s (1 - s) a', in the sigmoid form (see the forward).
    const float a = kGeluScale * (x + 0.044715f * x * x * x);
    const float sg = 1.0f / (1.0f + expf(-2.0f * a));
    const float da = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    const float d = dout[i];
    dinp[n * 2 * H + j] = d * u * (sg + 2.0f * x * sg * (1.0f - sg) * da);
    dinp[n * 2 * H + H + j] = d * x * sg;
  }
}

}  // namespace

Status GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("GeluForward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(gelu_forward_kernel, GridFor(n, kThreads), kThreads, 0, stream, out, inp, n);
}

Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                    cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("GeluBackward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(gelu_backward_kernel, GridFor(n, kThreads), kThreads, 0, stream, dinp, inp,
                    dout, n);
}

Status GeluErfForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("GeluErfForward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(gelu_erf_forward_kernel, GridFor(n, kThreads), kThreads, 0, stream, out, inp,
                    n);
}

Status GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                       cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("GeluErfBackward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(gelu_erf_backward_kernel, GridFor(n, kThreads), kThreads, 0, stream, dinp,
                    inp, dout, n);
}

Status TanhForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("TanhForward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(tanh_forward_kernel, GridFor(n, kThreads), kThreads, 0, stream, out, inp, n);
}

Status TanhBackward(float* dinp, const float* out, const float* dout, int64_t n,
                    cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check("TanhBackward", n));
  if (n == 0) return Status::Ok();
  return GPU_LAUNCH(tanh_backward_kernel, GridFor(n, kThreads), kThreads, 0, stream, dinp, out,
                    dout, n);
}

namespace {

// The gated units (SwiGLU, GeGLU) over the N*H outputs of inp (N, 2H): the size check of `op`,
// then `kernel` (named `name`) with (out, inp, N, H) or (dinp, inp, dout, N, H).
using GatedForwardKernel = void (*)(float*, const float*, int64_t, int64_t);
using GatedBackwardKernel = void (*)(float*, const float*, const float*, int64_t, int64_t);

Status GatedForward(const char* op, const char* name, GatedForwardKernel kernel, float* out,
                    const float* inp, int64_t N, int64_t H, cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check(op, N * H));
  if (N * H == 0) return Status::Ok();
  return LaunchStatus(
      name, LaunchKernel(name, kernel, GridFor(N * H, kThreads), kThreads, 0, stream, out, inp, N, H));
}

Status GatedBackward(const char* op, const char* name, GatedBackwardKernel kernel, float* dinp,
                     const float* inp, const float* dout, int64_t N, int64_t H,
                     cudaStream_t stream) {
  TRAIND_RETURN_IF_ERROR(Check(op, N * H));
  if (N * H == 0) return Status::Ok();
  return LaunchStatus(name, LaunchKernel(name, kernel, GridFor(N * H, kThreads), kThreads, 0,
                                         stream, dinp, inp, dout, N, H));
}

}  // namespace

Status SwiGluForward(float* out, const float* inp, int64_t N, int64_t H, cudaStream_t stream) {
  return GatedForward("SwiGluForward", "swiglu_forward_kernel", swiglu_forward_kernel, out, inp, N,
                      H, stream);
}

Status SwiGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                      cudaStream_t stream) {
  return GatedBackward("SwiGluBackward", "swiglu_backward_kernel", swiglu_backward_kernel, dinp,
                       inp, dout, N, H, stream);
}

Status GeGluForward(float* out, const float* inp, int64_t N, int64_t H, cudaStream_t stream) {
  return GatedForward("GeGluForward", "geglu_forward_kernel", geglu_forward_kernel, out, inp, N, H,
                      stream);
}

Status GeGluBackward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t H,
                     cudaStream_t stream) {
  return GatedBackward("GeGluBackward", "geglu_backward_kernel", geglu_backward_kernel, dinp, inp,
                       dout, N, H, stream);
}

TRAIND_GPU_END
