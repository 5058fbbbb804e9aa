// The CPU's 4-bit (NF4/FP4) block quantizer and dequantizers, bitsandbytes' bits (see
// backend/quant4.h for the semantics; tests/engine/quant4_test.cc checks them against a numpy
// reference of bitsandbytes' kernels). Quantizing runs once per weight at load; dequantizing a
// row range feeds the frozen base's GEMMs.
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"  // TRAIND_CPU_CLONES, F32ToBf16Span, F32ToF16Span
#include "backend/quant4.h"
#include "core/half.h"
#include "backend/dynamic_code.h"  // DynamicCodeSigned: bitsandbytes' create_dynamic_map(signed=True)

namespace traind::engine {
namespace {

// get_4bit_type("nf4") / get_4bit_type("fp4") in fp32 (fp4: its 8-bit map divided by 12).
constexpr float kNf4Code[16] = {-1.0f,
                                -0.6961928009986877f,
                                -0.5250730514526367f,
                                -0.39491748809814453f,
                                -0.28444138169288635f,
                                -0.18477343022823334f,
                                -0.09105003625154495f,
                                0.0f,
                                0.07958029955625534f,
                                0.16093020141124725f,
                                0.24611230194568634f,
                                0.33791524171829224f,
                                0.44070982933044434f,
                                0.5626170039176941f,
                                0.7229568362236023f,
                                1.0f};
constexpr float kFp4Code[16] = {
    0.0f, 0.005208333333f,  0.66666667f,  1.0f,  0.33333333f,  0.5f,  0.16666667f,  0.25f,
    0.0f, -0.005208333333f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f};

// x[lo, lo + len) widened to fp32 (exact).
void LoadF32(const void* x, DType t, int64_t lo, int64_t len, float* v) {
  if (t == DType::kF32) {
    std::memcpy(v, static_cast<const float*>(x) + lo, len * sizeof(float));
  } else if (t == DType::kBF16) {
    for (int64_t j = 0; j < len; ++j) v[j] = BF16ToF32(static_cast<const uint16_t*>(x)[lo + j]);
  } else {
    for (int64_t j = 0; j < len; ++j) v[j] = F16ToF32(static_cast<const uint16_t*>(x)[lo + j]);
  }
}

// dQuantizeNF4's and dQuantizeFP4's thresholds in ascending order (the literals of quant4.h's
// trees): a tree's code is the count of thresholds strictly below x, which vectorises where the
// tree's branches would not (quant4_test checks the two forms agree).
constexpr float kNf4Thresholds[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f};
constexpr float kFp4Thresholds[7] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                                     0.4166667f,  0.583333f,  0.8333333f};

// Codes of s[0, kQuant4Block) (already scaled by 1 / absmax). NaN compares false: code 0.
TRAIND_CPU_CLONES void CodesNf4(const float* s, uint8_t* c) {
  for (int64_t j = 0; j < kQuant4Block; ++j) {
    int k = 0;
    for (int t = 0; t < 15; ++t) k += s[j] > kNf4Thresholds[t];
    c[j] = static_cast<uint8_t>(k);
  }
}
TRAIND_CPU_CLONES void CodesFp4(const float* s, uint8_t* c) {
  for (int64_t j = 0; j < kQuant4Block; ++j) {
    const float a = std::fabs(s[j]);
    int k = 0;
    for (int t = 0; t < 7; ++t) k += a > kFp4Thresholds[t];
    // interval k of |x| holds code 0, 1, 6, 7, 4, 5, 2, 3: k with bit 2 flipped when bit 1 is set
    c[j] = static_cast<uint8_t>((k ^ ((k & 2) << 1)) | (s[j] < 0.0f ? 8 : 0));
  }
}

// Block b of x: absmax and the packed codes (bitsandbytes' kQuantizeBlockwise for one block).
TRAIND_CPU_CLONES void QuantizeBlock(const void* x, DType x_type, int64_t n, Quant4Type type,
                                     int64_t b, uint8_t* codes, float* absmax) {
  const int64_t lo = b * kQuant4Block, len = std::min(kQuant4Block, n - lo);
  alignas(64) float v[kQuant4Block];
  LoadF32(x, x_type, lo, len, v);
  for (int64_t j = len; j < kQuant4Block; ++j) v[j] = 0.0f;  // the kernel loads zeros past n
  // fmaxf from -FLT_MAX over fabsf(v) (passing NaNs over); a short block's padding joins in.
  float m = -FLT_MAX;
  for (int64_t j = 0; j < kQuant4Block; ++j) {
    const float a = std::fabs(v[j]);
    m = a > m ? a : m;
  }
  absmax[b] = m;
  const float inv = 1.0f / m;  // inf for a zero block: every element becomes NaN -> code 0
  for (int64_t j = 0; j < kQuant4Block; ++j) v[j] *= inv;
  alignas(64) uint8_t c[kQuant4Block];
  if (type == Quant4Type::kNF4) {
    CodesNf4(v, c);
  } else {
    CodesFp4(v, c);
  }
  uint8_t* out = codes + lo / 2;
  for (int64_t k = 0; k < (len + 1) / 2; ++k) {
    out[k] = static_cast<uint8_t>((c[2 * k] << 4) | c[2 * k + 1]);
  }
}

// dst[j] = lut[code of element i0 + j] * a for the elements [i0, i1) of one block: the nibbles
// unpacked first, so that the products vectorise (gathers from the 16-entry table).
TRAIND_CPU_CLONES void DequantizeSegment(const uint8_t* codes, const float* lut, float a,
                                         int64_t i0, int64_t i1, float* dst) {
  alignas(64) int32_t idx[kQuant4Block + 2];
  const int64_t k0 = i0 >> 1, k1 = (i1 + 1) >> 1;  // bytes holding [i0, i1)
  for (int64_t k = k0; k < k1; ++k) {
    idx[2 * (k - k0)] = codes[k] >> 4;
    idx[2 * (k - k0) + 1] = codes[k] & 15;
  }
  const int32_t* first = idx + (i0 & 1);
  for (int64_t j = 0; j < i1 - i0; ++j) dst[j] = lut[first[j]] * a;
}

// Elements [e0, e1) of q into out[0, e1 - e0) of out_type.
void DequantizeRange(const Quant4View& q, const float* lut, int64_t e0, int64_t e1, void* out,
                     DType out_type) {
  constexpr int64_t kChunk = 256;  // fp32 staging for the 16-bit outputs
  alignas(64) float tmp[kChunk];
  for (int64_t c0 = e0; c0 < e1; c0 += kChunk) {
    const int64_t c1 = std::min(e1, c0 + kChunk);
    float* dst = out_type == DType::kF32 ? static_cast<float*>(out) + (c0 - e0) : tmp;
    for (int64_t s = c0; s < c1;) {  // one absmax block segment at a time
      const int64_t b = s / kQuant4Block, s1 = std::min(c1, (b + 1) * kQuant4Block);
      DequantizeSegment(q.codes, lut, q.BlockAbsmax(b), s, s1, dst + (s - c0));
      s = s1;
    }
    if (out_type != DType::kF32) {
      cpu::F32To16Span(static_cast<uint16_t*>(out) + (c0 - e0), tmp, c1 - c0, out_type);
    }
  }
}

void DequantTable(Quant4Type t, float* lut) {
  for (int c = 0; c < 16; ++c) lut[c] = Dequantize4(t, static_cast<uint8_t>(c));
}

}  // namespace

const float* Quant4Code(Quant4Type t) { return t == Quant4Type::kNF4 ? kNf4Code : kFp4Code; }

namespace cpu {

void Quantize4bit(const void* x, DType x_type, int64_t n, Quant4Type type, uint8_t* codes,
                  float* absmax, int nt) {
  const int64_t blocks = Quant4Blocks(n);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) QuantizeBlock(x, x_type, n, type, b, codes, absmax);
}

float QuantizeAbsmaxNested(const float* absmax, int64_t nb, uint8_t* qabsmax, float* nested_absmax,
                           int nt) {
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) sum += absmax[i];
  const float offset = nb > 0 ? static_cast<float>(sum / static_cast<double>(nb)) : 0.0f;
  const float* code = DynamicCodeSigned();
  const int64_t blocks = (nb + kQuant4NestedBlock - 1) / kQuant4NestedBlock;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kQuant4NestedBlock, hi = std::min(nb, lo + kQuant4NestedBlock);
    float m = hi - lo < kQuant4NestedBlock ? 0.0f : -FLT_MAX;  // a short block's zero padding
    for (int64_t i = lo; i < hi; ++i) {
      const float a = std::fabs(absmax[i] - offset);
      m = a > m ? a : m;
    }
    nested_absmax[b] = m;
    const float inv = 1.0f / m;
    for (int64_t i = lo; i < hi; ++i)
      qabsmax[i] = QuantizeDynamic8(code, (absmax[i] - offset) * inv);
  }
  return offset;
}

void DequantizeAbsmaxNested(const uint8_t* qabsmax, const float* nested_absmax,
                            const float* nested_code, float offset, int64_t nb, float* absmax,
                            int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < nb; ++i) {
    absmax[i] =
        NestedAbsmax(nested_code[qabsmax[i]], nested_absmax[i / kQuant4NestedBlock], offset);
  }
}

void Dequantize4bit(const Quant4View& q, void* out, DType out_type, int nt) {
  float lut[16];
  DequantTable(q.type, lut);
  constexpr int64_t kPiece = 16 * kQuant4Block;  // elements per task
  const int64_t pieces = (q.n + kPiece - 1) / kPiece;
  const size_t es = DTypeSize(out_type);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t e0 = p * kPiece, e1 = std::min(q.n, e0 + kPiece);
    DequantizeRange(q, lut, e0, e1, static_cast<char*>(out) + e0 * es, out_type);
  }
}

void Dequantize4bitRows(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                        int64_t ld, DType out_type, int nt) {
  assert(0 <= r0 && r0 <= r1 && r1 * cols <= q.n && ld >= cols);
  float lut[16];
  DequantTable(q.type, lut);
  const size_t es = DTypeSize(out_type);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = r0; r < r1; ++r) {
    DequantizeRange(q, lut, r * cols, (r + 1) * cols, static_cast<char*>(out) + (r - r0) * ld * es,
                    out_type);
  }
}

Quant4View Quant4Host::View() const {
  Quant4View v;
  v.type = type;
  v.n = n;
  v.codes = codes.data();
  if (double_quant) {
    v.qabsmax = qabsmax.data();
    v.nested_absmax = nested_absmax.data();
    v.nested_code = DynamicCodeSigned();
    v.offset = offset;
  } else {
    v.absmax = absmax.data();
  }
  return v;
}

Quant4Host Quantize4bitHost(const void* x, DType x_type, int64_t n, Quant4Type type,
                            bool double_quant, int nt) {
  Quant4Host h;
  h.type = type;
  h.n = n;
  h.double_quant = double_quant;
  h.codes.resize(Quant4Bytes(n));
  std::vector<float> absmax(Quant4Blocks(n));
  Quantize4bit(x, x_type, n, type, h.codes.data(), absmax.data(), nt);
  if (double_quant) {
    h.qabsmax.resize(absmax.size());
    h.nested_absmax.resize(Quant4NestedBlocks(n));
    h.offset = QuantizeAbsmaxNested(absmax.data(), static_cast<int64_t>(absmax.size()),
                                    h.qabsmax.data(), h.nested_absmax.data(), nt);
  } else {
    h.absmax = std::move(absmax);
  }
  return h;
}

}  // namespace cpu
}  // namespace traind::engine
