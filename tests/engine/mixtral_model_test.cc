// The mixtral model (DecoderModel with the sparse mixture-of-experts MLP) against an independent
// PyTorch reference (tests/engine/reference/mixtral_reference.py, HF MixtralForCausalLM semantics
// from torch primitives): loss (with the load-balancing loss), the aux loss itself, the routing
// (tokens per expert per layer), every gradient and 3 AdamW steps; plus the memory plan,
// gradient checkpointing and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/decoder.h"
#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

using nlohmann::json;

ModelConfig TinyMixtral(int64_t experts, int64_t top_k, bool aux, bool tied) {
  ModelConfig c;
  c.arch = Arch::kMixtral;
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.num_local_experts = experts;
  c.num_experts_per_tok = top_k;
  c.output_router_logits = aux;
  c.router_aux_loss_coef = 0.05;  // large enough that its gradient shows in every router
  return c;
}

json ConfigJson(const ModelConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"num_hidden_layers", c.num_hidden_layers},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"num_local_experts", c.num_local_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"output_router_logits", c.output_router_logits},
          {"router_aux_loss_coef", c.router_aux_loss_coef}};
}

constexpr double kRelTol = 1e-5;
constexpr int kAdamSteps = 3;

struct MixtralCase {
  ModelConfig config;
  std::string dir;
  double loss = 0, aux = 0;
  std::vector<int64_t> counts;
  std::vector<double> adam_losses;
  SafetensorsFile grads, adam_weights;
};

void Prepare(MixtralCase* mc, uint64_t seed) {
  const ModelOptions opt = TinyOptions(3, 16);
  TestModel t = TestModel::Make(mc->config, opt);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(seed);
  t.backend->Scale(m.param_data(), 4.0f, m.num_params());
  const Batch batch = MakeBatch(opt.micro_batch * opt.seq_len, mc->config.vocab_size, 77 + seed);
  SetBatch(t, batch);
  ASSERT_TRUE(WriteSafetensors(mc->dir + "/model.safetensors", m.ExportHf()).ok());
  m.ZeroGrad();
  mc->loss = m.Forward(true, 1.0f);
  mc->aux = dynamic_cast<DecoderModel&>(m).aux_loss();
  m.Backward();
  mc->grads = GradsAsHf(t);
  mc->counts = m.TakeExpertTokens();
  EXPECT_EQ(m.TakeExpertTokens(), std::vector<int64_t>(mc->counts.size(), 0)) << "taken: reset";

  const int64_t P = m.num_params();
  std::vector<float> zeros(static_cast<size_t>(2 * P), 0.0f);
  auto* state = static_cast<float*>(t.backend->Alloc(zeros.size() * sizeof(float)));
  ASSERT_NE(state, nullptr);
  t.backend->CopyHostToDevice(state, zeros.data(), zeros.size() * sizeof(float));
  for (int step = 1; step <= kAdamSteps; ++step) {
    m.ZeroGrad();
    mc->adam_losses.push_back(m.Forward(true, 1.0f));
    m.Backward();
    for (const ParamInfo& info : m.params()) {
      t.backend->AdamW(m.param_data() + info.offset, m.grad_data() + info.offset,
                       state + info.offset, state + P + info.offset, info.numel, 1e-3f, 0.9f,
                       0.999f, 1e-8f, info.weight_decay ? 0.1f : 0.0f,
                       static_cast<float>(1.0 - std::pow(0.9, step)),
                       static_cast<float>(1.0 - std::pow(0.999, step)), 1.0f);
    }
    m.ParamsChanged();
  }
  mc->adam_weights = m.ExportHf();
  t.backend->Free(state);
  const json adam = {{"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8},
                     {"weight_decay", 0.1}, {"steps", kAdamSteps}};
  json c = {{"config", ConfigJson(mc->config)}, {"B", opt.micro_batch}, {"T", opt.seq_len},
            {"ids", batch.ids}, {"targets", batch.targets}, {"adam", adam}};
  std::ofstream(mc->dir + "/case.json") << c.dump();
}

// `router_constant`: top-1 routing without the load-balancing loss, where the renormalised weight
// p / p is exactly 1, so the router's gradient is 0 in exact arithmetic (torch-f64: ~1e-17
// rounding noise): its gradient is checked to be (near) zero instead of relatively.
void Compare(const SafetensorsFile& ours, const SafetensorsFile& ref, const std::string& what,
             bool router_constant = false) {
  EXPECT_EQ(ours.tensors.size(), ref.tensors.size()) << what;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, r] : ref.tensors) {
    auto it = ours.tensors.find(name);
    if (it == ours.tensors.end()) {
      ADD_FAILURE() << what << ": the engine has no " << name;
      continue;
    }
    if (router_constant && name.find("block_sparse_moe.gate") != std::string::npos) {
      const std::vector<float> got = it->second.ToF32().value(), want = r.ToF32().value();
      for (float v : got) ASSERT_LE(std::abs(v), 1e-9f) << name;
      for (float v : want) ASSERT_LE(std::abs(v), 1e-9f) << name << " (reference)";
      continue;
    }
    const double rel = RelErr(it->second.ToF32().value(), r.ToF32().value());
    EXPECT_LE(rel, kRelTol) << what << " " << name;
    if (rel > worst) worst = rel, worst_name = name;
  }
  std::printf("  %s: worst rel err %.2e (%s) over %zu tensors\n", what.c_str(), worst,
              worst_name.c_str(), ref.tensors.size());
}

TEST(MixtralModel, MatchesTorchWithRoutingAndAuxLoss) {
  if (!PythonTorchAvailable()) {
    GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON
                 << " cannot import torch; install python3-torch (./run.sh does) to run parity";
  }
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::vector<MixtralCase> cases(2);
  cases[0].config = TinyMixtral(4, 2, /*aux=*/true, /*tied=*/false);
  cases[1].config = TinyMixtral(3, 1, /*aux=*/false, /*tied=*/true);
  std::string dirs;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].dir = dir.path + "/case" + std::to_string(i);
    std::filesystem::create_directory(cases[i].dir);
    Prepare(&cases[i], 5 + i);
    if (HasFatalFailure()) return;
    dirs += " " + cases[i].dir;
  }
  ASSERT_TRUE(RunReference("mixtral_reference.py", dirs)) << "reference script failed";
  for (const MixtralCase& mc : cases) {
    // (std::string("E"): GCC 12's -Wrestrict misfires on "E" + std::string&& at -O3.)
    const std::string label = std::string("E") + std::to_string(mc.config.num_local_experts) + " top" +
                              std::to_string(mc.config.num_experts_per_tok) +
                              (mc.config.output_router_logits ? " aux" : "");
    SCOPED_TRACE(label);
    json ref;
    std::ifstream(mc.dir + "/ref.json") >> ref;
    const double loss64 = ref["loss_f64"].get<double>(), aux64 = ref["aux_f64"].get<double>();
    std::printf("[mixtral %s] loss ours %.9f torch-f64 %.9f; aux ours %.9f torch-f64 %.9f\n",
                label.c_str(), mc.loss, loss64, mc.aux, aux64);
    EXPECT_NEAR(mc.loss, loss64, kRelTol * std::abs(loss64));
    EXPECT_NEAR(mc.aux, aux64, kRelTol * std::abs(aux64));
    // Routing: the tokens per expert per layer are the reference's.
    std::vector<int64_t> want;
    for (const auto& layer : ref["counts_f64"]) {
      for (const auto& n : layer) want.push_back(n.get<int64_t>());
    }
    EXPECT_EQ(mc.counts, want);
    int64_t total = 0;
    for (int64_t n : mc.counts) total += n;
    EXPECT_EQ(total, 3 * 16 * mc.config.num_experts_per_tok * mc.config.num_hidden_layers);
    auto g64 = ReadSafetensors(mc.dir + "/ref_f64.safetensors");
    ASSERT_TRUE(g64.ok());
    const bool router_constant =
        mc.config.num_experts_per_tok == 1 && !mc.config.output_router_logits;
    Compare(mc.grads, *g64, "gradients", router_constant);
    const auto& ref_losses = ref["adam_losses"];
    ASSERT_EQ(ref_losses.size(), mc.adam_losses.size());
    for (size_t i = 0; i < mc.adam_losses.size(); ++i) {
      const double want_loss = ref_losses[i].get<double>();
      EXPECT_NEAR(mc.adam_losses[i], want_loss, kRelTol * std::abs(want_loss)) << "step " << i + 1;
    }
    auto w64 = ReadSafetensors(mc.dir + "/ref_adamw.safetensors");
    ASSERT_TRUE(w64.ok());
    Compare(mc.adam_weights, *w64, "weights after 3 AdamW steps");
  }
}

// Plan == arena peak (fp32, bf16; with checkpointing), and checkpointed gradients bit-identical.
TEST(MixtralModel, PlanIsExactAndCheckpointingIsBitIdentical) {
  const ModelConfig c = TinyMixtral(4, 2, true, false);
  const Batch batch = MakeBatch(3 * 16, c.vocab_size, 12);
  std::vector<float> plain;
  for (int ck : {0, 1}) {
    for (DType ct : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE("checkpointing " + std::to_string(ck) + " bf16 " +
                   std::to_string(ct == DType::kBF16));
      ModelOptions opt = TinyOptions(3, 16);
      opt.gradient_checkpointing = ck > 0;
      opt.compute_type = ct;
      const MemoryBytes plan = Model::PlanBytes(c, opt);
      TestModel t = TestModel::Make(c, opt);
      ASSERT_NE(t.model, nullptr);
      t.model->InitRandom(3);
      SetBatch(t, batch);
      t.model->ZeroGrad();
      EXPECT_TRUE(std::isfinite(t.model->Forward(true, 1.0f)));
      t.model->Backward();
      EXPECT_EQ(t.arena->peak_bytes(), plan.total());
      const std::vector<int64_t> counts = t.model->TakeExpertTokens();
      int64_t total = 0;
      for (int64_t n : counts) total += n;
      EXPECT_EQ(total, 3 * 16 * 2 * 2) << "recomputed blocks are not counted again";
      if (ct != DType::kF32) continue;
      std::vector<float> g = ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
      if (ck == 0) {
        plain = g;
      } else {
        EXPECT_EQ(g, plain);
      }
    }
  }
}

TEST(MixtralModel, Bf16FollowsFp32AndLoraIsRefused) {
  const ModelConfig c = TinyMixtral(4, 2, true, false);
  const Batch batch = MakeBatch(3 * 16, c.vocab_size, 13);
  double loss[2];
  std::vector<float> grads[2];
  for (int i = 0; i < 2; ++i) {
    ModelOptions opt = TinyOptions(3, 16);
    opt.compute_type = i == 0 ? DType::kF32 : DType::kBF16;
    TestModel t = TestModel::Make(c, opt);
    ASSERT_NE(t.model, nullptr);
    t.model->InitRandom(8);
    SetBatch(t, batch);
    t.model->ZeroGrad();
    loss[i] = t.model->Forward(true, 1.0f);
    t.model->Backward();
    grads[i] = ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-2 * std::abs(loss[0]));
  EXPECT_LE(RelErr(grads[1], grads[0]), 5e-2);
  ModelOptions lora = TinyOptions(3, 16);
  lora.lora.r = 4;
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 0);
  auto m = Model::Create(c, lora, &arena);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("training.peft"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine::testing
