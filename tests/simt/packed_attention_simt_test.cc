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

// Conversations of unequal lengths, rendered with a plain template.
std::string Conversations(int n) {
  std::string out;
  const char* words[] = {"red", "green", "blue", "cat", "dog", "sun", "moon", "tree"};
  for (int i = 0; i < n; ++i) {
    std::string a;
    for (int k = 0; k <= (i * 7) % 9; ++k) a += std::string(k ? " " : "") + words[(i + k) % 8];
    out += std::string(R"({"messages":[{"role":"user","content":")") + words[i % 8] +
           R"("},{"role":"assistant","content":")" + a + "\"}]}\n";
  }
  return out;
}

struct TrainRun {
  std::vector<double> losses;
  SafetensorsFile weights;
};

TrainRun Train(JobSpec spec, const std::string& device) {
  spec.output_dir += "_" + device;
  RunOptions o = testing::TestRunOptions(1);
  o.device.device = device;
  TrainRun out;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { out.losses.push_back(r.loss); };
  auto r = RunJob(spec, o, cb);
  EXPECT_TRUE(r.ok()) << device << ": " << r.status().ToString();
  if (!r.ok()) return out;
  auto w = ReadSafetensors(spec.output_dir + "/model.safetensors");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (w.ok()) out.weights = std::move(w).value();
  return out;
}

TEST(PackedAttentionSimt, PackedRunJobMatchesCpu) {
  RegisterGpuBackends();
  const std::string dir = testing::MakeTempDir("simt_packed");
  {
    std::ofstream(dir + "/chat.jsonl") << Conversations(20);
    std::ofstream(dir + "/t.jinja")
        << "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}";
  }
  for (const std::string arch : {"gpt2", "llama"}) {
    JobSpec spec = testing::TinySpec(dir + "/" + arch, dir + "/chat.jsonl");
    if (arch == "llama") spec.model.config = testing::TinyLlama(/*tied=*/false);
    spec.model.config.vocab_size = 256;
    spec.model.config.n_positions = 64;
    spec.model.config.max_position_embeddings = 64;
    spec.data.format = "jsonl";
    spec.data.tokenizer = "byte";
    spec.data.chat_template = dir + "/t.jinja";
    spec.data.assistant_only_loss = true;
    spec.data.packing = true;
    spec.data.seq_len = 64;
    spec.data.validation_split = 0.0;
    spec.training.max_steps = 3;
    spec.training.per_device_train_batch_size = 2;
    spec.training.gradient_accumulation_steps = 2;
    spec.training.eval_steps = 0;
    spec.training.save_steps = 0;
    // SGD: weights follow the gradients linearly (AdamW would turn gpt2's key-bias gradients,
    // zero up to rounding, into steps of about lr that differ between backends).
    spec.training.optim = "sgd";
    spec.training.learning_rate = 0.1;
    spec.training.max_grad_norm = 0.0;
    spec.training.weight_decay = 0.0;
    spec.training.warmup_steps = 0;
    spec.training.lr_scheduler_type = "constant";
    const TrainRun cpu = Train(spec, "cpu");
    const TrainRun dev = Train(spec, testing::kDeviceUnderTest);
    ASSERT_EQ(cpu.losses.size(), 3u) << arch;
    ASSERT_EQ(dev.losses.size(), 3u) << arch;
    for (size_t s = 0; s < 3; ++s) {
      std::printf("[simt-packed] %s step %zu: cpu %.9f simt %.9f\n", arch.c_str(), s + 1,
                  cpu.losses[s], dev.losses[s]);
      EXPECT_NEAR(dev.losses[s], cpu.losses[s], 1e-5 * cpu.losses[s]) << arch << " step " << s + 1;
    }
    double worst = 0.0;
    for (const auto& [name, t] : cpu.weights.tensors) {
      auto it = dev.weights.tensors.find(name);
      ASSERT_NE(it, dev.weights.tensors.end()) << name;
      auto a = it->second.ToF32();
      auto b = t.ToF32();
      ASSERT_TRUE(a.ok() && b.ok()) << name;
      double diff = 0.0, scale = 0.0;
      for (size_t i = 0; i < b->size(); ++i) {
        diff = std::max(diff, std::abs(double((*a)[i]) - (*b)[i]));
        scale = std::max(scale, std::abs(double((*b)[i])));
      }
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    std::printf("[simt-packed] %s: worst weight max|diff|/max|w| %.3g\n", arch.c_str(), worst);
    EXPECT_LE(worst, 1e-5) << arch;
  }
}

}  // namespace
}  // namespace traind::engine
