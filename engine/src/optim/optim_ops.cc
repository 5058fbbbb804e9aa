// optim_ops: the optimizers' update ops, forwarded to the backend (Backend ops since the op table
// has them; each backend's Supports() says whether it has them).
#include "optim/optim_ops.h"

namespace traind::engine::optim_ops {

void SgdUpdate(Backend* backend, float* param, const float* grad, float* buf, int64_t n, float lr,
               float momentum, float dampening, float weight_decay, bool nesterov, bool first_step,
               float grad_scale, const StepScalars* s) {
  backend->SgdUpdate(param, grad, buf, n, lr, momentum, dampening, weight_decay, nesterov,
                     first_step, grad_scale, s);
}

void AdafactorFactoredStats(Backend* backend, const float* grad, float* row, float* col,
                            double* row_sum, int64_t B, int64_t R, int64_t C, float beta2t,
                            float eps1, float grad_scale) {
  backend->AdafactorFactoredStats(grad, row, col, row_sum, B, R, C, beta2t, eps1, grad_scale);
}

void AdafactorSecondMoment(Backend* backend, const float* grad, float* v, int64_t n, float beta2t,
                           float eps1, float grad_scale) {
  backend->AdafactorSecondMoment(grad, v, n, beta2t, eps1, grad_scale);
}

void AdafactorUpdateSumSquares(Backend* backend, double* acc, const float* grad, const float* row,
                               const float* col, const double* row_sum, const float* v, int64_t B,
                               int64_t R, int64_t C, float grad_scale) {
  backend->AdafactorUpdateSumSquares(acc, grad, row, col, row_sum, v, B, R, C, grad_scale);
}

void AdafactorApply(Backend* backend, float* param, float* m, const float* grad, const float* row,
                    const float* col, const double* row_sum, const float* v, const double* sums,
                    int64_t B, int64_t R, int64_t C, float grad_scale, float rel_step, float eps2,
                    bool scale_parameter, float clip_threshold, float beta1, float weight_decay) {
  backend->AdafactorApply(param, m, grad, row, col, row_sum, v, sums, B, R, C, grad_scale, rel_step,
                          eps2, scale_parameter, clip_threshold, beta1, weight_decay);
}

void AdamW8bitBlockwise(Backend* backend, float* param, const float* grad, uint8_t* m_codes,
                        uint8_t* v_codes, float* m_absmax, float* v_absmax, const float* code_m,
                        const float* code_v, int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, float bias_correction1,
                        float bias_correction2, float grad_scale, const StepScalars* s) {
  backend->AdamW8bitBlockwise(param, grad, m_codes, v_codes, m_absmax, v_absmax, code_m, code_v, n,
                              lr, beta1, beta2, eps, weight_decay, bias_correction1,
                              bias_correction2, grad_scale, s);
}

}  // namespace traind::engine::optim_ops
