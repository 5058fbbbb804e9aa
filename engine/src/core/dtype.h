// Element types of tensor storage. Compute accumulates in fp32 whatever the storage type.
#pragma once

#include <cstddef>
#include <cstdint>

namespace traind::engine {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kBF16 ? "bf16" : "f16");
}

}  // namespace traind::engine
