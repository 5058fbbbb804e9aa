// The router of a sparse mixture of experts for one token (HF MixtralSparseMoeBlock): softmax of
// the E router logits (computed in double, rounded to fp32, as HF's float32 softmax), the top K
// (ties to the lower expert), and their weights renormalised over the K. Used by the training
// forward (DecoderModel::MoeForward) and the KV-cache decoder, so both route alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace traind::engine {

// logits (E) -> probs (E), experts (K, best first), weights (K, summing to 1). `order` is scratch.
inline void RouteToken(const float* logits, int64_t E, int64_t K, float* probs, int32_t* experts,
                       float* weights, std::vector<int32_t>* order) {
  double mx = logits[0], sum = 0.0;
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
  for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(logits[e]) - mx);
  for (int64_t e = 0; e < E; ++e) {
    probs[e] = static_cast<float>(std::exp(static_cast<double>(logits[e]) - mx) / sum);
  }
  order->resize(static_cast<size_t>(E));
  std::iota(order->begin(), order->end(), 0);
  std::partial_sort(order->begin(), order->begin() + K, order->end(), [probs](int32_t x, int32_t y) {
    return probs[x] > probs[y] || (probs[x] == probs[y] && x < y);
  });
  float top = 0.0f;
  for (int64_t j = 0; j < K; ++j) top += probs[(*order)[j]];
  for (int64_t j = 0; j < K; ++j) {
    experts[j] = (*order)[j];
    weights[j] = probs[(*order)[j]] / top;
  }
}

}  // namespace traind::engine
