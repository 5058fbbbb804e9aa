// Launchers of the optimizer update kernels beyond AdamW (optim_sgd.cu, optim_adafactor.cu,
// optim_adamw8bit.cu). Semantics: the CPU kernels of backend/cpu/cpu_optim.h (the reference);
// pointers are device pointers; each launcher checks its sizes (INVALID_ARGUMENT naming the value)
// and launches asynchronously on `stream`. The same declarations serve the nvcc and simt builds.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_ns.h"
#include "backend/step_scalars.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

// ---- optim_sgd.cu ----
Status SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                 float dampening, float weight_decay, bool nesterov, bool first_step,
                 float grad_scale, const StepScalars* s, cudaStream_t stream);

// ---- optim_adafactor.cu ----
Status AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                              int64_t R, int64_t C, float beta2t, float eps1, float grad_scale,
                              cudaStream_t stream);
Status AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                             float grad_scale, cudaStream_t stream);
// *acc += sum of update^2 (the caller zeroes it first).
Status AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                                 const double* row_sum, const float* v, int64_t B, int64_t R,
                                 int64_t C, float grad_scale, cudaStream_t stream);
Status AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                      const double* row_sum, const float* v, const double* sums, int64_t B,
                      int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                      bool scale_parameter, float clip_threshold, float beta1, float weight_decay,
                      cudaStream_t stream);

// ---- optim_adamw8bit.cu ----
// code_m / code_v: the 256-entry code tables in device memory. `s` (nullable, device memory): the
// step's scalars as in cpu_optim.h (lr, bias corrections, gradient multiplier, fp16 skip).
Status AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes,
                          float* m_absmax, float* v_absmax, const float* code_m,
                          const float* code_v, int64_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float bias_correction1,
                          float bias_correction2, float grad_scale, const StepScalars* s,
                          cudaStream_t stream);

TRAIND_GPU_END
