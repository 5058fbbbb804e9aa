// Parity of the gpt2 and llama models with an independent PyTorch reference
// (tests/engine/reference/model_reference.py, written from torch primitives): from the same
// weights and tokens, the loss and every parameter gradient (fp32 engine) against float64 torch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

using nlohmann::json;

json ConfigJson(const ModelConfig& c) {
  if (c.arch == Arch::kGpt2) {
    return {{"vocab_size", c.vocab_size}, {"n_positions", c.n_positions},
            {"n_embd", c.n_embd},         {"n_layer", c.n_layer},
            {"n_head", c.n_head},         {"layer_norm_epsilon", c.layer_norm_epsilon}};
  }
  json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_size()},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"max_position_embeddings", c.max_position_embeddings},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"sliding_window", c.sliding_window}};
  const ModelConfig::RopeScaling& rs = c.rope_scaling;
  if (rs.rope_type != "default") {
    j["rope_scaling"] = {{"rope_type", rs.rope_type},
                         {"factor", rs.factor},
                         {"low_freq_factor", rs.low_freq_factor},
                         {"high_freq_factor", rs.high_freq_factor},
                         {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  }
  return j;
}

// Tolerances: norm-wise ||ours - ref|| / ||ref|| <= 1e-5 per tensor (the bar), and
// elementwise |ours - ref| <= 1e-4 |ref| + 1e-5 max|ref| (an absolute floor for tiny entries).
constexpr double kRelTol = 1e-5;

// One engine run whose weights, tokens, loss and gradients wait for the reference.
struct ParityCase {
  ModelConfig config;
  double loss = 0;
  SafetensorsFile grads;
  std::string dir;
};

// Runs the engine (fp32) and writes the case for the reference script into `dir`.
void Prepare(ParityCase* pc, uint64_t seed) {
  const ModelOptions opt = TinyOptions(3, 16);
  TestModel t = TestModel::Make(pc->config, opt);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(seed);
  // 4x the 0.02 init: activations well inside the nonlinear ranges of GELU/SiLU and attention
  // far from uniform, so a wrong nonlinearity or GQA mapping shows up clearly.
  t.backend->Scale(m.param_data(), 4.0f, m.num_params());
  // Biases start at zero: give the attention biases (qwen2, llama attention_bias) values, so a
  // bias added to the wrong rows shows in the loss and not only in its own gradient.
  for (const ParamInfo& p : m.params()) {
    if (p.hf_name.find("self_attn.") == std::string::npos ||
        p.hf_name.size() < 5 || p.hf_name.compare(p.hf_name.size() - 5, 5, ".bias") != 0) {
      continue;
    }
    for (int64_t i = 0; i < p.numel; ++i) {
      m.param_data()[p.offset + i] = 0.3f * std::sin(0.7f * static_cast<float>(i + p.offset));
    }
  }
  // qwen3 and gemma: norm weights that differ per channel (gemma's start at zero: 1 + w = 1), so
  // a weight read at the wrong offset, or w where 1 + w belongs, shows. qwen3's q_norm / k_norm
  // around 1, not 4: a per-head norm of 4 makes every score |q||k|/sqrt(HS) = 16 sqrt(HS), a
  // saturated softmax whose gradients torch's own fp32 misses by 1.3e-5.
  if (pc->config.arch == Arch::kQwen3 || pc->config.arch == Arch::kGemma) {
    for (const ParamInfo& p : m.params()) {
      const std::string suffix = "norm.weight";
      if (p.hf_name.size() < suffix.size() ||
          p.hf_name.compare(p.hf_name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      const bool qk = p.hf_name.find("q_norm") != std::string::npos ||
                      p.hf_name.find("k_norm") != std::string::npos;
      for (int64_t i = 0; i < p.numel; ++i) {
        float& w = m.param_data()[p.offset + i];
        w = (qk ? 1.0f : w) + 0.5f * std::sin(1.3f * static_cast<float>(i + p.offset));
      }
    }
  }
  m.ParamsChanged();
  const Batch batch = MakeBatch(opt.micro_batch * opt.seq_len, pc->config.vocab_size, 1234);
  SetBatch(t, batch);
  m.ZeroGrad();
  pc->loss = m.Forward(/*for_backward=*/true, /*grad_scale=*/1.0f);
  m.Backward();
  pc->grads = GradsAsHf(t);
  ASSERT_TRUE(WriteSafetensors(pc->dir + "/model.safetensors", m.ExportHf()).ok());
  json c = {{"arch", ArchName(pc->config.arch)}, {"config", ConfigJson(pc->config)},
            {"B", opt.micro_batch},    {"T", opt.seq_len},
            {"ids", batch.ids},        {"targets", batch.targets}};
  std::ofstream(pc->dir + "/case.json") << c.dump();
}

void Check(const ParityCase& pc) {
  const std::string label =
      std::string(ArchName(pc.config.arch)) + (pc.config.tied_embeddings() ? " tied" : " untied");
  SCOPED_TRACE(label);
  json ref;
  std::ifstream(pc.dir + "/ref.json") >> ref;
  const double loss64 = ref["loss_f64"].get<double>();
  const double loss32 = ref["loss_f32"].get<double>();
  EXPECT_NEAR(pc.loss, loss64, kRelTol * std::abs(loss64)) << "loss";
  std::printf("[%s] loss ours %.9f torch-f64 %.9f torch-f32 %.9f (rel %.2e)\n", label.c_str(),
              pc.loss, loss64, loss32, std::abs(pc.loss - loss64) / loss64);

  auto r64 = ReadSafetensors(pc.dir + "/ref_f64.safetensors");
  auto r32 = ReadSafetensors(pc.dir + "/ref_f32.safetensors");
  ASSERT_TRUE(r64.ok() && r32.ok());
  EXPECT_EQ(r64->tensors.size(), pc.grads.tensors.size()) << "tensor count (HF names) differs";
  double worst = 0, worst_torch32 = 0;
  std::string worst_name;
  for (const auto& [name, ref_t] : r64->tensors) {
    auto it = pc.grads.tensors.find(name);
    ASSERT_NE(it, pc.grads.tensors.end()) << "engine has no gradient for " << name;
    ASSERT_EQ(it->second.shape, ref_t.shape) << name;
    std::vector<float> ours = it->second.ToF32().value();
    std::vector<float> want = ref_t.ToF32().value();
    std::vector<float> torch32 = r32->tensors.at(name).ToF32().value();
    const double rel = RelErr(ours, want);
    EXPECT_LE(rel, kRelTol) << name << ": norm-wise relative error";
    double maxref = 0;
    for (float v : want) maxref = std::max(maxref, double(std::abs(v)));
    for (size_t i = 0; i < ours.size(); ++i) {
      const double tol = 1e-4 * std::abs(want[i]) + 1e-5 * maxref;
      if (std::abs(double(ours[i]) - want[i]) > tol) {
        ADD_FAILURE() << name << "[" << i << "]: ours " << ours[i] << " ref " << want[i];
        break;
      }
    }
    if (rel > worst) worst = rel, worst_name = name;
    worst_torch32 = std::max(worst_torch32, RelErr(torch32, want));
  }
  std::printf("[%s] worst gradient rel err over %zu tensors: ours %.2e (%s), torch-f32 %.2e\n",
              label.c_str(), r64->tensors.size(), worst, worst_name.c_str(), worst_torch32);
}

// gpt2, llama with GQA and untied embeddings, llama with GQA and tied embeddings; one Python
// start for all three (torch's import dominates the test's time).
TEST(ModelParity, Gpt2AndLlamaMatchTorch) {
  if (!PythonTorchAvailable()) {
    GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON
                 << " cannot import torch; install python3-torch (./run.sh does) to run parity";
  }
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::vector<ParityCase> cases(3);
  cases[0].config = TinyGpt2();
  cases[1].config = TinyLlama(/*tied=*/false);
  cases[2].config = TinyLlama(/*tied=*/true);
  std::string dirs;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].dir = dir.path + "/case" + std::to_string(i);
    std::filesystem::create_directory(cases[i].dir);
    Prepare(&cases[i], 7 + i);
    if (HasFatalFailure()) return;
    dirs += " " + cases[i].dir;
  }
  ASSERT_TRUE(RunReference("model_reference.py", dirs)) << "reference script failed";
  for (const ParityCase& pc : cases) Check(pc);
}

// The llama-like families and llama's variants (TinyFamily): qwen2's q/k/v biases, mistral's
// sliding window (5 < T = 16: windows that cut the causal triangle), Llama 3.1's rope_scaling,
// linear rope_scaling with an explicit head_dim and attention_bias; one Python start for all.
TEST(ModelParity, LlamaLikeFamiliesMatchTorch) {
  if (!PythonTorchAvailable()) {
    GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON
                 << " cannot import torch; install python3-torch (./run.sh does) to run parity";
  }
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::vector<std::string> variants = {"qwen2", "mistral", "llama3_rope", "llama_head_dim",
                                              "qwen3", "gemma"};
  std::vector<ParityCase> cases(variants.size());
  std::string dirs;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].config = TinyFamily(variants[i]);
    cases[i].dir = dir.path + "/case" + std::to_string(i);
    std::filesystem::create_directory(cases[i].dir);
    Prepare(&cases[i], 17 + i);
    if (HasFatalFailure()) return;
    dirs += " " + cases[i].dir;
  }
  ASSERT_TRUE(RunReference("model_reference.py", dirs)) << "reference script failed";
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(variants[i]);
    Check(cases[i]);
  }
}

}  // namespace
}  // namespace traind::engine::testing
