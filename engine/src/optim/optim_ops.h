// The update ops the SGD, Adafactor and 8-bit AdamW optimizers issue, in one place: each forwards
// to the backend (device pointers, asynchronous, nothing read back). Contracts: the CPU kernels'
// in backend/cpu/cpu_optim.h (the reference semantics of every backend).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/step_scalars.h"
#include "traind/engine/status.h"

namespace traind::engine::optim_ops {

void SgdUpdate(Backend* backend, float* param, const float* grad, float* buf, int64_t n, float lr,
               float momentum, float dampening, float weight_decay, bool nesterov, bool first_step,
               float grad_scale, const StepScalars* s);
void AdafactorFactoredStats(Backend* backend, const float* grad, float* row, float* col,
                            double* row_sum, int64_t B, int64_t R, int64_t C, float beta2t,
                            float eps1, float grad_scale);
void AdafactorSecondMoment(Backend* backend, const float* grad, float* v, int64_t n, float beta2t,
                           float eps1, float grad_scale);
void AdafactorUpdateSumSquares(Backend* backend, double* acc, const float* grad, const float* row,
                               const float* col, const double* row_sum, const float* v, int64_t B,
                               int64_t R, int64_t C, float grad_scale);
void AdafactorApply(Backend* backend, float* param, float* m, const float* grad, const float* row,
                    const float* col, const double* row_sum, const float* v, const double* sums,
                    int64_t B, int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                    bool scale_parameter, float clip_threshold, float beta1, float weight_decay);
void AdamW8bitBlockwise(Backend* backend, float* param, const float* grad, uint8_t* m_codes,
                        uint8_t* v_codes, float* m_absmax, float* v_absmax, const float* code_m,
                        const float* code_v, int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, float bias_correction1,
                        float bias_correction2, float grad_scale, const StepScalars* s);

}  // namespace traind::engine::optim_ops
