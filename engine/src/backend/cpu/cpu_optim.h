// The CPU backend's optimizer update kernels beyond AdamW (cpu_optim.cc): SGD, Adafactor's phases
// and blockwise 8-bit AdamW. Free functions over host memory, OpenMP-threaded over `nt` threads,
// deterministic for a given nt. Semantics: see each optimizer's header in engine/src/optim/.
#pragma once

#include <cstdint>

#include "backend/step_scalars.h"

namespace traind::engine::cpu {

// torch.optim.SGD on n elements, g = grad_scale * grad:
//   g += weight_decay * p;  buf = first_step ? g : momentum * buf + (1 - dampening) * g;
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g.
// buf is neither read nor written when momentum == 0 (may be null then).
// `s` (nullable; device memory on a device, here host memory): the step's scalars, as
// AdamWFromScalars reads them: lr = s->lr, grad_scale *= StepGradMultiplier(s->grad_sq,
// s->loss_scale, s->max_grad_norm), and nothing changes when s->skip_nonfinite and grad_sq is not
// finite. Null: the arguments as given.
void SgdUpdate(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
               float dampening, float weight_decay, bool nesterov, bool first_step,
               float grad_scale, const StepScalars* s, int nt);

// Adafactor, factored second moment of a (B, R, C) tensor (g = grad_scale * grad):
//   row(B,R) = beta2t * row + (1 - beta2t) * mean over C of (g^2 + eps1)
//   col(B,C) = beta2t * col + (1 - beta2t) * mean over R of (g^2 + eps1)
//   row_sum(B) = sum over R of the new row (double).
void AdafactorFactoredStats(const float* grad, float* row, float* col, double* row_sum, int64_t B,
                            int64_t R, int64_t C, float beta2t, float eps1, float grad_scale,
                            int nt);
// Adafactor, unfactored: v = beta2t * v + (1 - beta2t) * (g^2 + eps1), n elements.
void AdafactorSecondMoment(const float* grad, float* v, int64_t n, float beta2t, float eps1,
                           float grad_scale, int nt);
// *acc += the sum over the tensor of update^2 (double), update = g * rsqrt(row / mean_R(row)) *
// rsqrt(col) when `v` is null (factored; mean_R(row) = row_sum / R), else g * rsqrt(v) (then
// B = R = 1, C = n, row/col/row_sum unused).
void AdafactorUpdateSumSquares(double* acc, const float* grad, const float* row, const float* col,
                               const double* row_sum, const float* v, int64_t B, int64_t R,
                               int64_t C, float grad_scale, int nt);
// Applies the update. sums[0] = sum of p^2 (before the step), sums[1] = sum of update^2:
// step = AdafactorStepSize(sums[0], n, rel_step, eps2, scale_parameter), div =
// AdafactorUpdateDivisor(sums[1], n, clip_threshold); u = update / div * step; with m (beta1
// set): m = beta1 * m + (1 - beta1) * u, u = m; p -= weight_decay * step * p; p -= u.
void AdafactorApply(float* param, float* m, const float* grad, const float* row, const float* col,
                    const double* row_sum, const float* v, const double* sums, int64_t B, int64_t R,
                    int64_t C, float grad_scale, float rel_step, float eps2, bool scale_parameter,
                    float clip_threshold, float beta1, float weight_decay, int nt);

// bitsandbytes' blockwise 8-bit Adam(W) on n elements (blocks of kQuant8Block): per block,
// dequantize m = code_m[m_codes] * m_absmax[b] and v = code_v[v_codes] * v_absmax[b], update them
// with g = grad_scale * grad (elements with a non-finite g: m = v = 0, p unchanged),
// p += -lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), then p *= 1 - lr * weight_decay, and
// requantize with the new absmax of the block. `s` (nullable) as SgdUpdate's; the bias
// corrections then come from s->bias_correction{1,2} too.
void AdamW8bitBlockwise(float* param, const float* grad, uint8_t* m_codes, uint8_t* v_codes,
                        float* m_absmax, float* v_absmax, const float* code_m, const float* code_v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float bias_correction1, float bias_correction2,
                        float grad_scale, const StepScalars* s, int nt);

// out[i] = QuantizeToCode(code, x[i], is_signed) (optim_math.h), by the table-driven search the
// 8-bit update uses (identical codes; exposed for its test).
void QuantizeCodes(const float* code, bool is_signed, const float* x, int64_t n, uint8_t* out);

// AdamW (cpu_kernels.h's, cpu_elementwise.cc) over several runs of the flat buffers, each with
// its weight decay, in one parallel region: the bits of one AdamW call per run.
void AdamWRuns(float* param, const float* grad, float* m, float* v, const AdamWRun* runs,
               int64_t n_runs, float lr, float beta1, float beta2, float eps,
               float bias_correction1, float bias_correction2, float grad_scale, int nt);

}  // namespace traind::engine::cpu
