// bitsandbytes' dynamic 8-bit code tables (create_dynamic_map, signed and unsigned, generated in
// torch fp32; tests/engine/optim_adamw8bit_test.cc regenerates them with
// reference/quant8_reference.py and compares bit for bit). In the backend layer: the 8-bit
// optimizer state (optim/quant8.h) and the double-quantized 4-bit absmax (backend/quant4.h) use
// the same tables.
#pragma once

namespace traind::engine {

// The two 256-entry code tables, sorted ascending (fp32, bit-identical to bitsandbytes').
const float* DynamicCodeSigned();    // [-0.99297, ..., -5.5e-7, 0, 5.5e-7, ..., 0.99297, 1]
const float* DynamicCodeUnsigned();  // [0, 3.25e-7, ..., 0.99648, 1]

}  // namespace traind::engine
