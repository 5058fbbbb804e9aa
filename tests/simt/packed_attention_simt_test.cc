// Packed rows on the device under test (simt: the CUDA kernels on the CPU) against the CPU
// backend: attention with doc_start (forward and backward, the cases of
// tests/engine/packed_attention_test.cc), Rope with positions, and a RunJob with data.packing
// (tiny gpt2 and llama, fp32): step losses and final weights within 1e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../engine/job_run_util.h"
#include "../engine/model_test_util.h"
#include "../engine/packed_attention_util.h"
#include "../engine/trainer_test_util.h"
#include "backend/device_registry.h"
#include "core/safetensors.h"
#include "device_under_test.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

using testing::AttentionIo;
using testing::PackedCase;

// fp32 attention on the device against the CPU's: 2e-5 + 2e-4 |cpu| (backend_ops_test's
// attention tolerance: other summation orders over T).
TEST(PackedAttentionSimt, AttentionMatchesCpu) {
  auto dev = testing::MakeDeviceUnderTest();
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  for (const PackedCase& c : {
           PackedCase{2, 70, 4, 2, 16, {{5, 30, 20, 15}, {64, 3}}},
           PackedCase{1, 200, 2, 1, 64, {{17, 50, 100, 33}}},
           PackedCase{2, 150, 4, 1, 32, {{1, 1, 1, 80, 40}, {150}}},
           PackedCase{1, 100, 2, 1, 16, {{30, 70}}, true, 20},
           PackedCase{1, 40, 2, 2, 8, {{10, 30}}, false},
           PackedCase{1, 90, 1, 1, 160, {{40, 45}}},  // HS > 128: the one-thread-per-row kernels
       }) {
    const std::vector<int32_t> ds = testing::DocStarts(c);
    AttentionIo want = testing::RandomIo(c, 11), got = want;
    testing::RunAttention(cpu.get(), c, ds, &want);
    testing::RunAttention(dev->get(), c, ds, &got);
    ASSERT_TRUE((*dev)->status().ok()) << (*dev)->status().ToString();
    const std::string what = c.Name();
    EXPECT_LE(testing::WorstRatio(got.out, want.out, 2e-5, 2e-4), 1.0) << what << ": out";
    EXPECT_LE(testing::WorstRatio(got.lse, want.lse, 2e-5, 2e-4), 1.0) << what << ": lse";
    EXPECT_LE(testing::WorstRatio(got.dq, want.dq, 2e-5, 2e-4), 1.0) << what << ": dq";
    EXPECT_LE(testing::WorstRatio(got.dk, want.dk, 2e-5, 2e-4), 1.0) << what << ": dk";
    EXPECT_LE(testing::WorstRatio(got.dv, want.dv, 2e-5, 2e-4), 1.0) << what << ": dv";
    // And against the double reference directly (the CPU could be wrong the same way).
    AttentionIo ref = want;
    testing::ReferenceAttention(c, ds, &ref);
    EXPECT_LE(testing::WorstRatio(got.out, ref.out, 2e-5, 2e-4), 1.0) << what << ": out vs double";
    EXPECT_LE(testing::WorstRatio(got.dk, ref.dk, 2e-5, 2e-4), 1.0) << what << ": dk vs double";
  }
}

TEST(PackedAttentionSimt, RopePositionsMatchCpu) {
  auto dev = testing::MakeDeviceUnderTest();
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  const int64_t B = 2, T = 19, heads = 3, HS = 16, stride = heads * HS + 4;
  const std::vector<float> x = testing::RandomFloats(static_cast<size_t>(B * T * stride), 5);
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % 11);
  for (bool inverse : {false, true}) {
    std::vector<float> want = x;
    cpu->Rope(want.data(), B, T, heads, HS, stride, 10000.0f, inverse, 3, RopeScaling{}, pos.data());
    Backend& d = **dev;
    float* xd = static_cast<float*>(d.Alloc(x.size() * sizeof(float)));
    int32_t* pd = static_cast<int32_t*>(d.Alloc(pos.size() * sizeof(int32_t)));
    d.CopyHostToDevice(xd, x.data(), x.size() * sizeof(float));
    d.CopyHostToDevice(pd, pos.data(), pos.size() * sizeof(int32_t));
    d.Rope(xd, B, T, heads, HS, stride, 10000.0f, inverse, 3, RopeScaling{}, pd);
    std::vector<float> got(x.size());
    d.CopyDeviceToHost(got.data(), xd, got.size() * sizeof(float));
    d.Synchronize();
    d.Free(xd);
    d.Free(pd);
    ASSERT_TRUE(d.status().ok()) << d.status().ToString();
    EXPECT_LE(testing::WorstRatio(got, want, 1e-6, 1e-5), 1.0) << "inverse " << inverse;
  }
}

TEST(PackedAttentionSimt, PackedRunJobMatchesCpu) {
  RegisterGpuBackends();
  const std::string dir = testing::MakeTempDir("simt_packed");
  testing::WriteChatFiles(dir, 20);
  for (const std::string arch : {"gpt2", "llama"}) {
    JobSpec spec =
        testing::ChatJobSpec(dir, dir + "/chat.jsonl", dir + "/t.jinja", /*seq_len=*/64);
    spec.output_dir = dir + "/" + arch + "/out";
    if (arch == "llama") spec.model.config = testing::TinyLlama(/*tied=*/false);
    spec.model.config.vocab_size = 256;
    spec.model.config.n_positions = 64;
    spec.model.config.max_position_embeddings = 64;
    spec.data.packing = true;
    spec.data.shuffle = true;  // TinySpec's order
    spec.training.per_device_train_batch_size = 2;
    spec.training.gradient_accumulation_steps = 2;
    spec.training.logging_steps = 2;
    // ChatJobSpec's plain SGD: weights follow the gradients linearly (AdamW would turn gpt2's
    // key-bias gradients, zero up to rounding, into steps of about lr that differ between
    // backends).
    const testing::JobOutcome cpu = testing::RunJobOn(spec, "cpu", "cpu");
    const testing::JobOutcome dev =
        testing::RunJobOn(spec, testing::kDeviceUnderTest, testing::kDeviceUnderTest);
    ASSERT_EQ(cpu.losses.size(), 3u) << arch;
    ASSERT_EQ(dev.losses.size(), 3u) << arch;
    for (size_t s = 0; s < 3; ++s) {
      std::printf("[simt-packed] %s step %zu: cpu %.9f simt %.9f\n", arch.c_str(), s + 1,
                  cpu.losses[s], dev.losses[s]);
      EXPECT_NEAR(dev.losses[s], cpu.losses[s], 1e-5 * cpu.losses[s]) << arch << " step " << s + 1;
    }
    const double worst = testing::WorstScaledWeightDiff(dev.weights, cpu.weights);
    std::printf("[simt-packed] %s: worst weight max|diff|/max|w| %.3g\n", arch.c_str(), worst);
    EXPECT_LE(worst, 1e-5) << arch;
  }
}

}  // namespace
}  // namespace traind::engine
