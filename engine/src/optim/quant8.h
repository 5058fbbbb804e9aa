// Block-wise dynamic 8-bit quantization (bitsandbytes' blockwise scheme): a tensor is cut into
// blocks of kQuant8Block elements; each block keeps its absolute maximum in fp32 and every element
// as the uint8 index of the nearest entry of a fixed 256-value code table to x / absmax.
// The tables are bitsandbytes' create_dynamic_map(signed=True) ("dynamic", for Adam's first
// moment) and create_dynamic_map(signed=False) ("udynamic", for the second moment): a dynamic
// exponent (10^-6 .. 10^0) with a linear fraction that shrinks as the exponent grows.
#pragma once

#include <cstdint>

#include "backend/dynamic_code.h"  // DynamicCodeSigned, DynamicCodeUnsigned
#include "backend/optim_math.h"

namespace traind::engine {

// The number of absmax values (blocks) of an n-element tensor.
inline int64_t Quant8Blocks(int64_t n) { return (n + kQuant8Block - 1) / kQuant8Block; }

// Quantizes x[0, n) block by block: absmax[b] = max |x| over block b, codes[i] = the nearest code
// of x[i] / absmax[b] (QuantizeToCode; a block of zeros gets absmax 0 and the code of 0).
// `is_signed` picks DynamicCodeSigned (x of any sign) or DynamicCodeUnsigned (x >= 0).
void QuantizeBlockwise(const float* x, int64_t n, bool is_signed, uint8_t* codes, float* absmax);
// x[i] = code[codes[i]] * absmax[i / kQuant8Block].
void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, bool is_signed,
                         float* x);

}  // namespace traind::engine
