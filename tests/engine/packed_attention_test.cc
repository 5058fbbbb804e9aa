// Attention over packed rows on the CPU backend (Backend::AttentionForward's doc_start: query i
// sees key j only when j >= doc_start[b*T + i]): against a double-precision reference, against
// each example run alone, and the key blocks of earlier examples (and padding) skipped, not only
// masked. Rope's positions: against the rotation at each position.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "packed_attention_util.h"

namespace traind::engine {
namespace {

using testing::AttentionIo;
using testing::PackedCase;

std::vector<PackedCase> Cases() {
  return {
      // examples crossing the 64-query blocks and 16-key panels, padding after the last one
      PackedCase{2, 70, 4, 2, 16, {{5, 30, 20, 15}, {64, 3}}},
      PackedCase{1, 200, 2, 1, 64, {{17, 50, 100, 33}}},
      // single-token examples, a row that is one example, GQA
      PackedCase{2, 150, 4, 1, 32, {{1, 1, 1, 80, 40}, {150}}},
      // a sliding window inside the examples
      PackedCase{1, 100, 2, 1, 16, {{30, 70}}, true, 20},
      // bidirectional: the example start bounds the past only (T >= 256: oneDNN's bf16 tiles)
      PackedCase{1, 40, 2, 2, 8, {{10, 30}}, false},
      PackedCase{1, 300, 2, 1, 64, {{100, 150}}, false},
  };
}

// fp32: within 2e-5 + 2e-4 |ref| of the double reference (cpu_attention_test's tolerance); bf16
// operands (the CPU's bf16 tiles where it has them) within 5e-2 + 5e-2 |ref| (a sanity bound:
// cpu_attention_test checks those tiles against the fp32 ones on rounded inputs).
TEST(PackedAttention, MatchesTheDoubleReference) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  for (const PackedCase& c : Cases()) {
    const std::vector<int32_t> ds = testing::DocStarts(c);
    AttentionIo ref = testing::RandomIo(c, 11);
    testing::ReferenceAttention(c, ds, &ref);
    for (DType operands : {DType::kF32, DType::kBF16}) {
      AttentionIo got = ref;
      testing::RunAttention(be.get(), c, ds, &got, operands);
      const double abs = operands == DType::kF32 ? 2e-5 : 5e-2;
      const double rel = operands == DType::kF32 ? 2e-4 : 5e-2;
      const std::string what = c.Name() + (operands == DType::kF32 ? " fp32" : " bf16");
      EXPECT_LE(testing::WorstRatio(got.out, ref.out, abs, rel), 1.0) << what << ": out";
      EXPECT_LE(testing::WorstRatio(got.lse, ref.lse, abs, rel), 1.0) << what << ": lse";
      EXPECT_LE(testing::WorstRatio(got.dq, ref.dq, abs, rel), 1.0) << what << ": dq";
      EXPECT_LE(testing::WorstRatio(got.dk, ref.dk, abs, rel), 1.0) << what << ": dk";
      EXPECT_LE(testing::WorstRatio(got.dv, ref.dv, abs, rel), 1.0) << what << ": dv";
    }
    // Without doc_start the same inputs give other outputs (the examples see each other).
    AttentionIo whole = ref;
    testing::RunAttention(be.get(), c, {}, &whole);
    EXPECT_GT(testing::WorstRatio(whole.out, ref.out, 2e-5, 2e-4), 1.0) << c.Name();
  }
}

// Each example of a packed row equals the example run alone as its own sequence (fp32, 1e-6).
TEST(PackedAttention, EachExampleEqualsItsOwnSequence) {
  for (int threads : {1, 2}) {
    std::unique_ptr<Backend> be = MakeCpuBackend(threads);
    for (const PackedCase& c : Cases()) {
      if (!c.causal) continue;  // bidirectional queries also see the later examples
      const std::vector<int32_t> ds = testing::DocStarts(c);
      AttentionIo packed = testing::RandomIo(c, 21);
      testing::RunAttention(be.get(), c, ds, &packed);
      const int64_t C = c.NH * c.HS, KC = c.NKV * c.HS;
      for (int64_t b = 0; b < c.B; ++b) {
        int64_t pos = 0;
        for (int64_t n : c.docs[static_cast<size_t>(b)]) {
          PackedCase one{1, n, c.NH, c.NKV, c.HS, {{n}}, true, c.window};
          AttentionIo alone;
          auto rows = [&](const std::vector<float>& v, int64_t width) {
            return std::vector<float>(v.begin() + (b * c.T + pos) * width,
                                      v.begin() + (b * c.T + pos + n) * width);
          };
          alone.q = rows(packed.q, C);
          alone.k = rows(packed.k, KC);
          alone.v = rows(packed.v, KC);
          alone.dout = rows(packed.dout, C);
          testing::RunAttention(be.get(), one, {}, &alone);
          const std::string what = c.Name() + " threads " + std::to_string(threads) +
                                   " example at " + std::to_string(pos);
          EXPECT_LE(testing::WorstRatio(rows(packed.out, C), alone.out, 1e-6, 0), 1.0) << what;
          EXPECT_LE(testing::WorstRatio(rows(packed.dq, C), alone.dq, 1e-6, 0), 1.0) << what;
          EXPECT_LE(testing::WorstRatio(rows(packed.dk, KC), alone.dk, 1e-6, 0), 1.0) << what;
          EXPECT_LE(testing::WorstRatio(rows(packed.dv, KC), alone.dv, 1e-6, 0), 1.0) << what;
          for (int64_t h = 0; h < c.NH; ++h) {
            for (int64_t i = 0; i < n; ++i) {
              EXPECT_NEAR(packed.lse[static_cast<size_t>((b * c.NH + h) * c.T + pos + i)],
                          alone.lse[static_cast<size_t>(h * n + i)], 1e-6)
                  << what << " head " << h << " query " << i;
            }
          }
          pos += n;
        }
      }
    }
  }
}

// A query block's tile starts at the first key of its earliest example (rounded down to 16):
// earlier keys are never read. NaN values (forward) or keys (backward) there leave the blocks
// whose queries all start later unchanged to the bit, which they would not if those keys were
// multiplied by their zero weights. Padding positions (their own examples) read nothing before
// their own block either.
TEST(PackedAttention, SkipsTheKeyBlocksOfEarlierExamplesAndPadding) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Skip {
    PackedCase c;
    int64_t poisoned;     // key rows [0, poisoned) set to NaN
    int64_t clean_from;   // the query rows from here on must not change
  };
  // Two examples of 100: the blocks from query 128 on start at key 96. One example of 20 then
  // padding: the blocks from query 64 on (padding only) start at their own first row.
  for (const Skip& s : {Skip{PackedCase{1, 256, 2, 1, 16, {{100, 156}}}, 96, 128},
                        Skip{PackedCase{1, 256, 2, 1, 16, {{20}}}, 20, 64}}) {
    const PackedCase& c = s.c;
    const std::vector<int32_t> ds = testing::DocStarts(c);
    for (DType operands : {DType::kF32, DType::kBF16}) {
      AttentionIo clean = testing::RandomIo(c, 31);
      testing::RunAttention(be.get(), c, ds, &clean, operands);
      const int64_t C = c.NH * c.HS, KC = c.NKV * c.HS;
      AttentionIo fwd = clean, bwd = clean;
      for (int64_t j = 0; j < s.poisoned * KC; ++j) fwd.v[static_cast<size_t>(j)] = nan;
      for (int64_t j = 0; j < s.poisoned * KC; ++j) bwd.k[static_cast<size_t>(j)] = nan;
      testing::RunAttention(be.get(), c, ds, &fwd, operands);
      testing::RunAttention(be.get(), c, ds, &bwd, operands, &clean);  // clean out and lse
      const std::string what = c.Name() + (operands == DType::kF32 ? " fp32" : " bf16");
      int64_t differ_out = 0, differ_dq = 0;
      for (int64_t r = s.clean_from * C; r < c.T * C; ++r) {
        const auto i = static_cast<size_t>(r);
        differ_out += !(fwd.out[i] == clean.out[i]);
        differ_dq += !(bwd.dq[i] == clean.dq[i]);
      }
      EXPECT_EQ(differ_out, 0) << what << ": forward read values of skipped keys";
      EXPECT_EQ(differ_dq, 0) << what << ": backward read keys of skipped blocks";
      // The poison does reach the queries that may see it (the test can fail).
      EXPECT_TRUE(std::isnan(fwd.out[0])) << what;
    }
  }
}

// Rope with positions: row r rotated by the angle of positions[r] (what the unpacked call gives at
// that position), pos_offset ignored; inverse undoes it.
TEST(PackedAttention, RopePositionsRotateEachRowByItsOwnPosition) {
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  const int64_t B = 2, T = 12, heads = 3, HS = 8, stride = heads * HS + 2;
  const std::vector<float> x = testing::RandomFloats(static_cast<size_t>(B * T * stride), 41);
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>((r * 5) % 7);
  std::vector<float> got = x;
  be->Rope(got.data(), B, T, heads, HS, stride, 10000.0f, false, /*pos_offset=*/9, RopeScaling{},
           pos.data());
  for (int64_t r = 0; r < B * T; ++r) {
    // The same row alone (B = 1, T = 1) at pos_offset positions[r].
    std::vector<float> row(x.begin() + r * stride, x.begin() + (r + 1) * stride);
    be->Rope(row.data(), 1, 1, heads, HS, stride, 10000.0f, false, pos[static_cast<size_t>(r)]);
    for (int64_t e = 0; e < stride; ++e) {
      EXPECT_EQ(got[static_cast<size_t>(r * stride + e)], row[static_cast<size_t>(e)])
          << "row " << r << " element " << e;
    }
  }
  be->Rope(got.data(), B, T, heads, HS, stride, 10000.0f, true, 0, RopeScaling{}, pos.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], x[i], 1e-6) << i;
}

}  // namespace
}  // namespace traind::engine
