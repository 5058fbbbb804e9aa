// QLoRA's 4-bit frozen base (issue 43): which tensors of a decoder's table are stored in 4 bits,
// and what they cost. The tensors are the blocks' linear weights (q/k/v/o, gate/up/down, gpt2's
// c_attn/c_proj/c_fc/c_proj), each quantized on its own as bitsandbytes' Linear4bit does;
// embeddings, norms, biases and the lm head stay in the compute type. The planner's and the
// loader's shared view.
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

// Where each quantized tensor lives in the model's 4-bit store (ModelBuffers::q_*): its packed
// codes from byte `codes`, its absmax (or absmax codes) from block `blocks`, its nested absmax
// from `nested` (double quantization), and in its layer's dequantization scratch from element
// `scratch` (a fused weight's parts stay contiguous there, as in the table).
struct Quant4Slot {
  int64_t offset = 0, numel = 0;
  int64_t rows = 0, cols = 0;  // the engine shape (out, in)
  int64_t layer = 0;
  int64_t codes = 0, blocks = 0, nested = 0, scratch = 0;
};
struct Quant4Layout {
  std::vector<Quant4Slot> tensors;  // table order
  int64_t elements = 0;             // weights in 4 bits
  int64_t code_bytes = 0;           // sum of Quant4Bytes
  int64_t blocks = 0;               // sum of Quant4Blocks
  int64_t nested_blocks = 0;        // sum of Quant4NestedBlocks
  int64_t largest = 0;              // the largest layer's quantized elements (the scratch)
  // The slot of the tensor at table offset `offset`, or null when it is not quantized.
  const Quant4Slot* Find(int64_t offset) const;
  // Quantized elements stored before table offset `offset`: a tensor that stays in the compute
  // type is at offset - QuantizedBefore(offset) in the compacted weight buffers.
  int64_t QuantizedBefore(int64_t offset) const;
};
// Empty when quantization is off or the table has nothing to quantize.
Quant4Layout MakeQuant4Layout(const ParamTable& table);

// QLoRA in 16 bits with an untied token table (llama-like, no learned positions): the lookup
// reads the table's compute-type copy (rows gathered, then widened), so no fp32 copy of it is
// kept; the lm head and the table then stay 16-bit only.
bool LookupReads16Bit(const ParamTable& table, const ModelOptions& o);
// The tensors a QLoRA model keeps an fp32 copy of with master weights off the device:
// Fp32ResidentTensors, less the token table when LookupReads16Bit (packed offsets recounted).
std::vector<Fp32ResidentTensor> QLoraResidentTensors(const ParamTable& table, const ModelOptions& o);

}  // namespace traind::engine
