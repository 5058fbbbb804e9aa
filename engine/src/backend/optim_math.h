// Scalar helpers of the optimizers' update kernels shared by the CPU backend and the CUDA kernels
// (nvcc compiles this header): bitsandbytes' nearest-code search of its 8-bit dynamic map, and the
// per-tensor factors of Adafactor's update (relative step x parameter scale, RMS clipping).
#pragma once

#include <math.h>

#include <cstdint>

#include "backend/step_scalars.h"  // TRAIND_HOST_DEVICE

namespace traind::engine {

// Elements per quantization block of the 8-bit optimizer state (bitsandbytes' blocksize 256).
constexpr int64_t kQuant8Block = 256;

// The code (0..255) whose value in the sorted 256-entry table `code` is nearest to x (x in
// [-1, 1] for the signed map, [0, 1] for the unsigned one), by bitsandbytes' binary search
// (quantize_2D: ties at a midpoint go to the lower code). For the signed map the result keeps
// x's sign (a tiny negative x that rounds to the code of 0 moves one code down), as bitsandbytes'
// blockwise optimizer does for its first state.
TRAIND_HOST_DEVICE inline uint8_t QuantizeToCode(const float* code, float x, bool is_signed) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  int c;
  if (x > val) {
    c = x > (upper + val) * 0.5f ? upper_pivot : pivot;
  } else {
    c = x < (lower + val) * 0.5f ? lower_pivot : pivot;
  }
  if (is_signed && signbit(code[c]) != signbit(x)) c += x > 0.0f ? 1 : -1;
  return static_cast<uint8_t>(c);
}

// Adafactor (HF transformers) per-tensor step size: rel_step * max(eps2, RMS(p)) when
// scale_parameter, else rel_step; RMS(p) = sqrt(sum_p_sq / n). rel_step is the external lr, or
// min(1e-2 or 1e-6*step, 1/sqrt(step)) with relative_step (computed by the host).
TRAIND_HOST_DEVICE inline float AdafactorStepSize(double sum_p_sq, int64_t n, float rel_step,
                                                  float eps2, bool scale_parameter) {
  if (!scale_parameter) return rel_step;
  const float rms = static_cast<float>(sqrt(sum_p_sq / static_cast<double>(n)));
  return (rms > eps2 ? rms : eps2) * rel_step;
}

// Adafactor's update divisor: max(1, RMS(update) / clip_threshold), RMS = sqrt(sum_u_sq / n).
TRAIND_HOST_DEVICE inline float AdafactorUpdateDivisor(double sum_u_sq, int64_t n,
                                                       float clip_threshold) {
  const float d = static_cast<float>(sqrt(sum_u_sq / static_cast<double>(n))) / clip_threshold;
  return d > 1.0f ? d : 1.0f;
}

}  // namespace traind::engine
