// StepScalars: what a training step reads from and accumulates into device memory, so that the
// step can be issued (and captured as a graph) without reading anything back to the host until it
// ends. Plain data shared by every backend, the CUDA kernels included (nvcc compiles this header).
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define TRAIND_HOST_DEVICE __host__ __device__
#else
#define TRAIND_HOST_DEVICE
#endif

namespace traind::engine {

// The host writes the whole struct (accumulators zeroed) before each step and reads it after.
struct StepScalars {
  double loss_sum = 0.0;  // += each micro-batch's loss_weight * sum of its per-position losses
  double grad_sq = 0.0;   // += sum of squares of the (loss-scaled) gradients, by the grad norm
  float lr = 0.0f;                // AdamW learning rate of this step
  float bias_correction1 = 1.0f;  // 1 - beta1^step
  float bias_correction2 = 1.0f;  // 1 - beta2^step
  float loss_scale = 1.0f;        // the fp16 loss scale the gradients carry (1 otherwise)
  float max_grad_norm = 0.0f;     // clip_grad_norm_'s max_norm; <= 0: no clipping
  int32_t skip_nonfinite = 0;     // 1: no update when grad_sq is inf/NaN (fp16 overflow)
};

// One run of Backend::AdamWRunsFromScalars: [offset, offset + numel) of the flat parameter,
// gradient and state buffers, updated with its own weight decay.
struct AdamWRun {
  int64_t offset;
  int64_t numel;
  float weight_decay;
};

// torch.nn.utils.clip_grad_norm_'s coefficient, in fp32 as torch computes it:
// max_norm / (total_norm + 1e-6) when that is < 1, else 1 (also 1 when max_norm <= 0: no clipping).
TRAIND_HOST_DEVICE inline float ClipGradCoefficient(float total_norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  const float c = max_norm / (total_norm + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

// AdamW's gradient multiplier from a step's scalars, exactly as the host-side code computes it:
// norm = sqrt(grad_sq) / loss_scale in double, the clip coefficient of that norm, divided by
// loss_scale. Every backend's AdamWFromScalars uses this function (device code too).
TRAIND_HOST_DEVICE inline float StepGradMultiplier(double grad_sq, float loss_scale,
                                                   float max_grad_norm) {
  const double norm = sqrt(grad_sq) / static_cast<double>(loss_scale);
  return ClipGradCoefficient(static_cast<float>(norm), max_grad_norm) / loss_scale;
}

}  // namespace traind::engine
