// Fused softmax + cross-entropy on the (padded) logits, the mean over non-ignored targets.
// Gradient contract: with compute_grad the logits are overwritten by
// dlogits = grad_scale * d(mean loss)/dlogits (=), so no second (N,Vp) buffer ever exists.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace traind::engine::nn {

// Number of targets != -1 among `targets` (N, device); copies them to `host_scratch`
// (synchronizes).
int64_t CountValidTargets(Backend& be, const int32_t* targets, int64_t N,
                          std::vector<int32_t>* host_scratch);

// logits (N,Vp), only [0,V) real; losses (N) device scratch. Returns the mean loss over the
// n_valid non-ignored rows (0 when n_valid is 0); synchronizes to read the losses.
double CrossEntropyForward(Backend& be, float* logits, float* losses, const int32_t* targets,
                           int64_t N, int64_t V, int64_t Vp, int64_t n_valid, float grad_scale,
                           bool compute_grad, std::vector<float>* host_losses);

// The mean of losses[0..N) over n_valid non-ignored rows (0 when n_valid is 0): the losses are
// read back once (synchronizes).
double MeanLoss(Backend& be, const float* losses, int64_t N, int64_t n_valid,
                std::vector<float>* host_losses);

}  // namespace traind::engine::nn
