// QLoRA's 4-bit frozen base (issue 43): which tensors of a decoder's table are stored in 4 bits,
// and what they cost. The tensors are the blocks' linear weights (q/k/v/o, gate/up/down, gpt2's
// c_attn/c_proj/c_fc/c_proj), each quantized on its own as bitsandbytes' Linear4bit does;
// embeddings, norms, biases and the lm head stay in the compute type. The planner's and the
// loader's shared view; the model does not hold a 4-bit base yet.
#pragma once

#include <cstdint>
#include <vector>

#include "models/layout.h"

namespace traind::engine {

// One quantized tensor: its table offset and element count.
struct QuantizedTensor {
  int64_t offset = 0;
  int64_t numel = 0;
};

// The table's tensors a 4-bit base stores quantized, in table order (empty for a mixture of
// experts, whose 4-bit base is not planned).
std::vector<QuantizedTensor> QuantizedTensors(const ParamTable& table);

// Device bytes of one n-element tensor in 4 bits: the packed codes (n / 2, rounded up) and its
// absmax, fp32 per block of 64, or with double quantization a uint8 code per block of 64 plus an
// fp32 nested absmax per 256 blocks and the fp32 offset.
int64_t Quant4TensorBytes(int64_t n, bool double_quant);

// What a 4-bit base costs and saves.
struct QuantizedBaseBytes {
  int64_t elements = 0;     // weights stored in 4 bits
  int64_t quantized = 0;    // their bytes in 4 bits (codes and absmax; the nested code table once)
  int64_t largest = 0;      // elements of the largest layer's quantized weights (the scratch)
};
QuantizedBaseBytes QuantizedBasePlan(const ParamTable& table, bool double_quant);

}  // namespace traind::engine
