// 4-bit weight quantization as bitsandbytes stores it (QLoRA's frozen base): NF4 or FP4 codes,
// two a byte, in blocks of kQuant4Block elements with an fp32 absmax each; optionally the absmax
// values "double quantized" (bnb_4bit_use_double_quant) to 8 bits around their mean in blocks of
// kQuant4NestedBlock with bitsandbytes' signed dynamic map. Scalar helpers here are shared by the
// CPU backend (cpu/cpu_quant4.cc) and CUDA kernels (nvcc compiles this header).
//
// Bit-identical to bitsandbytes' CUDA kernels (csrc/kernels.cu kQuantizeBlockwise,
// kDequantizeBlockwise, dQuantizeNF4, dQuantizeFP4, dQuantize) read as IEEE fp32 code:
//   - a block's absmax is max |x| over its elements (a short last block counts its zero padding);
//   - each element is quantized as Tree(x * (1.0f / absmax)); a zero block gives 0 * inf = NaN,
//     which every tree maps to code 0 (NF4: -1.0, so it dequantizes to -0.0; FP4: +0);
//   - element 2k is the high nibble of byte k, element 2k+1 the low nibble; an odd n pads the
//     last low nibble with the code of 0 * (1 / absmax);
//   - dequantization is code_value * absmax in fp32, rounded to nearest even for bf16/f16 output;
//     with double quantization absmax = dynamic[qabsmax] * nested_absmax + offset, the product
//     and the sum each rounded to fp32 (bitsandbytes runs them as two operations).
// Two differences from bitsandbytes are documented rather than emulated: its CUDA build uses
// --use_fast_math (an approximate 1/absmax and flush-to-zero of subnormals), and its double
// quantization's offset is torch's fp32 mean, whose summation order depends on the device; here
// the offset is the fp32 rounding of the mean summed in double. A checkpoint's offset is read as
// stored, so dequantizing bitsandbytes' files is exact either way.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/step_scalars.h"  // TRAIND_HOST_DEVICE
#include "core/dtype.h"

namespace traind::engine {

enum class Quant4Type : uint8_t { kNF4 = 0, kFP4 = 1 };

inline const char* Quant4TypeName(Quant4Type t) { return t == Quant4Type::kNF4 ? "nf4" : "fp4"; }

// Elements per absmax (bitsandbytes' blocksize, QLoRA's 64), and absmax values per nested absmax
// (bitsandbytes quantizes the absmax with quantize_blockwise(blocksize=256)).
constexpr int64_t kQuant4Block = 64;
constexpr int64_t kQuant4NestedBlock = 256;

// Sizes of an n-element tensor's state: packed code bytes ((n + 1) / 2, bitsandbytes' uint8
// tensor of shape ((n + 1) / 2, 1)), absmax values, and nested absmax values.
TRAIND_HOST_DEVICE inline int64_t Quant4Bytes(int64_t n) { return (n + 1) / 2; }
TRAIND_HOST_DEVICE inline int64_t Quant4Blocks(int64_t n) {
  return (n + kQuant4Block - 1) / kQuant4Block;
}
TRAIND_HOST_DEVICE inline int64_t Quant4NestedBlocks(int64_t n) {
  return (Quant4Blocks(n) + kQuant4NestedBlock - 1) / kQuant4NestedBlock;
}

// NF4 code (0..15) of x in [-1, 1]: bitsandbytes' dQuantizeNF4 decision tree over its 15
// thresholds (the midpoints between neighbouring codes), i.e. the number of thresholds strictly
// below x: a value exactly at a threshold takes the lower code. NaN -> 0.
TRAIND_HOST_DEVICE inline uint8_t QuantizeNf4(float x) {
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 15 : 14;
      return x > 0.5016634166240692f ? 13 : 12;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 11 : 10;
    return x > 0.1202552504837513f ? 9 : 8;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 7 : 6;
    return x > -0.23460740596055984f ? 5 : 4;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 3 : 2;
  return x > -0.8480964004993439f ? 1 : 0;
}

// FP4 code of x in [-1, 1]: bitsandbytes' dQuantizeFP4 (bit 3 = x < 0, then a decision tree on
// |x| over the magnitudes 0, 1/192, 1/6, 1/4, 1/3, 1/2, 2/3, 1 = codes 0, 1, 6, 7, 4, 5, 2, 3).
// -0.0 and NaN get sign 0; NaN -> 0.
TRAIND_HOST_DEVICE inline uint8_t QuantizeFp4(float x) {
  const uint8_t sign = x < 0.0f ? 8 : 0;
  const float a = x < 0.0f ? -x : x;  // fabsf; NaN stays NaN and fails every test below
  if (a > 0.29166667f) {
    if (a > 0.583333f) return sign + (a > 0.8333333f ? 3 : 2);
    return sign + (a > 0.4166667f ? 5 : 4);
  }
  if (a > 0.0859375f) return sign + (a > 0.20833333f ? 7 : 6);
  return sign + (a > 0.00260417f ? 1 : 0);
}

// The value of a code (low 4 bits of c): NF4's 16 normal quantiles, or FP4's magnitude times the
// sign bit as bitsandbytes' dDequantizeFP4Tree computes it (code 8 is -0.0).
// (Local tables, not namespace-scope arrays: device code cannot read host constants; CUDA kernels
// that dequantize in bulk keep Quant4Code-like tables in shared memory instead.)
TRAIND_HOST_DEVICE inline float DequantizeNf4(uint8_t c) {
  const float v[16] = {-1.0f,
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
  return v[c & 15];
}
TRAIND_HOST_DEVICE inline float DequantizeFp4(uint8_t c) {
  // magnitudes of codes 0..7: 0, 1/192, 2/3, 1, 1/3, 1/2, 1/6, 1/4 (the kernel's literals)
  const float m[8] = {0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f,
                      0.5f, 0.16666667f,     0.25f};
  return (c & 8) ? -m[c & 7] : m[c & 7];  // m * -1.0f, as bitsandbytes' sign factor
}
TRAIND_HOST_DEVICE inline uint8_t Quantize4(Quant4Type t, float x) {
  return t == Quant4Type::kNF4 ? QuantizeNf4(x) : QuantizeFp4(x);
}
TRAIND_HOST_DEVICE inline float Dequantize4(Quant4Type t, uint8_t c) {
  return t == Quant4Type::kNF4 ? DequantizeNf4(c) : DequantizeFp4(c);
}

// The code (0..255) of x in the sorted 256-entry table `code` by bitsandbytes' dQuantize<0> (the
// 8-bit blockwise quantizer quantize_blockwise runs, used for the nested absmax): a binary search,
// then x goes to the nearer neighbour by the fp32 midpoint (a tie goes towards the middle pivot).
// Unlike QuantizeToCode (optim_math.h, the optimizer's quantize_2D) there is no sign correction,
// and the end midpoints use the table's ends. NaN -> 0.
TRAIND_HOST_DEVICE inline uint8_t QuantizeDynamic8(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[255];
  if (lower_pivot == 0) lower = code[0];
  if (x > val) return static_cast<uint8_t>(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return static_cast<uint8_t>(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

// A double-quantized absmax: code[q] * nested + offset, the product rounded to fp32 before the
// sum (no fused multiply-add, which -ffp-contract=fast or nvcc's -fmad would otherwise form).
TRAIND_HOST_DEVICE inline float NestedAbsmax(float code_q, float nested, float offset) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(code_q, nested), offset);
#else
  volatile float p = code_q * nested;
  return p + offset;
#endif
}

// The 16-entry code table in code order (the quant_map bitsandbytes serializes: get_4bit_type's
// values in fp32; FP4's entry 8 is +0.0 there, while dequantization gives -0.0 * absmax).
const float* Quant4Code(Quant4Type t);

// A 4-bit tensor of n elements in bitsandbytes' layout (all pointers borrowed, not owned):
//   codes:    Quant4Bytes(n) bytes, element i in byte i / 2 (high nibble when i is even);
//   absmax:   Quant4Blocks(n) fp32 values, or nullptr when nested;
//   nested (double quantization): qabsmax (Quant4Blocks(n) uint8 codes of absmax - offset in
//   nested_code), nested_absmax (Quant4NestedBlocks(n) fp32), offset, and nested_code (the 256
//   entry nested_quant_map, DynamicCodeSigned() when bitsandbytes made it).
struct Quant4View {
  Quant4Type type = Quant4Type::kNF4;
  int64_t n = 0;
  const uint8_t* codes = nullptr;
  const float* absmax = nullptr;
  const uint8_t* qabsmax = nullptr;
  const float* nested_absmax = nullptr;
  const float* nested_code = nullptr;
  float offset = 0.0f;

  TRAIND_HOST_DEVICE bool nested() const { return absmax == nullptr; }
  // The fp32 absmax of block b, exactly as bitsandbytes' dequantize_4bit uses it.
  TRAIND_HOST_DEVICE float BlockAbsmax(int64_t b) const {
    if (!nested()) return absmax[b];
    return NestedAbsmax(nested_code[qabsmax[b]], nested_absmax[b / kQuant4NestedBlock], offset);
  }
};

namespace cpu {

// x: n elements of x_type (fp32, bf16 or f16, widened exactly to fp32) -> codes[Quant4Bytes(n)]
// and absmax[Quant4Blocks(n)], bitsandbytes' quantize_4bit(blocksize=64) bits. Threads over
// blocks (nt OpenMP threads); the result does not depend on nt.
void Quantize4bit(const void* x, DType x_type, int64_t n, Quant4Type type, uint8_t* codes,
                  float* absmax, int nt);

// Double quantization of nb absmax values (bitsandbytes' compress_statistics): returns the offset
// (their mean, summed in double, rounded to fp32) and writes qabsmax[nb] (codes in
// DynamicCodeSigned() of absmax - offset, by QuantizeDynamic8) and nested_absmax[ceil(nb / 256)]
// (max |absmax - offset| per 256 values, a short last block counting its zero padding).
float QuantizeAbsmaxNested(const float* absmax, int64_t nb, uint8_t* qabsmax, float* nested_absmax,
                           int nt);
// absmax[b] = NestedAbsmax(nested_code[qabsmax[b]], nested_absmax[b / 256], offset), b < nb.
void DequantizeAbsmaxNested(const uint8_t* qabsmax, const float* nested_absmax,
                            const float* nested_code, float offset, int64_t nb, float* absmax,
                            int nt);

// All q.n elements dequantized into out (out_type: fp32, or bf16/f16 rounded to nearest even),
// bitsandbytes' dequantize_4bit bits (with or without the nested absmax).
void Dequantize4bit(const Quant4View& q, void* out, DType out_type, int nt);

// Rows [r0, r1) of the (rows, cols) weight q holds row-major (q.n == rows * cols; blocks run
// across row ends as bitsandbytes flattens the weight) into out, row r at out + (r - r0) * ld
// elements of out_type (ld >= cols): the scratch tile a GEMM reads. Threads over rows.
void Dequantize4bitRows(const Quant4View& q, int64_t cols, int64_t r0, int64_t r1, void* out,
                        int64_t ld, DType out_type, int nt);

// An owning host copy of a quantized tensor (what loading or quantizing a weight produces).
struct Quant4Host {
  Quant4Type type = Quant4Type::kNF4;
  int64_t n = 0;
  bool double_quant = false;
  std::vector<uint8_t> codes;        // Quant4Bytes(n)
  std::vector<float> absmax;         // Quant4Blocks(n); empty when double_quant
  std::vector<uint8_t> qabsmax;      // Quant4Blocks(n) when double_quant
  std::vector<float> nested_absmax;  // Quant4NestedBlocks(n) when double_quant
  float offset = 0.0f;
  Quant4View View() const;  // nested_code: DynamicCodeSigned()
};
// Quantize4bit, then (double_quant) QuantizeAbsmaxNested, as bitsandbytes' quantize_4bit with
// compress_statistics = double_quant.
Quant4Host Quantize4bitHost(const void* x, DType x_type, int64_t n, Quant4Type type,
                            bool double_quant, int nt);

}  // namespace cpu
}  // namespace traind::engine
