// CPU backend ops against independent double-precision references written here: GEMM (all
// transposes, padded leading dims, bf16/f16), Cast rounding, ExpF, elementwise ops, norms, AdamW.
// Backward ops are checked against central finite differences of the double references.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_math.h"
#include "backend/step_scalars.h"
#include "core/half.h"
#include "cpu_test_util.h"

namespace traind::engine {
namespace {

using testing::DotD;
using testing::ExpectClose;
using testing::NumGrad;
using testing::RandVec;
using testing::ToDouble;

class CpuOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};

// GEMM tests run once per library: oneDNN (param true) and OpenBLAS (false).
class CpuGemmTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!cpu::SetGemmLibraryForTesting(GetParam())) {
      GTEST_SKIP() << "SKIPPED: this build has no oneDNN (TRAIND_HAVE_DNNL unset)";
    }
  }
  void TearDown() override { cpu::SetGemmLibraryForTesting(true); }
  std::unique_ptr<Backend> be_ = MakeCpuBackend(2);
};
INSTANTIATE_TEST_SUITE_P(Libraries, CpuGemmTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "onednn" : "openblas"; });

TEST_F(CpuOpsTest, AllocIsAlignedAndCopiesRoundTrip) {
  for (size_t bytes : {1, 63, 64, 1000, 1 << 20}) {
    void* p = be_->Alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::vector<uint8_t> src(bytes), dst(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
    be_->CopyHostToDevice(p, src.data(), bytes);
    be_->CopyDeviceToHost(dst.data(), p, bytes);
    EXPECT_EQ(src, dst);
    be_->Memset0(p, bytes);
    be_->CopyDeviceToHost(dst.data(), p, bytes);
    EXPECT_EQ(std::vector<uint8_t>(bytes, 0), dst);
    be_->Free(p);
  }
  EXPECT_EQ(be_->name(), "cpu");
}

// Reference GEMM in double over the stored (possibly transposed, padded) layouts.
std::vector<double> RefGemm(bool ta, bool tb, int M, int N, int K, double alpha,
                            const std::vector<double>& A, int lda, const std::vector<double>& B,
                            int ldb, double beta, const std::vector<double>& C, int ldc) {
  std::vector<double> out = C;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int p = 0; p < K; ++p) {
        double a = ta ? A[p * lda + i] : A[i * lda + p];
        double b = tb ? B[j * ldb + p] : B[p * ldb + j];
        s += a * b;
      }
      out[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
  }
  return out;
}

TEST_P(CpuGemmTest, GemmF32AllTransposesAndPaddedLeadingDims) {
  const int M = 7, N = 13, K = 5;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
      auto A = RandVec(static_cast<size_t>((ta ? K : M) * lda), 1 + ta);
      auto B = RandVec(static_cast<size_t>((tb ? N : K) * ldb), 3 + tb);
      auto C = RandVec(static_cast<size_t>(M * ldc), 5);
      auto want =
          RefGemm(ta, tb, M, N, K, 0.7, ToDouble(A), lda, ToDouble(B), ldb, -0.3, ToDouble(C), ldc);
      be_->Gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, -0.3f, C.data(), ldc);
      ExpectClose(C, want, 1e-5, 1e-6,
                  "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
}

TEST_P(CpuGemmTest, GemmBetaZeroIgnoresGarbageAndLargeShapes) {
  // Large enough that the GEMM is split over threads (rows of C) on every library path.
  const int M = 70, N = 129, K = 300;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? M : K, ldb = tb ? K : N;
      auto A = RandVec(M * K, 11), B = RandVec(N * K, 12);
      std::vector<float> C(M * N, NAN);  // beta = 0 must not read C
      auto want = RefGemm(ta, tb, M, N, K, 1.0, ToDouble(A), lda, ToDouble(B), ldb, 0.0,
                          std::vector<double>(M * N, 0.0), N);
      be_->Gemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N);
      ExpectClose(C, want, 1e-5, 2e-5,
                  "gemm 70x129x300 ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
}

// A transposed B with few long rows (N <= 512, M and K >= 256) is repacked to a plain B before
// oneDNN runs it (cpu_gemm.cc): the repack's edges (N and K not multiples of 16), a padded ldb,
// alpha and beta, with A plain and transposed.
TEST_P(CpuGemmTest, TransposedNarrowBIsRepackedExactly) {
  const int M = 260, N = 37, K = 300, ldb = K + 5, ldc = N + 3;
  for (int ta = 0; ta < 2; ++ta) {
    const int lda = ta ? M : K;
    auto A = RandVec(static_cast<size_t>(M * K), 21 + ta), B = RandVec(static_cast<size_t>(N * ldb), 23);
    auto C = RandVec(static_cast<size_t>(M * ldc), 25);
    auto want = RefGemm(ta, true, M, N, K, 0.5, ToDouble(A), lda, ToDouble(B), ldb, 0.25,
                        ToDouble(C), ldc);
    be_->Gemm(ta, true, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), ldc);
    ExpectClose(C, want, 1e-5, 2e-5, "gemm 260x37x300 tb=1 ta=" + std::to_string(ta));
  }
}

std::vector<uint16_t> ToHalf(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    h[i] = t == DType::kBF16 ? F32ToBF16(v[i]) : F32ToF16(v[i]);
  }
  return h;
}
double FromHalf(uint16_t h, DType t) {
  return t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
}

TEST_P(CpuGemmTest, Gemm16BitMatchesF32OfRoundedInputs) {
  const int M = 9, N = 17, K = 33;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
        auto A = RandVec((ta ? K : M) * lda, 21), B = RandVec((tb ? N : K) * ldb, 22);
        auto Ah = ToHalf(A, t), Bh = ToHalf(B, t);
        std::vector<double> Ar(A.size()), Br(B.size());
        for (size_t i = 0; i < A.size(); ++i) Ar[i] = FromHalf(Ah[i], t);
        for (size_t i = 0; i < B.size(); ++i) Br[i] = FromHalf(Bh[i], t);
        const std::string tag = std::string("gemm ") + DTypeName(t) + " ta=" + std::to_string(ta) +
                                " tb=" + std::to_string(tb);
        // f32 output: exact products of the rounded inputs, fp32 accumulation.
        std::vector<float> C(M * ldc, 0.0f);
        auto want =
            RefGemm(ta, tb, M, N, K, 1.0, Ar, lda, Br, ldb, 0.0, std::vector<double>(M * ldc), ldc);
        be_->Gemm(ta, tb, M, N, K, 1.0f, Ah.data(), lda, Bh.data(), ldb, 0.0f, C.data(), ldc, t,
                  DType::kF32);
        ExpectClose(C, want, 1e-5, 1e-5, tag + " -> f32");
        // Against the unrounded fp32 product: a 16-bit-appropriate tolerance.
        auto exact = RefGemm(ta, tb, M, N, K, 1.0, ToDouble(A), lda, ToDouble(B), ldb, 0.0,
                             std::vector<double>(M * ldc), ldc);
        ExpectClose(C, exact, 0.0, t == DType::kBF16 ? 0.05 : 0.01, tag + " vs unrounded f32");
        // 16-bit output with alpha and beta: C rounded once (within one unit of the format); the
        // gaps between rows (ldc > N) keep their bytes.
        auto C0 = RandVec(M * ldc, 23);
        auto Ch = ToHalf(C0, t);
        const auto Ch0 = Ch;
        std::vector<double> C0r(C0.size());
        for (size_t i = 0; i < C0.size(); ++i) C0r[i] = FromHalf(Ch[i], t);
        auto want16 = RefGemm(ta, tb, M, N, K, 0.5, Ar, lda, Br, ldb, 2.0, C0r, ldc);
        be_->Gemm(ta, tb, M, N, K, 0.5f, Ah.data(), lda, Bh.data(), ldb, 2.0f, Ch.data(), ldc, t,
                  t);
        std::vector<float> got(Ch.size());
        for (size_t i = 0; i < Ch.size(); ++i) got[i] = static_cast<float>(FromHalf(Ch[i], t));
        ExpectClose(got, want16, t == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048, 1e-5, tag + " out");
        for (int i = 0; i < M; ++i) {
          for (int j = N; j < ldc; ++j) ASSERT_EQ(Ch[i * ldc + j], Ch0[i * ldc + j]) << tag;
        }
      }
    }
  }
}

TEST_P(CpuGemmTest, Bf16GemmLargeMatchesF32) {
  // Big enough for oneDNN's blocked bf16 kernels (when present) and the threaded paths.
  const int M = 130, N = 200, K = 384;
  auto A = RandVec(M * K, 24), B = RandVec(N * K, 25);
  auto Ah = ToHalf(A, DType::kBF16), Bh = ToHalf(B, DType::kBF16);
  std::vector<double> Ar(A.size()), Br(B.size());
  for (size_t i = 0; i < A.size(); ++i) Ar[i] = BF16ToF32(Ah[i]);
  for (size_t i = 0; i < B.size(); ++i) Br[i] = BF16ToF32(Bh[i]);
  auto want = RefGemm(false, true, M, N, K, 1.0, Ar, K, Br, K, 0.0, std::vector<double>(M * N), N);
  std::vector<float> C(M * N);
  be_->Gemm(false, true, M, N, K, 1.0f, Ah.data(), K, Bh.data(), K, 0.0f, C.data(), N, DType::kBF16,
            DType::kF32);
  ExpectClose(C, want, 1e-5, 2e-5, "bf16 gemm 130x200x384");
}

// bf16 reference rounding: pick the nearer of the two neighbours (ties: even mantissa), in double.
uint16_t RefBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dlo = std::abs(static_cast<double>(std::bit_cast<float>(uint32_t{lo} << 16)) - f);
  double vhi = std::bit_cast<float>(uint32_t{hi} << 16);
  if (std::isinf(vhi))
    vhi = std::copysign(0x1p128, vhi);  // the value "one unit past" FLT_MAX's bf16
  double dhi = std::abs(vhi - f);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST_F(CpuOpsTest, CastRoundsToNearestEven) {
  // bf16 ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1.0); 1 + 3*2^-8 -> up.
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(F32ToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(F32ToBF16(-1.0f - 3 * 0x1p-8f), 0xbf82);
  EXPECT_EQ(F32ToBF16(3.4028235e38f), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
  EXPECT_EQ(F32ToBF16(INFINITY), 0x7f80);
  // f16: ties, overflow threshold 65520, subnormals.
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e6f), 0xfc00);
  EXPECT_EQ(F32ToF16(0x1p-24f), 0x0001);
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);  // tie to even (0)
  EXPECT_EQ(F32ToF16(1.5f * 0x1p-25f), 0x0001);
  EXPECT_EQ(F32ToF16(3 * 0x1p-25f), 0x0002);         // 1.5 units: tie -> even (2)
  EXPECT_EQ(F32ToF16(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the normals
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(NAN))));
  // Every f16 value converts to float and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << h;
  }
  // Random floats over many magnitudes: against the compiler's _Float16 (IEEE RNE) and RefBf16.
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBF16(f), RefBf16(f)) << f;
    _Float16 ref = static_cast<_Float16>(f);
    ASSERT_EQ(F32ToF16(f), std::bit_cast<uint16_t>(ref)) << f;
  }
  // The backend op, all directions (bf16 <-> f16 goes through the exact f32 value).
  auto x = RandVec(1000, 8, -70000.0f, 70000.0f);
  std::vector<uint16_t> b(x.size()), h(x.size()), hb(x.size());
  std::vector<float> back(x.size());
  be_->Cast(b.data(), DType::kBF16, x.data(), DType::kF32, 1000);
  be_->Cast(h.data(), DType::kF16, x.data(), DType::kF32, 1000);
  be_->Cast(hb.data(), DType::kF16, b.data(), DType::kBF16, 1000);
  be_->Cast(back.data(), DType::kF32, b.data(), DType::kBF16, 1000);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(b[i], F32ToBF16(x[i]));
    EXPECT_EQ(h[i], F32ToF16(x[i]));
    EXPECT_EQ(hb[i], F32ToF16(BF16ToF32(b[i])));
    EXPECT_EQ(back[i], BF16ToF32(b[i]));
  }
}

// Bit patterns that stress the conversions: NaNs (quiet, signalling, payloads, both signs), infs,
// zeros, f32 denormals, FLT_MAX, and the bf16 / f16 rounding ties and thresholds.
std::vector<uint32_t> CastEdgeBits() {
  std::vector<uint32_t> v = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u,
                             0x7fffffffu, 0x7f80ffffu, 0x7f812345u, 0x7f800000u, 0xff800000u,
                             0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu,
                             0x00400000u, 0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x3f808000u,
                             0x3f818000u, 0xbf818000u, 0x3f807fffu, 0x3f808001u};
  for (float f : {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.0f, 65520.0f, 65519.996f,
                  -65520.0f, 0x1p-24f, 0x1p-25f, 1.5f * 0x1p-25f, 3 * 0x1p-25f, 0x1p-14f,
                  0x1p-14f - 0x1p-26f, 0x1p-14f - 0x1p-24f, -0x1p-20f, 5 * 0x1p-26f, 0x1p-26f,
                  0x1.8p-24f, 0x1p-149f, 1e-40f})
    v.push_back(std::bit_cast<uint32_t>(f));
  return v;
}

// The vectorised, threaded Cast against the scalar F32ToBF16 / F32ToF16 / BF16ToF32 /
// F16ToF32 (checked above against independent references), bit for bit, on every length 1..100
// at several misalignments (vector tails and heads) and on a large threaded length.
TEST_F(CpuOpsTest, CastArrayMatchesScalarBitExactly) {
  std::vector<uint32_t> edge = CastEdgeBits();
  std::mt19937 rng(11);
  const int64_t kLarge = (1 << 17) + 37;
  std::vector<uint32_t> pool(kLarge + 8);
  for (size_t i = 0; i < pool.size(); ++i)  // every 3rd an edge value, the rest random bits
    pool[i] = (i % 3 == 0) ? edge[(i / 3) % edge.size()] : static_cast<uint32_t>(rng());
  std::vector<uint16_t> h16(pool.size());  // 16-bit sources: all halves incl. NaN/inf/subnormal
  for (size_t i = 0; i < h16.size(); ++i) h16[i] = static_cast<uint16_t>(i * 40503u + (i >> 16));
  std::vector<uint16_t> out16(pool.size());
  std::vector<uint32_t> out32(pool.size());
  auto check = [&](int64_t off, int64_t n, int nt) {
    const float* f = reinterpret_cast<const float*>(pool.data()) + off;
    const uint16_t* h = h16.data() + off;
    cpu::Cast(out16.data(), DType::kBF16, f, DType::kF32, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out16[i], F32ToBF16(f[i])) << "f32->bf16 n=" << n << " i=" << i;
    cpu::Cast(out16.data(), DType::kF16, f, DType::kF32, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out16[i], F32ToF16(f[i])) << "f32->f16 n=" << n << " i=" << i;
    cpu::Cast(out32.data(), DType::kF32, h, DType::kBF16, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out32[i], std::bit_cast<uint32_t>(BF16ToF32(h[i]))) << "bf16->f32 " << n;
    cpu::Cast(out32.data(), DType::kF32, h, DType::kF16, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out32[i], std::bit_cast<uint32_t>(F16ToF32(h[i]))) << "f16->f32 " << n;
    cpu::Cast(out16.data(), DType::kF16, h, DType::kBF16, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out16[i], F32ToF16(BF16ToF32(h[i]))) << "bf16->f16 " << n;
    cpu::Cast(out16.data(), DType::kBF16, h, DType::kF16, n, nt);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out16[i], F32ToBF16(F16ToF32(h[i]))) << "f16->bf16 " << n;
  };
  for (int64_t off : {0, 1, 3, 7})
    for (int64_t n = 1; n <= 100; ++n) {
      check(off, n, 1);
      if (HasFatalFailure()) return;
    }
  for (int nt : {1, 2, 3}) {
    check(5, kLarge, nt);
    if (HasFatalFailure()) return;
  }
  // Every edge value through the public op too (the backend's own thread count).
  std::vector<uint16_t> b(edge.size());
  be_->Cast(b.data(), DType::kF16, edge.data(), DType::kF32, static_cast<int64_t>(edge.size()));
  for (size_t i = 0; i < edge.size(); ++i)
    EXPECT_EQ(b[i], F32ToF16(std::bit_cast<float>(edge[i]))) << std::hex << edge[i];
}

TEST(CpuMathTest, ExpFWithinThreeUlp) {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; ++i) {
    float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(cpu::ExpF(x) - want) / want);
  }
  EXPECT_LT(worst, 3.0 * 0x1p-24) << "max relative error of ExpF";
  EXPECT_EQ(cpu::ExpF(0.0f), 1.0f);
  EXPECT_EQ(cpu::ExpFlushF(-1000.0f), 0.0f);
  EXPECT_GT(cpu::ExpF(1000.0f), 1e38f);  // saturates, no inf/NaN
  EXPECT_TRUE(std::isnan(cpu::ExpF(NAN)));
}

// MaxF / MaxWhereF against a plain std::max loop: every length around the 32-lane blocks, the
// maximum in the blocks and in the tail, NaNs passed over, all-masked rows at -inf.
TEST(CpuMathTest, MaxFEqualsTheSequentialMaximum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-50.0f, 50.0f);
  for (int64_t n : {0, 1, 5, 31, 32, 33, 63, 64, 65, 100, 128, 1000, 50304}) {
    std::vector<float> x(static_cast<size_t>(n));
    std::vector<int32_t> keep(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      x[i] = u(rng);
      keep[i] = (rng() % 3) != 0;
      if (i % 17 == 3) x[i] = NAN;
    }
    if (n > 40) x[n - 2] = 60.0f;  // the maximum in the tail or the last block
    float want = -INFINITY, want_kept = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      want = std::max(want, x[i]);
      if (keep[i] != 0) want_kept = std::max(want_kept, x[i]);
    }
    EXPECT_EQ(cpu::MaxF(x.data(), n), want) << "n=" << n;
    EXPECT_EQ(cpu::MaxWhereF(x.data(), keep.data(), n), want_kept) << "n=" << n;
    std::vector<int32_t> none(static_cast<size_t>(n), 0);
    EXPECT_EQ(cpu::MaxWhereF(x.data(), none.data(), n), -INFINITY) << "n=" << n;
  }
}

// ErfcNonNegF (exact GELU's kernel): relative error against std::erfc in double over [0, 9]
// (erfc(9) ~ 4e-37; past ~9.3 it flushes to 0), where the fit alone is 1.05e-7 and float
// evaluation adds a few ulps of the exponent's z^2 (up to ~81 * 6e-8 at z = 9); and NormalCdfF on
// both sides: relative for x < 0 (no cancellation), absolute 1 ulp-ish for x > 0.
TEST(CpuMathTest, ErfcAndNormalCdfRelativeError) {
  double worst_small = 0.0, worst_all = 0.0;
  for (int i = 0; i <= 900000; ++i) {
    const float z = 9.0f * static_cast<float>(i) / 900000.0f;
    const double want = std::erfc(static_cast<double>(z));
    const double rel = std::abs(cpu::ErfcNonNegF(z) - want) / want;
    worst_all = std::max(worst_all, rel);
    if (z <= 3.0f) worst_small = std::max(worst_small, rel);
  }
  EXPECT_LT(worst_small, 2e-6) << "erfc on [0, 3]";
  EXPECT_LT(worst_all, 2e-5) << "erfc on [0, 9]";
  EXPECT_EQ(cpu::ErfcNonNegF(20.0f), 0.0f);
  // x << 0: rounding x / sqrt 2 to float moves z^2 by ~1.2e-7 relative, so exp(-z^2) by ~z^2
  // times that: 6e-6 at x = -10 (Phi ~ 7.6e-24 there), under 1e-6 for x >= -4.
  double worst_neg = 0.0, worst_near = 0.0, worst_pos = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -10.0f + 20.0f * static_cast<float>(i) / 200000.0f;
    const double want = 0.5 * std::erfc(-static_cast<double>(x) / std::sqrt(2.0));
    const double got = cpu::NormalCdfF(x);
    if (x < 0) worst_neg = std::max(worst_neg, std::abs(got - want) / want);
    if (x < 0 && x >= -4.0f) worst_near = std::max(worst_near, std::abs(got - want) / want);
    if (x >= 0) worst_pos = std::max(worst_pos, std::abs(got - want));
  }
  EXPECT_LT(worst_near, 2e-6) << "Phi(x), x in [-4, 0): relative";
  EXPECT_LT(worst_neg, 3e-5) << "Phi(x), x in [-10, 0): relative";
  EXPECT_LT(worst_pos, 3e-7) << "Phi(x), x in [0, 10]: absolute (ulp(1) = 1.2e-7)";
  EXPECT_EQ(cpu::NormalCdfF(12.0f), 1.0f);
  EXPECT_EQ(cpu::NormalCdfF(-20.0f), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::NormalCdfF(NAN)));
}

TEST_F(CpuOpsTest, EmbeddingForwardAndBackward) {
  const int V = 11, C = 13, N = 7;
  auto table = RandVec(V * C, 31);
  std::vector<int32_t> ids = {3, 0, 10, 3, 3, 7, 0};
  auto out = RandVec(N * C, 32);
  auto base = out;
  be_->EmbeddingForward(out.data(), ids.data(), table.data(), N, C, /*accumulate=*/true);
  std::vector<double> want(N * C);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) want[n * C + c] = base[n * C + c] + double{table[ids[n] * C + c]};
  }
  ExpectClose(out, want, 1e-6, 1e-7, "embedding +=");
  be_->EmbeddingForward(out.data(), ids.data(), table.data(), N, C, /*accumulate=*/false);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) want[n * C + c] = table[ids[n] * C + c];
  }
  ExpectClose(out, want, 0, 0, "embedding =");
  // Large enough to thread: dtable += scatter of dout, repeated ids summed.
  const int N2 = 3000, C2 = 40;
  std::vector<int32_t> ids2(N2);
  for (int n = 0; n < N2; ++n) ids2[n] = (n * 7) % V;
  auto dout = RandVec(N2 * C2, 33);
  auto dtable = RandVec(V * C2, 34);
  std::vector<double> wantd = ToDouble(dtable);
  for (int n = 0; n < N2; ++n) {
    for (int c = 0; c < C2; ++c) wantd[ids2[n] * C2 + c] += dout[n * C2 + c];
  }
  be_->EmbeddingBackward(dtable.data(), dout.data(), ids2.data(), N2, C2);
  ExpectClose(dtable, wantd, 1e-5, 1e-4, "embedding backward");
}

TEST_F(CpuOpsTest, BiasAddScaleSumSquares) {
  for (int N : {7, 1000}) {
    const int OC = 13;
    auto out = RandVec(N * OC, 41), bias = RandVec(OC, 42), dbias = RandVec(OC, 43);
    std::vector<double> want(out.size()), wantb = ToDouble(dbias);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < OC; ++c) {
        want[n * OC + c] = double{out[n * OC + c]} + bias[c];
        wantb[c] += out[n * OC + c];
      }
    }
    be_->BiasBackward(dbias.data(), out.data(), N, OC);
    ExpectClose(dbias, wantb, 1e-5, 1e-5, "bias backward");
    be_->AddBias(out.data(), bias.data(), N, OC);
    ExpectClose(out, want, 1e-6, 1e-7, "add bias");
  }
  for (int n : {5, 100003}) {
    auto a = RandVec(n, 44), b = RandVec(n, 45);
    std::vector<double> want(n);
    for (int i = 0; i < n; ++i) want[i] = (double{a[i]} + b[i]) * 0.25;
    be_->Add(a.data(), a.data(), b.data(), n);  // out aliases a
    be_->Scale(a.data(), 0.25f, n);
    ExpectClose(a, want, 1e-6, 1e-7, "add+scale");
    double ss = 0.0;
    for (float x : a) ss += double{x} * x;
    EXPECT_NEAR(be_->SumSquares(a.data(), n), ss, 1e-12 * ss);
  }
}

TEST_F(CpuOpsTest, HasNonFiniteFindsNanAndInfAnywhere) {
  for (int n : {1, 17, 100003}) {
    auto x = RandVec(n, 46, -1e38f, 1e38f);  // large but finite
    EXPECT_FALSE(be_->HasNonFinite(x.data(), n)) << n;
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (int pos : {0, n / 2, n - 1}) {
        auto y = x;
        y[pos] = bad;
        EXPECT_TRUE(be_->HasNonFinite(y.data(), n)) << "n " << n << " pos " << pos << " " << bad;
      }
    }
  }
  EXPECT_FALSE(be_->HasNonFinite(nullptr, 0));
}

double RefGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_F(CpuOpsTest, GeluForwardBackward) {
  const int n = 1001;
  auto x = RandVec(n, 51, -6.0f, 6.0f);
  x[0] = 0.0f;
  x[1] = -12.0f;
  std::vector<float> out(n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = RefGelu(x[i]);
  be_->GeluForward(out.data(), x.data(), n);
  ExpectClose(out, want, 2e-6, 1e-7, "gelu");
  // Gradient of sum(R * gelu(x)) by finite differences of the double reference.
  auto R = RandVec(n, 52);
  std::vector<double> num(n);
  for (int i = 0; i < n; ++i) {
    double h = 1e-6;
    num[i] = R[i] * (RefGelu(x[i] + h) - RefGelu(x[i] - h)) / (2 * h);
  }
  std::vector<float> dinp = R;  // dinp aliases dout
  be_->GeluBackward(dinp.data(), x.data(), dinp.data(), n);
  ExpectClose(dinp, num, 1e-5, 1e-6, "gelu backward");
}

// The fused epilogues against the composed ops: LinearForward's pre against Gemm + AddBias (the
// bits without a bias; within fp32 reassociation with one, which the library may add as it stores
// the product) and its act the bits of GeluForward(pre), LinearForwardRoundedAct the same pre and
// the bits of Cast(act), BiasBackwardRounded the bits of BiasBackward and Cast. Rows of 24, 1000 and 1100 columns (a
// tail past whole vectors; 1100 past the widest fp32 product the library adds a bias to), 7, 600
// and 300 rows (one thread and two), fp32/bf16/f16.
TEST_F(CpuOpsTest, FusedLinearEpiloguesEqualTheComposedOps) {
  for (auto [N, C, OC] :
       {std::tuple<int, int, int>{7, 40, 24}, {600, 64, 1000}, {300, 384, 1100}}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::to_string(N) + "x" + std::to_string(OC) + " " + DTypeName(t));
      const auto inp32 = RandVec(N * C, 61), w32 = RandVec(OC * C, 62), bias = RandVec(OC, 63);
      auto to16 = [t](const std::vector<float>& v) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::kBF16 ? F32ToBF16(v[i]) : F32ToF16(v[i]);
        return h;
      };
      const auto inp16 = to16(inp32), w16 = to16(w32);
      const void* inp = t == DType::kF32 ? static_cast<const void*>(inp32.data()) : inp16.data();
      const void* w = t == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data();
      const size_t n = static_cast<size_t>(N) * OC;
      for (bool with_bias : {false, true}) {
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> pre_ref(n), act_ref(n), pre(n), act(n, NAN);
        be_->Gemm(false, true, N, OC, C, 1.0f, inp, C, w, C, 0.0f, pre_ref.data(), OC, t);
        if (b != nullptr) be_->AddBias(pre_ref.data(), b, N, OC);
        be_->LinearForward(pre.data(), act.data(), inp, w, b, N, C, OC, t);
        // With a bias the library may add it as it stores the product (oneDNN's matmul: another
        // kernel than its sgemm, so the sums may be reassociated); the GELU is of that pre exactly.
        ExpectClose(pre, ToDouble(pre_ref), 1e-5, 1e-5,
                    "LinearForward pre, bias " + std::to_string(with_bias));
        if (b == nullptr) {
          EXPECT_EQ(pre, pre_ref) << "LinearForward pre without a bias: the Gemm";
        } else if (t == DType::kF32 && OC > 1024) {
          // Wider than 1024 outputs in fp32 the product is the GEMM and the bias a pass of its own
          // (the matmul was slower there: cpu_gemm.cc's kMaxFp32MatmulWidth), so the same bits.
          EXPECT_EQ(pre, pre_ref) << "LinearForward pre, a wide fp32 product with a bias";
        }
        be_->GeluForward(act_ref.data(), pre.data(), static_cast<int64_t>(n));
        EXPECT_EQ(act, act_ref) << "LinearForward act, bias " << with_bias;
        for (DType at : {DType::kBF16, DType::kF16}) {
          std::vector<uint16_t> want16(n), got16(n, 0xFFFF);
          be_->Cast(want16.data(), at, act_ref.data(), DType::kF32, static_cast<int64_t>(n));
          std::vector<float> pre2(n, NAN);
          be_->LinearForwardRoundedAct(pre2.data(), got16.data(), at, nullptr, inp, w, b, N, C,
                                       OC, t);
          EXPECT_EQ(pre2, pre) << "LinearForwardRoundedAct pre, act " << DTypeName(at);
          EXPECT_EQ(got16, want16) << "LinearForwardRoundedAct act, " << DTypeName(at);
        }
      }
      if (t == DType::kF32) continue;
      const auto dout = RandVec(n, 64, -3.0f, 3.0f), db0 = RandVec(OC, 65);
      auto db_ref = db0, db = db0;
      std::vector<uint16_t> want16(n), got16(n, 0xFFFF);
      be_->BiasBackward(db_ref.data(), dout.data(), N, OC);
      be_->Cast(want16.data(), t, dout.data(), DType::kF32, static_cast<int64_t>(n));
      be_->BiasBackwardRounded(db.data(), dout.data(), N, OC, got16.data(), t);
      EXPECT_EQ(db, db_ref) << "BiasBackwardRounded dbias";
      EXPECT_EQ(got16, want16) << "BiasBackwardRounded dout16";
    }
  }
}

// GELU's backward with the bias gradient and the 16-bit rounding in one pass against GeluBackward
// + BiasBackward (+ Cast): the same bits where every row chunk is whole vectors (OC 1024 on two
// threads), within an ulp elsewhere (OC 24: a per-row tail against one tail at the end); dinp in
// place over dout as the MLP calls it; no dbias (a frozen bias) leaves the rest alone. 16-bit:
// the fp32 gradient is not stored (dinp, over dout, keeps dout).
TEST_F(CpuOpsTest, GeluBackwardBiasEqualsTheComposedOps) {
  for (auto [N, OC] : {std::pair<int, int>{600, 1024}, {7, 24}}) {
    const bool exact = OC % 16 == 0;
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(std::to_string(N) + "x" + std::to_string(OC) + " " + DTypeName(t) +
                     (with_bias ? " bias" : " no bias"));
        const size_t n = static_cast<size_t>(N) * OC;
        const auto inp = RandVec(n, 91, -6.0f, 6.0f), dout = RandVec(n, 92);
        const auto db0 = RandVec(OC, 93);
        std::vector<float> want(n), got = dout, db_want = db0, db_got = db0;
        std::vector<uint16_t> want16(n), got16(n, 0xFFFF);
        be_->GeluBackward(want.data(), inp.data(), dout.data(), static_cast<int64_t>(n));
        be_->BiasBackward(db_want.data(), want.data(), N, OC);
        if (t != DType::kF32) {
          be_->Cast(want16.data(), t, want.data(), DType::kF32, static_cast<int64_t>(n));
        }
        be_->GeluBackwardBias(got.data(), inp.data(), got.data(),
                              with_bias ? db_got.data() : nullptr, N, OC,
                              t == DType::kF32 ? nullptr : got16.data(), t);
        if (!with_bias) {
          EXPECT_EQ(db_got, db0) << "no dbias: untouched";
          db_want = db0;
        }
        if (t != DType::kF32) {
          EXPECT_EQ(got, dout) << "16-bit: dinp (over dout) is not written";
          got = want;  // the checks below are of dbias and dinp16
        }
        if (exact) {
          EXPECT_EQ(got, want) << "dinp";
          EXPECT_EQ(db_got, db_want) << "dbias";
          if (t != DType::kF32) {
            EXPECT_EQ(got16, want16) << "dinp16";
          }
          continue;
        }
        ExpectClose(got, ToDouble(want), 1e-6, 1e-7, "dinp");
        ExpectClose(db_got, ToDouble(db_want), 1e-6, 1e-6, "dbias");
        if (t == DType::kF32) continue;
        for (size_t i = 0; i < n; ++i) {  // at most one 16-bit step apart
          const double a = FromHalf(got16[i], t), b = FromHalf(want16[i], t);
          ASSERT_LE(std::abs(a - b), std::abs(b) * (t == DType::kBF16 ? 0x1p-7 : 0x1p-10) + 1e-7)
              << "dinp16 element " << i;
        }
      }
    }
  }
}

// SwiGLU with its 16-bit output written as each row is computed: the bits of SwiGluForward /
// SwiGluBackward then Cast (elementwise, so any shape); the backward stores no fp32 gradient
// (its dinp is scratch the CPU leaves alone).
TEST_F(CpuOpsTest, SwiGluRoundedEqualsTheComposedOps) {
  for (auto [N, H] : {std::pair<int, int>{600, 688}, {7, 37}, {1, 1}}) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::to_string(N) + "x" + std::to_string(H) + " " + DTypeName(t));
      const size_t nh = static_cast<size_t>(N) * H;
      const auto inp = RandVec(2 * nh, 94, -6.0f, 6.0f), dout = RandVec(nh, 95);
      std::vector<float> act(nh), dinp_want(2 * nh), dinp_got(2 * nh, NAN);
      std::vector<uint16_t> act_want(nh), act_got(nh, 0xFFFF), d16_want(2 * nh),
          d16_got(2 * nh, 0xFFFF);
      be_->SwiGluForward(act.data(), inp.data(), N, H);
      be_->Cast(act_want.data(), t, act.data(), DType::kF32, static_cast<int64_t>(nh));
      be_->SwiGluForwardRounded(act_got.data(), t, nullptr, inp.data(), N, H);
      EXPECT_EQ(act_got, act_want) << "forward, 16-bit activation";
      be_->SwiGluBackward(dinp_want.data(), inp.data(), dout.data(), N, H);
      be_->Cast(d16_want.data(), t, dinp_want.data(), DType::kF32, static_cast<int64_t>(2 * nh));
      be_->SwiGluBackwardRounded(dinp_got.data(), d16_got.data(), t, inp.data(), dout.data(), N,
                                 H);
      EXPECT_TRUE(std::all_of(dinp_got.begin(), dinp_got.end(),
                              [](float x) { return std::isnan(x); }))
          << "backward: the fp32 scratch is not written";
      EXPECT_EQ(d16_got, d16_want) << "backward, 16-bit gradient";
    }
  }
}

// The residual add and the norm after it in one pass: the bits of Add, then the norm op (fp32) or
// its Rounded form (16-bit), LayerNorm and RMSNorm, one row (one thread) and 300 (two); the
// 16-bit scratch is not needed, and b may be that scratch (the decoder passes its tmp_c as both).
TEST_F(CpuOpsTest, ResidualNormForwardEqualsAddThenNorm) {
  for (int N : {1, 300}) {
    const int C = 200;
    const size_t n = static_cast<size_t>(N) * C;
    const auto a = RandVec(n, 95, -2.0f, 3.0f), b = RandVec(n, 96), w = RandVec(C, 97),
               bias = RandVec(C, 98);
    for (bool rms : {false, true}) {
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(std::to_string(N) + " rows " + (rms ? "rms " : "layernorm ") + DTypeName(t));
        std::vector<float> res_want(n), out_want(n), mean_want(N), rstd_want(N);
        std::vector<uint16_t> out16_want(n);
        be_->Add(res_want.data(), a.data(), b.data(), static_cast<int64_t>(n));
        if (rms) {
          be_->RmsNormForward(out_want.data(), rstd_want.data(), res_want.data(), w.data(), N, C,
                              1e-5f);
        } else {
          be_->LayerNormForward(out_want.data(), mean_want.data(), rstd_want.data(),
                                res_want.data(), w.data(), bias.data(), N, C, 1e-5f);
        }
        if (t != DType::kF32) {
          be_->Cast(out16_want.data(), t, out_want.data(), DType::kF32, static_cast<int64_t>(n));
        }
        std::vector<float> res(n, NAN), out(n, NAN), mean(N, NAN), rstd(N, NAN), bb = b;
        std::vector<uint16_t> out16(n, 0xFFFF);
        void* dst = t == DType::kF32 ? static_cast<void*>(out.data()) : out16.data();
        be_->ResidualNormForward(res.data(), dst, t, bb.data(), mean.data(), rstd.data(),
                                 a.data(), bb.data(), w.data(), rms ? nullptr : bias.data(), N, C,
                                 1e-5f, rms);
        EXPECT_EQ(res, res_want) << "res";
        EXPECT_EQ(rstd, rstd_want) << "rstd";
        if (!rms) {
          EXPECT_EQ(mean, mean_want) << "mean";
        }
        if (t == DType::kF32) {
          EXPECT_EQ(out, out_want) << "out";
        } else {
          EXPECT_EQ(out16, out16_want) << "out16";
        }
      }
    }
  }
}

// LayerNorm / RMSNorm rounded as they normalise: the bits of the fp32 op followed by Cast, the
// statistics equal (1 row: one thread; 300 rows: two), and the scratch is not needed.
TEST_F(CpuOpsTest, RoundedNormsEqualNormThenCast) {
  for (int N : {1, 300}) {
    const int C = 200;
    const auto inp = RandVec(N * C, 81, -2.0f, 3.0f), w = RandVec(C, 82), b = RandVec(C, 83);
    for (DType t : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::to_string(N) + " rows " + DTypeName(t));
      std::vector<float> out(N * C), mean(N), rstd(N), mean2(N, NAN), rstd2(N, NAN);
      std::vector<uint16_t> want(N * C), got(N * C, 0xFFFF);
      be_->LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                            N, C, 1e-5f);
      be_->Cast(want.data(), t, out.data(), DType::kF32, N * C);
      be_->LayerNormForwardRounded(got.data(), t, nullptr, mean2.data(), rstd2.data(), inp.data(),
                                   w.data(), b.data(), N, C, 1e-5f);
      EXPECT_EQ(got, want) << "layernorm";
      EXPECT_EQ(mean2, mean);
      EXPECT_EQ(rstd2, rstd);
      std::fill(got.begin(), got.end(), 0xFFFF);
      be_->RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6f);
      be_->Cast(want.data(), t, out.data(), DType::kF32, N * C);
      be_->RmsNormForwardRounded(got.data(), t, nullptr, rstd2.data(), inp.data(), w.data(), N, C,
                                 1e-6f);
      EXPECT_EQ(got, want) << "rmsnorm";
      EXPECT_EQ(rstd2, rstd);
    }
  }
}

// AdamWRunsFromScalars in one pass: the bits of one AdamWFromScalars per run (runs of 1 to 300001
// elements, out of offset order, their own decay; clipped gradients), and nothing outside the runs.
TEST_F(CpuOpsTest, AdamWRunsEqualOneCallPerRun) {
  const int64_t n = 400000;
  const auto grad = RandVec(n, 71), p0 = RandVec(n, 72), m0 = RandVec(n, 73, -0.1f, 0.1f),
             v0 = RandVec(n, 74, 0.0f, 0.01f);
  StepScalars sc;
  for (float x : grad) sc.grad_sq += double{x} * x;
  sc.lr = 3e-4f;
  sc.bias_correction1 = 0.19f;
  sc.bias_correction2 = 0.002f;
  sc.max_grad_norm = 1.0f;
  const AdamWRun runs[] = {{100, 300001, 0.1f}, {0, 1, 0.0f}, {1, 99, 0.1f}, {300101, 1000, 0.0f},
                           {301101, 98000, 0.05f}};  // the last 899 elements belong to no run
  auto p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
  for (const AdamWRun& r : runs) {
    be_->AdamWFromScalars(p1.data() + r.offset, grad.data() + r.offset, m1.data() + r.offset,
                          v1.data() + r.offset, r.numel, &sc, 0.9f, 0.95f, 1e-8f, r.weight_decay);
  }
  be_->AdamWRunsFromScalars(p2.data(), grad.data(), m2.data(), v2.data(), runs, 5, &sc, 0.9f, 0.95f,
                            1e-8f);
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(m2, m1);
  EXPECT_EQ(v2, v1);
  for (int64_t i = 399101; i < n; ++i) ASSERT_EQ(p2[i], p0[i]) << "outside the runs: " << i;
  EXPECT_NE(p2, p0);
}

double RefGeluErf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// Exact GELU (HF "gelu"): forward against std::erf in double, backward against central finite
// differences of that reference. 70001 elements: the multithreaded path. Tolerances: forward
// 2e-6 relative + 5e-7 absolute (1 + erf(x/sqrt2) cancels for x << 0: float's ulp(1) * |x|/2,
// |x| <= 8, as PyTorch's own fp32 kernel); backward 1e-5 + 1e-6.
TEST_F(CpuOpsTest, GeluErfForwardBackward) {
  const int n = 70001;
  auto x = RandVec(n, 53, -8.0f, 8.0f);
  x[0] = 0.0f;
  x[1] = -12.0f;
  x[2] = 12.0f;
  x[3] = 1e-20f;
  x[4] = -0.5f;
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = RefGeluErf(x[i]);
  std::vector<float> out = x;  // out aliases inp
  be_->GeluErfForward(out.data(), out.data(), n);
  ExpectClose(out, want, 2e-6, 5e-7, "gelu erf");
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[2], 12.0f);
  // Not the tanh approximation: they differ by ~1e-4 around |x| = 2.
  std::vector<float> approx(n);
  be_->GeluForward(approx.data(), x.data(), n);
  double max_diff = 0.0;
  for (int i = 0; i < n; ++i) max_diff = std::max(max_diff, std::abs(double(approx[i]) - out[i]));
  EXPECT_GT(max_diff, 1e-4);
  auto R = RandVec(n, 54);
  std::vector<double> num(n);
  for (int i = 0; i < n; ++i) {
    const double h = 1e-6;
    num[i] = R[i] * (RefGeluErf(x[i] + h) - RefGeluErf(x[i] - h)) / (2 * h);
  }
  std::vector<float> dinp = R;  // dinp aliases dout
  be_->GeluErfBackward(dinp.data(), x.data(), dinp.data(), n);
  ExpectClose(dinp, num, 1e-5, 1e-6, "gelu erf backward");
}

// tanh forward against std::tanh in double (2e-6 + 1e-7); backward = dout * (1 - out^2) from the
// forward's output, against finite differences of the double tanh (1e-5 + 1e-6).
TEST_F(CpuOpsTest, TanhForwardBackward) {
  for (int n : {1, 1001, 70001}) {
    auto x = RandVec(n, 55, -5.0f, 5.0f);
    x[0] = n > 1 ? 0.0f : -20.0f;
    std::vector<double> want(n);
    for (int i = 0; i < n; ++i) want[i] = std::tanh(static_cast<double>(x[i]));
    std::vector<float> out = x;  // out aliases inp
    be_->TanhForward(out.data(), out.data(), n);
    ExpectClose(out, want, 2e-6, 1e-7, "tanh n=" + std::to_string(n));
    auto R = RandVec(n, 56);
    std::vector<double> num(n);
    for (int i = 0; i < n; ++i) {
      const double h = 1e-6;
      num[i] = R[i] * (std::tanh(x[i] + h) - std::tanh(x[i] - h)) / (2 * h);
    }
    std::vector<float> dinp = R;  // dinp aliases dout
    be_->TanhBackward(dinp.data(), out.data(), dinp.data(), n);
    ExpectClose(dinp, num, 1e-5, 1e-6, "tanh backward n=" + std::to_string(n));
  }
}

// A gated unit over N rows of [gate | up] (H each): out = act(gate) * up against its double
// formula (`act`), the backward (`backward`: dinp from dout) against finite differences of it.
// Inputs in [-range, range] from `seed`, the output gradient from seed + 1.
void ExpectGatedUnitMatches(const std::string& tag, double (*act)(double), float range,
                            uint32_t seed,
                            const std::function<void(float*, const float*, int, int)>& forward,
                            const std::function<void(float*, const float*, const float*, int, int)>&
                                backward) {
  const int N = 7, H = 13;
  auto inp = RandVec(N * 2 * H, seed, -range, range);
  auto R = RandVec(N * H, seed + 1);
  auto ref = [&](const std::vector<double>& in, std::vector<double>* out) {
    out->assign(N * H, 0.0);
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < H; ++i) (*out)[n * H + i] = act(in[n * 2 * H + i]) * in[n * 2 * H + H + i];
    }
  };
  std::vector<double> want;
  ref(ToDouble(inp), &want);
  std::vector<float> out(N * H), dinp(N * 2 * H);
  forward(out.data(), inp.data(), N, H);
  ExpectClose(out, want, 2e-6, 1e-7, tag);
  auto num = NumGrad(
      [&](const std::vector<double>& in) {
        std::vector<double> o;
        ref(in, &o);
        return DotD(o, ToDouble(R));
      },
      ToDouble(inp));
  backward(dinp.data(), inp.data(), R.data(), N, H);
  ExpectClose(dinp, num, 1e-5, 1e-6, tag + " backward");
}

// SwiGLU: silu(gate) * up.
TEST_F(CpuOpsTest, SwiGluForwardBackward) {
  ExpectGatedUnitMatches(
      "swiglu", [](double g) { return g / (1.0 + std::exp(-g)); }, 4.0f, 61,
      [&](float* out, const float* inp, int N, int H) { be_->SwiGluForward(out, inp, N, H); },
      [&](float* dinp, const float* inp, const float* dout, int N, int H) {
        be_->SwiGluBackward(dinp, inp, dout, N, H);
      });
}

// GeGLU (gemma): gelu_tanh(gate) * up.
TEST_F(CpuOpsTest, GeGluForwardBackward) {
  ExpectGatedUnitMatches(
      "geglu",
      [](double x) {
        return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      },
      5.0f, 161,
      [&](float* out, const float* inp, int N, int H) { be_->GeGluForward(out, inp, N, H); },
      [&](float* dinp, const float* inp, const float* dout, int N, int H) {
        be_->GeGluBackward(dinp, inp, dout, N, H);
      });
}

// LayerNorm / RMSNorm references in double: y = norm(x) * w (+ b).
void RefNorm(bool rms, const std::vector<double>& x, const std::vector<double>& w,
             const std::vector<double>& b, int N, int C, double eps, std::vector<double>* y) {
  y->assign(N * C, 0.0);
  for (int n = 0; n < N; ++n) {
    const double* r = &x[n * C];
    double mu = 0.0, var = 0.0;
    if (!rms) {
      for (int i = 0; i < C; ++i) mu += r[i];
      mu /= C;
    }
    for (int i = 0; i < C; ++i) var += (r[i] - mu) * (r[i] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int i = 0; i < C; ++i) (*y)[n * C + i] = (r[i] - mu) * rs * w[i] + (rms ? 0.0 : b[i]);
  }
}

// Per-head RMSNorm (qwen3's q_norm / k_norm) in place over strided rows: each head against the
// double formula, the saved input, untouched columns past the heads; the backward (dx =, dweight
// +=) against finite differences.
TEST_F(CpuOpsTest, HeadRmsNormForwardBackward) {
  const int N = 5, NH = 3, HS = 8, stride = NH * HS + 4;
  const float eps = 1e-6f;
  const auto x0 = RandVec(N * stride, 163, -2.0f, 3.0f), w = RandVec(HS, 164);
  const auto R = RandVec(N * stride, 165);
  // RefNorm's RMSNorm over the N x NH heads gathered into rows of HS, scattered back.
  auto ref = [&](const std::vector<double>& x, const std::vector<double>& wd,
                 std::vector<double>* out) {
    std::vector<double> heads(N * NH * HS), normed;
    for (int n = 0; n < N; ++n) {
      std::copy_n(x.begin() + n * stride, NH * HS, heads.begin() + n * NH * HS);
    }
    RefNorm(/*rms=*/true, heads, wd, {}, N * NH, HS, eps, &normed);
    *out = x;
    for (int n = 0; n < N; ++n) {
      std::copy_n(normed.begin() + n * NH * HS, NH * HS, out->begin() + n * stride);
    }
  };
  std::vector<double> want;
  ref(ToDouble(x0), ToDouble(w), &want);
  std::vector<float> x = x0, saved(N * NH * HS), rstd(N * NH);
  be_->HeadRmsNormForward(x.data(), saved.data(), rstd.data(), w.data(), N, NH, HS, stride, eps);
  ExpectClose(x, want, 2e-6, 1e-7, "head rmsnorm");
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < NH * HS; ++i) EXPECT_EQ(saved[n * NH * HS + i], x0[n * stride + i]);
  }
  // d/dx and d/dw of sum(R * y) (the tail columns pass through unchanged: gradient R).
  auto num_dx = NumGrad(
      [&](const std::vector<double>& xd) {
        std::vector<double> o;
        ref(xd, ToDouble(w), &o);
        return DotD(o, ToDouble(R));
      },
      ToDouble(x0));
  auto num_dw = NumGrad(
      [&](const std::vector<double>& wd) {
        std::vector<double> o;
        ref(ToDouble(x0), wd, &o);
        return DotD(o, ToDouble(R));
      },
      ToDouble(w));
  std::vector<float> dx = R, dw(HS, 0.5f);
  be_->HeadRmsNormBackward(dx.data(), dw.data(), saved.data(), w.data(), rstd.data(), N, NH, HS,
                           stride);
  ExpectClose(dx, num_dx, 1e-5, 1e-6, "head rmsnorm dx");
  for (double& v : num_dw) v += 0.5;  // +=
  ExpectClose(dw, num_dw, 1e-5, 1e-6, "head rmsnorm dweight");
}

TEST_F(CpuOpsTest, LayerNormAndRmsNormForwardBackward) {
  for (bool rms : {false, true}) {
    for (auto [N, C] : {std::pair{7, 13}, std::pair{300, 64}}) {
      const float eps = 1e-5f;
      auto x = RandVec(N * C, 71, -2.0f, 3.0f), w = RandVec(C, 72), b = RandVec(C, 73);
      auto R = RandVec(N * C, 74);
      std::vector<double> want;
      RefNorm(rms, ToDouble(x), ToDouble(w), ToDouble(b), N, C, eps, &want);
      std::vector<float> out(N * C), mean(N), rstd(N);
      if (rms)
        be_->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
      else
        be_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                              C, eps);
      const std::string tag =
          std::string(rms ? "rmsnorm" : "layernorm") + " N=" + std::to_string(N);
      ExpectClose(out, want, 1e-5, 1e-6, tag);
      if (N > 50) continue;  // finite differences on the small shape only (time)
      // Backward of L = sum(R * y): dx, dw, db by finite differences; all three use +=.
      auto f_x = [&](const std::vector<double>& xx) {
        std::vector<double> y;
        RefNorm(rms, xx, ToDouble(w), ToDouble(b), N, C, eps, &y);
        return DotD(y, ToDouble(R));
      };
      auto f_w = [&](const std::vector<double>& ww) {
        std::vector<double> y;
        RefNorm(rms, ToDouble(x), ww, ToDouble(b), N, C, eps, &y);
        return DotD(y, ToDouble(R));
      };
      auto f_b = [&](const std::vector<double>& bb) {
        std::vector<double> y;
        RefNorm(rms, ToDouble(x), ToDouble(w), bb, N, C, eps, &y);
        return DotD(y, ToDouble(R));
      };
      auto dx0 = RandVec(N * C, 75), dw0 = RandVec(C, 76), db0 = RandVec(C, 77);
      auto dx = dx0, dw = dw0, db = db0;
      if (rms)
        be_->RmsNormBackward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
      else
        be_->LayerNormBackward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), N, C);
      auto add = [](std::vector<double> g, const std::vector<float>& base) {
        for (size_t i = 0; i < g.size(); ++i) g[i] += base[i];
        return g;
      };
      ExpectClose(dx, add(NumGrad(f_x, ToDouble(x)), dx0), 1e-4, 1e-5, tag + " dinp");
      ExpectClose(dw, add(NumGrad(f_w, ToDouble(w)), dw0), 1e-4, 1e-5, tag + " dweight");
      if (!rms) ExpectClose(db, add(NumGrad(f_b, ToDouble(b)), db0), 1e-4, 1e-5, tag + " dbias");
    }
  }
}

// Shapes large enough to run multi-threaded (the finite-difference checks above use 1 thread):
// the threaded backward must agree with the single-threaded one.
TEST(CpuThreadsTest, NormBackwardThreadedMatchesSingleThread) {
  const int N = 301, C = 96;
  auto x = RandVec(N * C, 78), w = RandVec(C, 79), b = RandVec(C, 80), dy = RandVec(N * C, 81);
  for (bool rms : {false, true}) {
    std::vector<std::vector<float>> dx(3), dw(3), db(3);
    int i = 0;
    for (int threads : {1, 2, 3}) {
      auto be = MakeCpuBackend(threads);
      std::vector<float> out(N * C), mean(N), rstd(N);
      dx[i].assign(N * C, 0.5f);
      dw[i].assign(C, 0.25f);
      db[i].assign(C, -0.25f);
      if (rms) {
        be->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
        be->RmsNormBackward(dx[i].data(), dw[i].data(), dy.data(), x.data(), w.data(), rstd.data(),
                            N, C);
      } else {
        be->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                             C, 1e-5f);
        be->LayerNormBackward(dx[i].data(), dw[i].data(), db[i].data(), dy.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), N, C);
      }
      ++i;
    }
    for (int j = 1; j < 3; ++j) {
      EXPECT_EQ(dx[j], dx[0]) << "per-row results do not depend on threads";
      ExpectClose(dw[j], ToDouble(dw[0]), 1e-5, 1e-5, "threaded dweight");
      ExpectClose(db[j], ToDouble(db[0]), 1e-5, 1e-5, "threaded dbias");
    }
  }
}

TEST_F(CpuOpsTest, AdamWMatchesHandComputation) {
  const int n = 100001;  // threaded
  auto p = RandVec(n, 81), g = RandVec(n, 82), m = RandVec(n, 83, -0.1f, 0.1f);
  auto v = RandVec(n, 84, 0.0f, 0.01f);
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  const int step = 3;
  const double bc1 = 1.0 - std::pow(double{b1}, step), bc2 = 1.0 - std::pow(double{b2}, step);
  std::vector<double> wp(n), wm(n), wv(n);
  for (int i = 0; i < n; ++i) {
    double gi = double{g[i]} * gs;
    double pi = p[i] * (1.0 - double{lr} * wd);
    wm[i] = b1 * double{m[i]} + (1.0 - b1) * gi;
    wv[i] = b2 * double{v[i]} + (1.0 - b2) * gi * gi;
    wp[i] = pi - double{lr} / bc1 * wm[i] / (std::sqrt(wv[i]) / std::sqrt(bc2) + eps);
  }
  be_->AdamW(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd,
             static_cast<float>(bc1), static_cast<float>(bc2), gs);
  // atol: one fp32 rounding of the O(0.1) and O(0.01) terms that partly cancel.
  ExpectClose(m, wm, 1e-6, 2e-8, "adamw m");
  ExpectClose(v, wv, 1e-6, 2e-9, "adamw v");
  ExpectClose(p, wp, 1e-6, 1e-7, "adamw p");
}

TEST(CpuThreadsTest, ResultsIndependentOfThreadCountWhereDocumented) {
  auto one = MakeCpuBackend(1), three = MakeCpuBackend(3);
  auto x = RandVec(300000, 91);
  EXPECT_EQ(one->SumSquares(x.data(), 300000), three->SumSquares(x.data(), 300000));
  std::vector<float> a(300000), b(300000);
  one->GeluForward(a.data(), x.data(), 300000);
  three->GeluForward(b.data(), x.data(), 300000);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace traind::engine
