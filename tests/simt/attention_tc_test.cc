// The tensor-core attention (backend/cuda/attention_tc.cu) and the emulation of the warp-level
// instructions it uses (backend/simt/simt_tc.h through backend/cuda/tc_ops.cuh), under simt:
//  - mma.sync m16n8k16 with fragments loaded per the PTX ISA tables, and through ldmatrix (.x4,
//    .x2 .trans, .x1), against a double-precision matrix product (bf16 and fp16);
//  - cp.async: nothing lands before its wait_group, zero fill for invalid sources;
//  - forward and backward against the CPU backend's fp32 AttentionForward/Backward on the same
//    16-bit-rounded inputs (and against a double-precision reference, which also covers the
//    packed-example mask doc_start): every mask kind, head dims 64/80/96/128/256, bf16 and fp16,
//    GQA, T not a multiple of any tile, strided fused-qkv rows (the cases, inputs and reference in
//    attention_tc_cases.h, shared with gpu_attention_tc_test on a real GPU);
//  - a planted fragment-layout mistake in the emulation makes the kernel's output wrong and the
//    comparison fails.
#include "backend/cuda/attention_tc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_compat.h"
#include "backend/cuda/tc_ops.cuh"
#include "attention_tc_cases.h"
#include "core/half.h"

namespace traind::engine::gpu {
namespace {

using namespace ::traind::engine::attention_tc_cases;  // NOLINT(build/namespaces)

// ---------------------------------------------------------------- the emulated instructions
// One warp computes D = A B + C (A 16x16 row-major, B 16x8 stored k-major [k][n], C 16x8) with
// the fragments loaded: mode 0 straight from global memory per the PTX ISA's tables; mode 1 from
// shared memory with ldmatrix.x4 (A) and ldmatrix.x2.trans (B); mode 2 with A by ldmatrix.x4 and B
// stored n-major ([n][k]) by two ldmatrix.x1.
template <typename T16>
__global__ void mma_probe_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D,
                                 int mode) {
  __shared__ __align__(16) uint16_t sA[16 * 16];
  __shared__ __align__(16) uint16_t sB[16 * 8];
  __shared__ __align__(16) uint16_t sBt[8 * 16];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 256; i += 32) sA[i] = A[i];
  for (int i = lane; i < 128; i += 32) {
    sB[i] = B[i];
    sBt[(i % 8) * 16 + i / 8] = B[i];  // [n][k]
  }
  __syncwarp();
  auto pack = [](uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); };
  uint32_t a[4], b[2];
  if (mode == 0) {
    a[0] = pack(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
    a[1] = pack(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
    a[2] = pack(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
    a[3] = pack(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
    b[0] = pack(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    b[1] = pack(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
  } else {
    tc::Ldmatrix4<false>(a, sA + (lane & 15) * 16 + (lane >> 4) * 8);
    if (mode == 1) {
      tc::Ldmatrix2<true>(b, sB + (lane & 15) * 8);
    } else {
      tc::Ldmatrix1<false>(b, sBt + (lane & 7) * 16);
      tc::Ldmatrix1<false>(b + 1, sBt + (lane & 7) * 16 + 8);
    }
  }
  float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                C[(g + 8) * 8 + 2 * t + 1]};
  tc::Mma<T16>(d, a, b);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// Largest |D - (A B + C)| over the tile, the product in double, relative to sum |terms|.
double MmaProbeError(DType type, int mode, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> A(256), B(128);
  std::vector<float> C(128), D(128, NAN);
  for (auto& x : A) x = To16(nd(rng), type);
  for (auto& x : B) x = To16(nd(rng), type);
  for (auto& x : C) x = nd(rng);
  const Status st = type == DType::kBF16
                        ? GPU_LAUNCH((mma_probe_kernel<__nv_bfloat16>), 1, 32, 0, nullptr, A.data(),
                                     B.data(), C.data(), D.data(), mode)
                        : GPU_LAUNCH((mma_probe_kernel<__half>), 1, 32, 0, nullptr, A.data(),
                                     B.data(), C.data(), D.data(), mode);
  EXPECT_TRUE(st.ok()) << st.ToString();
  double worst = 0.0;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double ref = C[m * 8 + n], mag = std::fabs(ref);
      for (int k = 0; k < 16; ++k) {
        const double p = double{From16(A[m * 16 + k], type)} * From16(B[k * 8 + n], type);
        ref += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(D[m * 8 + n] - ref) / mag);
    }
  return worst;
}

// Resets the planted layout fault however a test ends.
struct FaultGuard {
  explicit FaultGuard(simt::tc::LayoutFault f) { simt::tc::SetLayoutFault(f); }
  ~FaultGuard() { simt::tc::SetLayoutFault(simt::tc::LayoutFault::kNone); }
};

TEST(SimtTensorCore, MmaAndLdmatrixMatchAMatrixProduct) {
  for (DType type : {DType::kBF16, DType::kF16})
    for (int mode = 0; mode < 3; ++mode)
      for (uint64_t seed = 1; seed <= 3; ++seed)
        // One fp32 rounding of the exact sum: relative error <= 2^-24 of the magnitude.
        EXPECT_LE(MmaProbeError(type, mode, seed), 1e-7)
            << "type " << static_cast<int>(type) << " mode " << mode << " seed " << seed;
}

TEST(SimtTensorCore, PlantedLayoutFaultsBreakTheProduct) {
  {
    FaultGuard fault(simt::tc::LayoutFault::kMmaASwap);
    EXPECT_GT(MmaProbeError(DType::kBF16, 0, 1), 1e-2);
  }
  {
    FaultGuard fault(simt::tc::LayoutFault::kLdmatrixTrans);
    EXPECT_GT(MmaProbeError(DType::kBF16, 1, 1), 1e-2);  // the .trans load of B
    EXPECT_LE(MmaProbeError(DType::kBF16, 2, 1), 1e-7);  // no .trans used
  }
}

// Thread i copies 16 bytes (or zero-fills them when i is odd) into dynamic shared memory and
// reads the first float before and after the wait.
__global__ void cp_async_probe_kernel(const float* src, float* before, float* after) {
  GPU_DYNAMIC_SHARED(float, s);
  const int i = threadIdx.x;
  tc::CpAsync16(s + 4 * i, src + 4 * i, i % 2 == 0);
  tc::CpAsyncCommit();
  before[i] = s[4 * i];
  tc::CpAsyncWait<0>();
  after[i] = s[4 * i];
}

// Each copy lands at once or at its wait (drawn from the seed): before the wait a thread reads
// either the old contents (NaN: fresh dynamic shared memory) or the copied value; after it, always
// the copied value.
TEST(SimtTensorCore, CpAsyncLandsByTheWait) {
  std::vector<float> src(4 * 32), before(32), after(32);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 1.0f;
  int stale = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    simt::SetSeed(seed);
    ASSERT_TRUE(GPU_LAUNCH(cp_async_probe_kernel, 1, 32, 4 * 32 * sizeof(float), nullptr,
                           src.data(), before.data(), after.data())
                    .ok());
    for (int i = 0; i < 32; ++i) {
      const float want = i % 2 == 0 ? src[4 * i] : 0.0f;
      EXPECT_TRUE(std::isnan(before[i]) || before[i] == want) << i;
      stale += std::isnan(before[i]) ? 1 : 0;
      EXPECT_EQ(after[i], want) << i;
    }
  }
  simt::SetSeed(1);
  EXPECT_GT(stale, 16);  // about half of the 96 copies land only at the wait
  EXPECT_LT(stale, 80);
}

// ---------------------------------------------------------------- attention
// The tensor-core kernels under simt; outputs widened to fp32.
Grads TensorCore(const Case& c, const Inputs& in) {
  const int64_t rows = c.B * c.T, ld = c.NH * c.HS;
  AttentionTcMasks masks;
  masks.causal = c.causal;
  masks.key_mask = in.key_mask.empty() ? nullptr : in.key_mask.data();
  masks.window = c.window;
  masks.doc_start = in.doc_start.empty() ? nullptr : in.doc_start.data();
  std::vector<uint16_t> out16(rows * ld, 0xFFFF);
  Grads r;
  r.lse.assign(c.B * c.NH * c.T, NAN);
  const uint16_t* q = in.qkv16.data();
  const uint16_t* k = q + c.NH * c.HS;
  const uint16_t* v = q + (c.NH + c.NKV) * c.HS;
  Status st = AttentionTcForward(out16.data(), r.lse.data(), q, k, v, c.type, c.B, c.T, c.NH, c.NKV,
                                 c.HS, in.row, in.row, masks, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<uint16_t> dqkv16(rows * in.row, To16(kSentinel, c.type));
  std::vector<float> scratch(AttentionTcBackwardScratchFloats(c.B, c.T, c.NH, c.HS), NAN);
  uint16_t* dq = dqkv16.data();
  st = AttentionTcBackward(dq, dq + c.NH * c.HS, dq + (c.NH + c.NKV) * c.HS, in.dout16.data(),
                           out16.data(), r.lse.data(), q, k, v, c.type, c.B, c.T, c.NH, c.NKV, c.HS,
                           in.row, in.row, masks, scratch.data(), nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  r.out.resize(out16.size());
  for (size_t i = 0; i < out16.size(); ++i) r.out[i] = From16(out16[i], c.type);
  r.dqkv.resize(dqkv16.size());
  for (size_t i = 0; i < dqkv16.size(); ++i) r.dqkv[i] = From16(dqkv16[i], c.type);
  return r;
}

class AttentionTc : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTc, MatchesCpuBackend) { ExpectMatches(GetParam(), TensorCore); }

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTc, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });
INSTANTIATE_TEST_SUITE_P(Long, AttentionTc, ::testing::ValuesIn(kLongCases),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

// A kernel written against a wrong fragment layout gives wrong attention, and the comparison above
// catches it: the emulation reads A's registers 1 and 2 swapped, or ignores .trans.
TEST(AttentionTcPlantedFault, WrongFragmentLayoutIsCaught) {
  const Case c = kCases[0];
  const Inputs in = MakeInputs(c, 99);
  const Grads ref = Reference(c, in);
  for (auto fault : {simt::tc::LayoutFault::kMmaASwap, simt::tc::LayoutFault::kLdmatrixTrans}) {
    FaultGuard guard(fault);
    const Grads tc = TensorCore(c, in);
    const double e_out = RelErr(tc.out, ref.out), e_grad = RelErr(tc.dqkv, ref.dqkv);
    std::printf("[ fault %d ] out %.2e  dqkv %.2e\n", static_cast<int>(fault), e_out, e_grad);
    EXPECT_GT(e_out, 10 * OutTol(c.type)) << "fault " << static_cast<int>(fault);
    EXPECT_GT(e_grad, 10 * GradTol(c.type)) << "fault " << static_cast<int>(fault);
  }
}

// The simt backend's AttentionForward/Backward with operand_type bf16 (a 16-bit job) on fp32
// tensors: routed to the tensor-core kernels through the fp32 boundary (gpu_backend.cc), so they
// match the reference within the bf16 bounds, leave the padding columns alone, and the planted
// layout fault shows in their output (the fp32 kernels would not notice it).
Grads SimtBackend(const Case& c, const Inputs& in) {
  auto made = MakeSimtBackend(1);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  Backend& be = **made;
  const int64_t rows = c.B * c.T, ld = c.NH * c.HS;
  auto up = [&](const std::vector<float>& h) {
    float* d = static_cast<float*>(be.Alloc(h.size() * sizeof(float)));
    be.CopyHostToDevice(d, h.data(), h.size() * sizeof(float));
    return d;
  };
  auto down = [&](const float* d, size_t n) {
    std::vector<float> h(n);
    be.CopyDeviceToHost(h.data(), d, n * sizeof(float));
    return h;
  };
  float* qkv = up(in.qkv);
  float* dqkv = up(std::vector<float>(rows * in.row, kSentinel));
  float* out = up(std::vector<float>(rows * ld, NAN));
  float* lse = up(std::vector<float>(c.B * c.NH * c.T, NAN));
  float* dout = up(in.dout);
  int32_t* km = nullptr;
  if (!in.key_mask.empty()) {
    km = static_cast<int32_t*>(be.Alloc(in.key_mask.size() * sizeof(int32_t)));
    be.CopyHostToDevice(km, in.key_mask.data(), in.key_mask.size() * sizeof(int32_t));
  }
  const int64_t ko = c.NH * c.HS, vo = (c.NH + c.NKV) * c.HS;
  be.AttentionForward(out, lse, qkv, qkv + ko, qkv + vo, c.B, c.T, c.NH, c.NKV, c.HS, in.row,
                      in.row, c.causal, km, c.type, c.window);
  be.AttentionBackward(dqkv, dqkv + ko, dqkv + vo, dout, out, lse, qkv, qkv + ko, qkv + vo, c.B,
                       c.T, c.NH, c.NKV, c.HS, in.row, in.row, c.causal, km, c.type, c.window);
  EXPECT_TRUE(be.status().ok()) << be.status().ToString();
  Grads r{down(out, rows * ld), down(lse, c.B * c.NH * c.T), down(dqkv, rows * in.row)};
  for (void* p : {static_cast<void*>(qkv), static_cast<void*>(dqkv), static_cast<void*>(out),
                  static_cast<void*>(lse), static_cast<void*>(dout), static_cast<void*>(km)})
    if (p != nullptr) be.Free(p);
  return r;
}

TEST(AttentionTcBackend, SimtBackendRoutesSixteenBitAttentionToTensorCores) {
  for (const Case& c : {kCases[0], kCases[3]}) {  // bf16 causal GQA; fp16 BERT key mask
    const Inputs in = MakeInputs(c, 5);
    const Grads ref = Reference(c, in);
    const Grads be = SimtBackend(c, in);
    const double e_out = RelErr(be.out, ref.out), e_grad = RelErr(be.dqkv, ref.dqkv);
    std::printf("[ backend %s ] out %.2e  lse %.2e  dqkv %.2e\n", c.name, e_out,
                MaxAbsErr(be.lse, ref.lse), e_grad);
    EXPECT_LE(e_out, OutTol(c.type)) << c.name;
    EXPECT_LE(MaxAbsErr(be.lse, ref.lse), kLseTol) << c.name;
    EXPECT_LE(e_grad, GradTol(c.type)) << c.name;
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t d = (c.NH + 2 * c.NKV) * c.HS; d < in.row; ++d)
        ASSERT_EQ(be.dqkv[r * in.row + d], kSentinel) << "row " << r << " col " << d;
    FaultGuard fault(simt::tc::LayoutFault::kMmaASwap);
    EXPECT_GT(RelErr(SimtBackend(c, in).out, ref.out), 10 * OutTol(c.type)) << c.name;
  }
}

TEST(AttentionTcArgs, BadInputIsOneClearError) {
  uint16_t buf[64] __attribute__((aligned(16))) = {};
  float lse[4];
  const Status st = AttentionTcForward(buf, lse, buf, buf, buf, DType::kBF16, 1, 1, 1, 1, 72, 72,
                                       72, AttentionTcMasks{}, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("head size 72"), std::string::npos) << st.ToString();
  const Status f32 = AttentionTcForward(buf, lse, buf, buf, buf, DType::kF32, 1, 1, 1, 1, 64, 64,
                                        64, AttentionTcMasks{}, nullptr);
  EXPECT_NE(f32.ToString().find("bf16 or fp16"), std::string::npos) << f32.ToString();
}

}  // namespace
}  // namespace traind::engine::gpu
