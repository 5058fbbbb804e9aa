// 4-bit NF4/FP4 quantization (backend/quant4.h, cpu/cpu_quant4.cc) against bitsandbytes'
// semantics: (1) hand cases that need no Python: nibble order, the trees at their thresholds, a
// zero block; (2) every case of reference/quant4_reference.py (a numpy model of bitsandbytes'
// CUDA kernels: random, odd n, zero blocks, thresholds and +-1 ulp, huge outliers, denormals,
// double quantization over 602 blocks, in fp32/bf16/f16) bit for bit: codes, absmax, nested
// state, offset, dequantized fp32 and input-dtype values, at 1 and 3 threads; (3) the row-range
// dequantizer equals slices of the full one.
#include "backend/quant4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "optim/quant8.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

// First index where a and b differ bitwise, or -1.
template <class T>
int64_t FirstBitDiff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

template <class T>
std::vector<T> ReadBin(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f.good()) << path;
  const std::streamsize bytes = f.tellg();
  f.seekg(0);
  std::vector<T> v(static_cast<size_t>(bytes) / sizeof(T));
  f.read(reinterpret_cast<char*>(v.data()), bytes);
  return v;
}

TEST(Quant4, NibbleOrderFirstElementHigh) {
  const float x[3] = {1.0f, -1.0f, 0.5f};  // odd n: the last low nibble pads with the code of 0
  uint8_t codes[2];
  float absmax[1];
  cpu::Quantize4bit(x, DType::kF32, 3, Quant4Type::kNF4, codes, absmax, 1);
  EXPECT_EQ(absmax[0], 1.0f);
  EXPECT_EQ(codes[0], 0xF0);  // 1.0 -> 15 (high), -1.0 -> 0 (low)
  EXPECT_EQ(codes[1], 0xC7);  // 0.5 -> 12 (0.4407 < 0.5 <= 0.5017), pad 0.0 -> 7
  cpu::Quantize4bit(x, DType::kF32, 3, Quant4Type::kFP4, codes, absmax, 1);
  EXPECT_EQ(codes[0], 0x3B);  // +1 = 0b0011, -1 = 0b1011
  EXPECT_EQ(codes[1], 0x50);  // 0.5 = 0b0101, pad 0 = 0b0000
}

// dQuantizeNF4's and dQuantizeFP4's thresholds, as the kernel's literals.
constexpr float kNf4T[15] = {-0.8480964004993439f,   -0.6106329262256622f,  -0.4599952697753906f,
                             -0.33967943489551544f,  -0.23460740596055984f, -0.13791173323988914f,
                             -0.045525018125772476f, 0.03979014977812767f,  0.1202552504837513f,
                             0.2035212516784668f,    0.2920137718319893f,   0.3893125355243683f,
                             0.5016634166240692f,    0.6427869200706482f,   0.8614784181118011f};
constexpr float kFp4T[7] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                            0.4166667f,  0.583333f,  0.8333333f};

TEST(Quant4, TreesAtThresholds) {
  for (int k = 0; k < 15; ++k) {  // at a threshold: the lower code; one ulp above: the next
    EXPECT_EQ(QuantizeNf4(kNf4T[k]), k) << k;
    EXPECT_EQ(QuantizeNf4(std::nextafter(kNf4T[k], 2.0f)), k + 1) << k;
  }
  // Four thresholds are midpoints of two codes whose double value ties between two floats: the
  // literal rounds once, to the float on its decimal's side, unlike float(double(literal)) or the
  // fp32 midpoint (bitsandbytes' torch backends), which are one ulp the other way.
  EXPECT_EQ(Bits(kNf4T[0]), Bits(-0x1.b239b2p-1f));
  EXPECT_EQ(Bits(kNf4T[8]), Bits(0x1.ec90c6p-4f));
  EXPECT_EQ(Bits(kNf4T[12]), Bits(0x1.00da06p-1f));
  EXPECT_EQ(Bits(kNf4T[14]), Bits(0x1.b913b2p-1f));
  const uint8_t fp4_code[8] = {0, 1, 6, 7, 4, 5, 2, 3};
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(QuantizeFp4(kFp4T[k]), fp4_code[k]) << k;
    EXPECT_EQ(QuantizeFp4(std::nextafter(kFp4T[k], 2.0f)), fp4_code[k + 1]) << k;
    EXPECT_EQ(QuantizeFp4(-kFp4T[k]), 8 + fp4_code[k]) << k;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(QuantizeNf4(nan), 0);
  EXPECT_EQ(QuantizeFp4(nan), 0);
  EXPECT_EQ(QuantizeFp4(-0.0f), 0);
  EXPECT_EQ(QuantizeDynamic8(DynamicCodeSigned(), nan), 0);
  for (int c = 0; c < 16; ++c) {  // the code tables and the dequantizer agree (but FP4's -0)
    EXPECT_EQ(Dequantize4(Quant4Type::kNF4, c), Quant4Code(Quant4Type::kNF4)[c]);
    EXPECT_EQ(Dequantize4(Quant4Type::kFP4, c), Quant4Code(Quant4Type::kFP4)[c]);
    EXPECT_EQ(QuantizeNf4(DequantizeNf4(c)), c);  // each code value quantizes to itself
  }
  EXPECT_EQ(Bits(DequantizeFp4(8)), Bits(-0.0f));
  EXPECT_EQ(Bits(Quant4Code(Quant4Type::kFP4)[8]), Bits(0.0f));
}

// The CPU quantizer's vectorised form (counting thresholds) equals quant4.h's trees (the form
// CUDA kernels share) on a sweep of [-1, 1] by bit pattern, every threshold +-3 ulps, NaN, +-0 and
// denormals: blocks of 63 such values and a 1.0, so absmax is 1 and x * (1 / absmax) is x.
TEST(Quant4, VectorisedCodesEqualTrees) {
  std::vector<float> vals;
  for (uint32_t u = 0; u < 0x3F800000u; u += 4099) {
    vals.push_back(std::bit_cast<float>(u));
    vals.push_back(-std::bit_cast<float>(u));
  }
  for (int k = 0; k < 1000; ++k) {  // the interval of every NF4/FP4 threshold, densely
    for (float c : {0.0398f, 0.1203f, 0.5017f, 0.8615f, -0.8481f, 0.0026f, 0.5833f, -0.0859f}) {
      vals.push_back(std::nextafter(c, 2.0f) + static_cast<float>(k - 500) * 1e-7f);
    }
  }
  std::vector<float> centres(kNf4T, kNf4T + 15);  // every threshold and 3 ulps around it
  for (float t : kFp4T) centres.insert(centres.end(), {t, -t});
  for (float c : centres) {
    float v = c;
    for (int d = 0; d < 3; ++d) v = std::nextafter(v, -2.0f);
    for (int d = 0; d < 7; ++d, v = std::nextafter(v, 2.0f)) vals.push_back(v);
  }
  for (int t = 0; t < 16; ++t) {  // the code values and 3 ulps around each
    for (Quant4Type q : {Quant4Type::kNF4, Quant4Type::kFP4}) {
      float v = Dequantize4(q, t);
      for (int d = 0; d < 3; ++d) v = std::nextafter(v, -2.0f);
      for (int d = 0; d < 7; ++d, v = std::nextafter(v, 2.0f)) vals.push_back(v);
    }
  }
  for (float v : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-40f, 1.0f, -1.0f,
                  std::numeric_limits<float>::quiet_NaN()}) {
    vals.push_back(v);
  }
  std::vector<float> x;
  for (size_t i = 0; i < vals.size(); ++i) {
    if (std::fabs(vals[i]) > 1.0f) continue;  // the ulps above 1.0
    if (x.size() % kQuant4Block == 0) x.push_back(1.0f);
    x.push_back(vals[i]);
  }
  while (x.size() % kQuant4Block != 0) x.push_back(0.0f);
  for (Quant4Type q : {Quant4Type::kNF4, Quant4Type::kFP4}) {
    std::vector<uint8_t> codes(Quant4Bytes(x.size()));
    std::vector<float> absmax(Quant4Blocks(x.size()));
    cpu::Quantize4bit(x.data(), DType::kF32, x.size(), q, codes.data(), absmax.data(), 2);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(absmax[i / kQuant4Block], 1.0f);
      const int code = (i & 1) ? codes[i / 2] & 15 : codes[i / 2] >> 4;
      ASSERT_EQ(code, Quantize4(q, x[i]))
          << Quant4TypeName(q) << " x " << x[i] << " (bits " << std::hex << Bits(x[i]) << ")";
    }
  }
  std::printf("quant4: %zu values, vectorised codes == trees\n", vals.size());
}

TEST(Quant4, ZeroBlockIsCodeZeroAndDequantizesToMinusZero) {
  std::vector<float> x(2 * kQuant4Block, 0.0f);
  x[kQuant4Block] = 2.0f;  // block 1 nonzero: its zeros get NF4 code 7
  cpu::Quant4Host h = cpu::Quantize4bitHost(x.data(), DType::kF32, 128, Quant4Type::kNF4, false, 1);
  EXPECT_EQ(h.absmax[0], 0.0f);
  EXPECT_EQ(h.codes[0], 0x00);   // 0 * (1/0) = NaN -> code 0 (-1.0)
  EXPECT_EQ(h.codes[32], 0xF7);  // 2.0 -> 15, 0.0 -> 7
  EXPECT_EQ(h.codes[33], 0x77);
  std::vector<float> y(128);
  cpu::Dequantize4bit(h.View(), y.data(), DType::kF32, 1);
  EXPECT_EQ(Bits(y[0]), Bits(-0.0f));
  EXPECT_EQ(y[64], 2.0f);
  EXPECT_EQ(Bits(y[65]), Bits(0.0f));
}

DType ParseDType(const std::string& s) {
  return s == "f32" ? DType::kF32 : (s == "bf16" ? DType::kBF16 : DType::kF16);
}

TEST(Quant4, BitIdenticalToBitsandbytesReference) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  const std::string dir = testing::MakeTempDir("quant4");
  std::string out;
  ASSERT_EQ(testing::RunPython("quant4_reference.py", dir, &out), 0) << out;
  std::ifstream manifest(dir + "/manifest.txt");
  std::string line;
  int cases = 0;
  int64_t elements = 0;
  while (std::getline(manifest, line)) {
    std::istringstream in(line);
    std::string name, dtype_s, qtype_s, offset_hex;
    int dq = 0;
    int64_t n = 0;
    ASSERT_TRUE(in >> name >> dtype_s >> qtype_s >> dq >> n >> offset_hex) << line;
    SCOPED_TRACE(name);
    const DType dtype = ParseDType(dtype_s);
    const Quant4Type qtype = qtype_s == "nf4" ? Quant4Type::kNF4 : Quant4Type::kFP4;
    const std::string base = dir + "/" + name;
    const std::vector<uint8_t> x = ReadBin<uint8_t>(base + ".x.bin");
    ASSERT_EQ(static_cast<int64_t>(x.size()), n * static_cast<int64_t>(DTypeSize(dtype)));
    for (int nt : {1, 3}) {
      cpu::Quant4Host h = cpu::Quantize4bitHost(x.data(), dtype, n, qtype, dq != 0, nt);
      const auto codes = ReadBin<uint8_t>(base + ".codes.bin");
      EXPECT_EQ(FirstBitDiff(h.codes, codes), -1) << "codes, nt " << nt;
      if (dq) {
        EXPECT_EQ(Bits(h.offset),
                  Bits(static_cast<float>(std::strtod(offset_hex.c_str(), nullptr))));
        EXPECT_EQ(FirstBitDiff(h.qabsmax, ReadBin<uint8_t>(base + ".qabsmax.bin")), -1);
        EXPECT_EQ(FirstBitDiff(h.nested_absmax, ReadBin<float>(base + ".nested.bin")), -1);
      } else {
        EXPECT_EQ(FirstBitDiff(h.absmax, ReadBin<float>(base + ".absmax.bin")), -1) << "absmax";
      }
      std::vector<float> y(n);
      cpu::Dequantize4bit(h.View(), y.data(), DType::kF32, nt);
      EXPECT_EQ(FirstBitDiff(y, ReadBin<float>(base + ".deq_f32.bin")), -1) << "fp32 dequant";
      if (dq) {  // the nested absmax expanded once, then dequantized as a plain absmax
        std::vector<float> absmax(h.qabsmax.size());
        cpu::DequantizeAbsmaxNested(h.qabsmax.data(), h.nested_absmax.data(), DynamicCodeSigned(),
                                    h.offset, static_cast<int64_t>(absmax.size()), absmax.data(),
                                    nt);
        Quant4View plain = h.View();
        plain.absmax = absmax.data();
        std::vector<float> y2(n);
        cpu::Dequantize4bit(plain, y2.data(), DType::kF32, nt);
        EXPECT_EQ(FirstBitDiff(y2, y), -1) << "via DequantizeAbsmaxNested";
      }
      if (dtype != DType::kF32) {
        std::vector<uint16_t> y16(n);
        cpu::Dequantize4bit(h.View(), y16.data(), dtype, nt);
        EXPECT_EQ(FirstBitDiff(y16, ReadBin<uint16_t>(base + ".deq_in.bin")), -1) << dtype_s;
      }
    }
    ++cases;
    elements += n;
  }
  EXPECT_EQ(cases, 180) << out;
  std::printf("quant4: %d reference cases, %lld elements, bit-identical\n", cases,
              static_cast<long long>(elements));
}

// Rows [r0, r1) of a (rows, cols) weight equal the same slice of the full dequantization, for
// widths that make blocks straddle rows and rows start on a low nibble, nested or not.
TEST(Quant4, RowRangeMatchesFullDequantization) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int64_t cols : {int64_t{64}, int64_t{100}, int64_t{33}, int64_t{4096}}) {
    const int64_t rows = cols == 4096 ? 9 : 41;
    std::vector<float> w(rows * cols);
    for (float& v : w) v = normal(rng);
    for (Quant4Type t : {Quant4Type::kNF4, Quant4Type::kFP4}) {
      for (bool dq : {false, true}) {
        const cpu::Quant4Host h =
            cpu::Quantize4bitHost(w.data(), DType::kF32, rows * cols, t, dq, 2);
        std::vector<float> full(rows * cols);
        cpu::Dequantize4bit(h.View(), full.data(), DType::kF32, 2);
        std::vector<uint16_t> full16(rows * cols);
        cpu::Dequantize4bit(h.View(), full16.data(), DType::kBF16, 2);
        const int64_t r0 = 3, r1 = rows - 2, ld = cols + 5;
        std::vector<float> tile((r1 - r0) * ld, 123.0f);
        std::vector<uint16_t> tile16((r1 - r0) * ld, 0x1234);
        for (int nt : {1, 3}) {
          cpu::Dequantize4bitRows(h.View(), cols, r0, r1, tile.data(), ld, DType::kF32, nt);
          cpu::Dequantize4bitRows(h.View(), cols, r0, r1, tile16.data(), ld, DType::kBF16, nt);
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = 0; c < cols; ++c) {
              ASSERT_EQ(Bits(tile[(r - r0) * ld + c]), Bits(full[r * cols + c]))
                  << "cols " << cols << " row " << r << " col " << c;
              ASSERT_EQ(tile16[(r - r0) * ld + c], full16[r * cols + c]);
            }
            for (int64_t c = cols; c < ld; ++c) ASSERT_EQ(tile[(r - r0) * ld + c], 123.0f);
          }
        }
        // and the dequantized weight is within half a code spacing of w: |err| <= absmax * 0.2
        // (NF4's widest gap is 0.30, FP4's 1/3), a loose check that the codes mean something
        for (int64_t i = 0; i < rows * cols; ++i) {
          ASSERT_LE(std::fabs(full[i] - w[i]),
                    0.2f * h.View().BlockAbsmax(i / kQuant4Block) + 1e-6f);
        }
      }
    }
  }
}

// Speed of quantizing and dequantizing a 4096 x 4096 weight (printed; asserts the round trip).
TEST(Quant4, Throughput) {
  const int64_t n = 4096 * 4096;
  std::vector<uint16_t> w(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (uint16_t& v : w) v = F32ToBF16(normal(rng));
  std::vector<uint16_t> y(n, 0);
  std::vector<float> y32(n, 0.0f);
  for (int nt : {1, 2}) {
    double q_ms = 1e30, d_ms = 1e30, d32_ms = 1e30;  // best of 3 (the machine is shared)
    cpu::Quant4Host h;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      h = cpu::Quantize4bitHost(w.data(), DType::kBF16, n, Quant4Type::kNF4, true, nt);
      auto t1 = std::chrono::steady_clock::now();
      cpu::Dequantize4bit(h.View(), y.data(), DType::kBF16, nt);
      auto t2 = std::chrono::steady_clock::now();
      cpu::Dequantize4bit(h.View(), y32.data(), DType::kF32, nt);
      auto t3 = std::chrono::steady_clock::now();
      q_ms = std::min(q_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
      d_ms = std::min(d_ms, std::chrono::duration<double, std::milli>(t2 - t1).count());
      d32_ms = std::min(d32_ms, std::chrono::duration<double, std::milli>(t3 - t2).count());
    }
    std::printf(
        "quant4 4096x4096 bf16 nf4+dq, %d threads: quantize %.1f ms (%.0f Melem/s), "
        "dequantize to bf16 %.1f ms (%.0f Melem/s), to fp32 %.1f ms (%.0f Melem/s)\n",
        nt, q_ms, n / q_ms / 1e3, d_ms, n / d_ms / 1e3, d32_ms, n / d32_ms / 1e3);
    int64_t far = 0;
    for (int64_t i = 0; i < n; ++i) {
      far += std::fabs(BF16ToF32(y[i]) - BF16ToF32(w[i])) >
             0.2f * h.View().BlockAbsmax(i / 64) + 1e-6f;
    }
    EXPECT_EQ(far, 0);
  }
}

}  // namespace
}  // namespace traind::engine
