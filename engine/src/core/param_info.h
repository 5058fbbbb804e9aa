// ParamInfo: one parameter tensor as a view into a model's flat parameter (and gradient) buffer.
// Shared by models/ (which lays the buffers out) and optim/ (which updates them), so neither
// depends on the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace traind::engine {

// One parameter tensor: a view into the flat parameter (and gradient) buffer.
struct ParamInfo {
  std::string hf_name;          // the HF tensor name ("transformer.h.0.attn.c_attn.weight")
  std::vector<int64_t> shape;   // our layout (Linear weights (OC, C))
  std::vector<int64_t> hf_shape;  // the shape in HF files (GPT-2 Conv1D: transposed)
  int64_t offset = 0;           // element offset into the flat buffers
  int64_t numel = 0;
  bool weight_decay = false;    // >= 2-D weights only; never biases, norm weights
};

// The part of a view that HF has: the vocabulary tables (wte, an untied lm_head, bert's MLM
// decoder bias) are laid out with Vp rows (V rounded up to a multiple of 64) where HF has V
// (shape[0] = Vp, hf_shape[0] = V, the other dims equal), so the tensor HF has is the view's
// first V rows: the leading LiveNumel elements. Rows [V, Vp) are zero padding that stays zero;
// no optimizer statistic (an RMS, a mean over rows, a block's size) may count them. Any other
// view (equal element counts, a transposed Conv1D weight, a 1-D slice) is live whole.
inline std::vector<int64_t> LiveShape(const ParamInfo& p) {
  const std::vector<int64_t>& s = p.shape;
  const std::vector<int64_t>& h = p.hf_shape;
  if (s.empty() || h.size() != s.size() || h[0] >= s[0] || h[0] < 0) return s;
  for (size_t i = 1; i < s.size(); ++i) {
    if (h[i] != s[i]) return s;
  }
  return h;
}
inline int64_t LiveNumel(const ParamInfo& p) {
  const std::vector<int64_t> s = LiveShape(p);
  if (s == p.shape) return p.numel;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace traind::engine
