// The host block quantizer over bitsandbytes' dynamic code tables (backend/dynamic_code.h).
#include "optim/quant8.h"

#include <algorithm>
#include <cmath>

namespace traind::engine {

void QuantizeBlockwise(const float* x, int64_t n, bool is_signed, uint8_t* codes, float* absmax) {
  const float* code = is_signed ? DynamicCodeSigned() : DynamicCodeUnsigned();
  for (int64_t b = 0; b * kQuant8Block < n; ++b) {
    const int64_t lo = b * kQuant8Block, hi = std::min(n, lo + kQuant8Block);
    float mx = 0.0f;
    for (int64_t i = lo; i < hi; ++i) mx = std::max(mx, std::fabs(x[i]));
    absmax[b] = mx;
    for (int64_t i = lo; i < hi; ++i) {
      codes[i] = QuantizeToCode(code, mx > 0.0f ? x[i] / mx : 0.0f, is_signed);
    }
  }
}

void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, bool is_signed,
                         float* x) {
  const float* code = is_signed ? DynamicCodeSigned() : DynamicCodeUnsigned();
  for (int64_t i = 0; i < n; ++i) x[i] = code[codes[i]] * absmax[i / kQuant8Block];
}

}  // namespace traind::engine
