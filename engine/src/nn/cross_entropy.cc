// Mean cross-entropy over the fused backend op (see cross_entropy.h).
#include "nn/cross_entropy.h"

namespace traind::engine::nn {

int64_t CountValidTargets(Backend& be, const int32_t* targets, int64_t N,
                          std::vector<int32_t>* host_scratch) {
  host_scratch->resize(static_cast<size_t>(N));
  be.CopyDeviceToHost(host_scratch->data(), targets, static_cast<size_t>(N) * sizeof(int32_t));
  be.Synchronize();
  int64_t n = 0;
  for (int32_t t : *host_scratch) n += (t != -1) ? 1 : 0;
  return n;
}

double CrossEntropyForward(Backend& be, float* logits, float* losses, const int32_t* targets,
                           int64_t N, int64_t V, int64_t Vp, int64_t n_valid, float grad_scale,
                           bool compute_grad, std::vector<float>* host_losses) {
  // d(mean)/d(loss_n) = 1/n_valid, folded into the op's grad scale.
  const float scale = n_valid > 0 ? grad_scale / static_cast<float>(n_valid) : 0.0f;
  be.SoftmaxCrossEntropy(logits, losses, targets, N, V, Vp, scale, compute_grad, nullptr);
  return MeanLoss(be, losses, N, n_valid, host_losses);
}

double MeanLoss(Backend& be, const float* losses, int64_t N, int64_t n_valid,
                std::vector<float>* host_losses) {
  host_losses->resize(static_cast<size_t>(N));
  be.CopyDeviceToHost(host_losses->data(), losses, static_cast<size_t>(N) * sizeof(float));
  be.Synchronize();
  double sum = 0.0;
  for (float l : *host_losses) sum += l;
  return n_valid > 0 ? sum / static_cast<double>(n_valid) : 0.0;
}

}  // namespace traind::engine::nn
