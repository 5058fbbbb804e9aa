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

}  // namespace traind::engine
