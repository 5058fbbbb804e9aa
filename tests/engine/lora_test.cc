// LoRA (training.peft): only the adapters are trainable (no base gradients, optimizer state or
// weight-gradient GEMMs, and the planner counts that); adapter gradients against a PyTorch LoRA
// reference written from torch primitives (tests/engine/reference/lora_reference.py, float64);
// the merged model's logits against the adapter model's; the output files in HF PEFT's layout
// (tensor names and adapter_config.json keys listed here); plan == measured peak; optimizer and
// gradient memory in proportion to the trainable fraction; bit-identical resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "lora_test_util.h"
#include "model_test_util.h"
#include "models/hf_config.h"
#include "train/planner.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using testing::MakeBatch;
using testing::TestModel;
using testing::ToHost;

// Norm-wise ||ours - ref|| / ||ref|| per tensor, against float64 torch.
constexpr double kGradRelTol = 1e-5;
// max |merged - adapter| / max |adapter| over the logits.
constexpr double kLogitsRelTol = 1e-5;

using testing::kGpt2All;
using testing::kLlamaAll;

ModelOptions LoraOptionsFor(const std::vector<std::string>& targets, int64_t r = 4,
                            double alpha = 8.0) {
  ModelOptions o = testing::TinyOptions(3, 16);
  o.lora.r = r;
  o.lora.alpha = alpha;
  o.lora.targets = targets;
  return o;
}

// Base at 4x the 0.02 init (nonlinear ranges), Kaiming A, and B random (PEFT starts B at zero,
// which would make dA zero and the check weak).
void InitForCheck(TestModel& t, uint64_t seed) {
  Model& m = *t.model;
  m.InitRandom(seed);
  t.backend->Scale(m.param_data(), 4.0f, m.num_params());
  m.InitAdapters(seed + 1);
  testing::RandomizeLoraB(t, seed);
}

TEST(Lora, OnlyAdaptersAreTrainable) {
  const ModelConfig c = testing::TinyGpt2();
  TestModel t = TestModel::Make(c, LoraOptionsFor(kGpt2All));
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  // 2 layers x 4 sites (c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) x (A, B).
  ASSERT_EQ(m.trainable_params().size(), 16u);
  int64_t n = 0;
  for (const ParamInfo& p : m.trainable_params()) {
    EXPECT_TRUE(p.hf_name.find(".lora_A.weight") != std::string::npos ||
                p.hf_name.find(".lora_B.weight") != std::string::npos)
        << p.hf_name;
    n += p.numel;
  }
  EXPECT_EQ(m.num_trainable(), n);
  const int64_t C = 32, H = 128, r = 4;
  EXPECT_EQ(n, 2 * (r * C + 3 * C * r + r * C + C * r + r * C + H * r + r * H + C * r));
  // The gradient buffer holds the adapters only: the frozen base has none.
  const MemoryBytes full = Model::PlanBytes(c, testing::TinyOptions(3, 16));
  const MemoryBytes lora = Model::PlanBytes(c, LoraOptionsFor(kGpt2All));
  EXPECT_EQ(lora.gradients, n * 4);
  EXPECT_EQ(full.gradients, m.num_params() * 4);
  EXPECT_EQ(lora.weights, full.weights + 64 * ((m.num_params() * 4 + 63) / 64) -
                              m.num_params() * 4 + n * 4);

  // A step's forward/backward leaves the base weights untouched and fills adapter gradients.
  InitForCheck(t, 11);
  const std::vector<float> base_before = ToHost(*t.backend, m.param_data(), m.num_params());
  testing::SetBatch(t, MakeBatch(3 * 16, c.vocab_size, 5));
  m.ZeroGrad();
  m.Forward(true, 1.0f);
  m.Backward();
  const std::vector<float> g = ToHost(*t.backend, m.grad_data(), m.num_trainable());
  for (const ParamInfo& p : m.trainable_params()) {
    double s = 0;
    for (int64_t i = 0; i < p.numel; ++i) s += std::abs(g[p.offset + i]);
    EXPECT_GT(s, 0.0) << p.hf_name << " got no gradient";
  }
  EXPECT_EQ(ToHost(*t.backend, m.param_data(), m.num_params()), base_before);
}

struct GradCase {
  const char* name;
  ModelConfig config;
  std::vector<std::string> targets;
  double dropout = 0.0;
};

// The dropout key the reference cases write into the model (any value: the reference recomputes
// the masks from it).
constexpr uint64_t kRefKey = 0x0123456789ABCDEFull;

// PEFT module name ("base_model.model.<module>") -> the adapter's dropout stream: its index in the
// model's adapter order (trainable_params() holds A then B per adapter, in that order).
json DropoutStreams(const Model& m) {
  json s = json::object();
  const std::vector<ParamInfo>& ps = m.trainable_params();
  for (size_t i = 0; i + 1 < ps.size(); i += 2) {
    const std::string& a = ps[i].hf_name;  // base_model.model.<module>.lora_A.weight
    s[a.substr(0, a.size() - std::string(".lora_A.weight").size())] = i / 2;
  }
  return s;
}

// With lora_dropout > 0 the masks are a function of the key (dropout_rng.h), so the training loss
// is a deterministic function of the adapters and its gradient is checked exactly as without:
// the reference draws the same masks (its own implementation of the hash) and applies
// x * mask / (1 - p) on each adapter's input only (the base layer reads x undropped).
TEST(Lora, GradientsMatchTorchLoraReference) {
  if (!testing::PythonTorchAvailable()) GTEST_SKIP() << "no torch for " TRAIND_TEST_PYTHON;
  const std::vector<GradCase> cases = {
      {"gpt2 all modules", testing::TinyGpt2(), kGpt2All},
      {"gpt2 c_attn", testing::TinyGpt2(), {"c_attn"}},
      {"llama all modules", testing::TinyLlama(false), kLlamaAll},
      {"llama k_proj,up_proj", testing::TinyLlama(true), {"k_proj", "up_proj"}},
      {"gpt2 all modules, lora_dropout 0.25", testing::TinyGpt2(), kGpt2All, 0.25},
      {"llama all modules, lora_dropout 0.3", testing::TinyLlama(false), kLlamaAll, 0.3},
      {"llama q_proj,v_proj (GQA), lora_dropout 0.1", testing::TinyLlama(true), {"q_proj", "v_proj"}, 0.1},
      // PEFT's names for qwen3 and gemma are llama's; their adapters around the q/k norms
      // (qwen3), the scaled embeddings and 1 + w norms (gemma).
      {"qwen3 all modules", testing::TinyFamily("qwen3"), kLlamaAll},
      {"gemma all modules", testing::TinyFamily("gemma"), kLlamaAll},
      // qwen2's q/k/v biases stay frozen beside the adapters; mistral's window (5 < T).
      {"qwen2 all modules", testing::TinyFamily("qwen2"), kLlamaAll},
      {"mistral q_proj,v_proj", testing::TinyFamily("mistral"), {"q_proj", "v_proj"}},
  };
  for (const GradCase& gc : cases) {
    SCOPED_TRACE(gc.name);
    ModelOptions o = LoraOptionsFor(gc.targets, 4, 12.0);
    o.lora.dropout = gc.dropout;
    TestModel t = TestModel::Make(gc.config, o);
    ASSERT_NE(t.model, nullptr);
    Model& m = *t.model;
    InitForCheck(t, 21);
    if (gc.config.arch == Arch::kQwen3) {
      // q_norm / k_norm around 1 (InitForCheck's 4x makes them 4: scores of 16 sqrt(HS), a
      // saturated softmax whose gradients fp32 torch itself misses by 2e-5).
      for (const ParamInfo& p : m.params()) {
        if (p.hf_name.find("q_norm") == std::string::npos &&
            p.hf_name.find("k_norm") == std::string::npos) {
          continue;
        }
        for (int64_t i = 0; i < p.numel; ++i) {
          m.param_data()[p.offset + i] = 1.0f + 0.5f * std::sin(1.3f * static_cast<float>(i));
        }
      }
      m.ParamsChanged();
    }
    const testing::Batch batch = MakeBatch(o.micro_batch * o.seq_len, gc.config.vocab_size, 77);
    testing::SetBatch(t, batch);
    double eval_loss = 0;
    if (gc.dropout > 0) {
      ASSERT_NE(m.dropout_key(), nullptr);
      t.backend->CopyHostToDevice(m.dropout_key(), &kRefKey, sizeof(kRefKey));
      eval_loss = m.Forward(false, 1.0f);
    } else {
      EXPECT_EQ(m.dropout_key(), nullptr);
    }
    m.ZeroGrad();
    const double loss = m.Forward(true, 1.0f);
    m.Backward();
    if (gc.dropout > 0) {
      EXPECT_GT(std::abs(loss - eval_loss), 1e-4 * eval_loss) << "dropout had no effect";
    }
    testing::TempDir dir;
    ASSERT_TRUE(WriteSafetensors(dir.path + "/model.safetensors", m.ExportHf()).ok());
    ASSERT_TRUE(WriteSafetensors(dir.path + "/adapters.safetensors", m.ExportAdapters()).ok());
    json cfg = json::parse(WriteHfConfigJson(gc.config));
    json c = {{"arch", ArchName(gc.config.arch)}, {"config", cfg}, {"B", o.micro_batch}, {"T", o.seq_len},
              {"ids", batch.ids}, {"targets", batch.targets}, {"r", o.lora.r},
              {"alpha", o.lora.alpha}, {"target_modules", gc.targets}};
    if (gc.dropout > 0) {
      c["dropout"] = {{"p", gc.dropout}, {"key", std::to_string(kRefKey)},
                      {"streams", DropoutStreams(m)}};
    }
    std::ofstream(dir.path + "/case.json") << c.dump();
    ASSERT_TRUE(testing::RunReference("lora_reference.py", dir.path));
    json ref;
    std::ifstream(dir.path + "/ref.json") >> ref;
    EXPECT_NEAR(loss, ref["loss_f64"].get<double>(), 1e-5 * ref["loss_f64"].get<double>());
    auto ref_grads = ReadSafetensors(dir.path + "/ref_grads.safetensors");
    ASSERT_TRUE(ref_grads.ok()) << ref_grads.status().ToString();
    const std::vector<float> g = ToHost(*t.backend, m.grad_data(), m.num_trainable());
    ASSERT_EQ(ref_grads->tensors.size(), m.trainable_params().size());
    double worst = 0;
    for (const ParamInfo& p : m.trainable_params()) {
      auto it = ref_grads->tensors.find(p.hf_name);
      ASSERT_NE(it, ref_grads->tensors.end()) << p.hf_name;
      auto want = it->second.ToF32();
      ASSERT_TRUE(want.ok());
      const std::vector<float> ours(g.begin() + p.offset, g.begin() + p.offset + p.numel);
      const double rel = testing::RelErr(ours, *want);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kGradRelTol) << p.hf_name;
    }
    std::printf("[%s] loss %.6f (torch f64 %.6f), %zu adapter tensors, worst relative gradient "
                "error %.2e (tol %.0e)\n", gc.name, loss, ref["loss_f64"].get<double>(),
                m.trainable_params().size(), worst, kGradRelTol);
  }
}

TEST(Lora, MergedLogitsEqualAdapterLogits) {
  for (const GradCase& gc : std::vector<GradCase>{{"gpt2", testing::TinyGpt2(), kGpt2All},
                                                  {"llama", testing::TinyLlama(false), kLlamaAll}}) {
    SCOPED_TRACE(gc.name);
    const ModelOptions o = LoraOptionsFor(gc.targets, 4, 16.0);
    TestModel t = TestModel::Make(gc.config, o);
    ASSERT_NE(t.model, nullptr);
    InitForCheck(t, 31);
    const testing::Batch batch = MakeBatch(o.micro_batch * o.seq_len, gc.config.vocab_size, 9);
    testing::SetBatch(t, batch);
    t.model->Forward(false, 1.0f);
    const int64_t n = o.micro_batch * o.seq_len * t.model->logits_stride();
    const std::vector<float> lora_logits = ToHost(*t.backend, t.model->logits(), n);

    TestModel merged = TestModel::Make(gc.config, testing::TinyOptions(3, 16));
    ASSERT_NE(merged.model, nullptr);
    ASSERT_TRUE(merged.model->LoadHf(t.model->ExportMerged()).ok());
    testing::SetBatch(merged, batch);
    merged.model->Forward(false, 1.0f);
    const std::vector<float> merged_logits = ToHost(*merged.backend, merged.model->logits(), n);
    // The merge changed the weights (else the comparison would be empty) ...
    TestModel base = TestModel::Make(gc.config, testing::TinyOptions(3, 16));
    ASSERT_TRUE(base.model->LoadHf(t.model->ExportHf()).ok());
    testing::SetBatch(base, batch);
    base.model->Forward(false, 1.0f);
    const std::vector<float> base_logits = ToHost(*base.backend, base.model->logits(), n);
    double max_ref = 0, max_diff = 0, max_base_diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      max_ref = std::max(max_ref, std::abs(double(lora_logits[i])));
      max_diff = std::max(max_diff, std::abs(double(lora_logits[i]) - merged_logits[i]));
      max_base_diff = std::max(max_base_diff, std::abs(double(lora_logits[i]) - base_logits[i]));
    }
    EXPECT_GT(max_base_diff / max_ref, 1e-2) << "the adapters must change the logits";
    // ... and the merged model reproduces the adapter model's logits.
    EXPECT_LE(max_diff / max_ref, kLogitsRelTol);
    std::printf("[%s] merged vs adapter logits: max rel diff %.2e (tol %.0e); adapters moved them by %.2e\n",
                gc.name, max_diff / max_ref, kLogitsRelTol, max_base_diff / max_ref);
  }
}

class LoraJob : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("lora");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 600, 64, 5);
  }
  JobSpec Spec(const std::string& sub, bool merge) {
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.training.peft = testing::LoraPeft(4, 8, kGpt2All, merge);
    return s;
  }
  std::string dir_, data_;
};

TEST_F(LoraJob, WritesPeftLayoutAndMergedModel) {
  JobSpec spec = Spec("out", /*merge=*/true);
  // init_from a saved base, the common case (PEFT's base_model_name_or_path points at it).
  const std::string base_dir = dir_ + "/base";
  {
    TestModel b = TestModel::Make(
        spec.model.config, testing::TinyOptions(4, 16));
    ASSERT_NE(b.model, nullptr);
    b.model->InitRandom(99);
    fs::create_directories(base_dir);
    ASSERT_TRUE(WriteSafetensors(base_dir + "/model.safetensors", b.model->ExportHf()).ok());
    testing::WriteFile(base_dir + "/config.json", WriteHfConfigJson(spec.model.config));
  }
  spec.model.init_from = base_dir;
  auto r = RunJob(spec, testing::TestRunOptions(), {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string out = spec.output_dir;
  // A LoRA fine-tune of an init_from model uses exactly the planned memory.
  EXPECT_EQ(r->peak_memory_bytes, r->plan.bytes.total());

  // adapter_config.json: PEFT's LoraConfig keys.
  json cfg;
  std::ifstream(out + "/adapter_config.json") >> cfg;
  const std::vector<std::string> kKeys = {
      "alpha_pattern", "auto_mapping", "base_model_name_or_path", "bias", "fan_in_fan_out",
      "inference_mode", "init_lora_weights", "layer_replication", "layers_pattern",
      "layers_to_transform", "loftq_config", "lora_alpha", "lora_dropout", "megatron_config",
      "megatron_core", "modules_to_save", "peft_type", "r", "rank_pattern", "revision",
      "target_modules", "task_type", "use_dora", "use_rslora"};
  std::vector<std::string> keys;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, kKeys);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  EXPECT_EQ(cfg["lora_dropout"], 0.0);
  EXPECT_EQ(cfg["fan_in_fan_out"], true);  // GPT-2 Conv1D
  EXPECT_EQ(cfg["inference_mode"], true);
  EXPECT_EQ(cfg["base_model_name_or_path"], base_dir);
  EXPECT_EQ(cfg["target_modules"], json(kGpt2All));

  // adapter_model.safetensors: PEFT's tensor names and shapes, nothing else.
  auto ad = ReadSafetensors(out + "/adapter_model.safetensors");
  ASSERT_TRUE(ad.ok()) << ad.status().ToString();
  std::map<std::string, std::vector<int64_t>> want;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "base_model.model.transformer.h." + std::to_string(l) + ".";
    want[p + "attn.c_attn.lora_A.weight"] = {4, 32};
    want[p + "attn.c_attn.lora_B.weight"] = {96, 4};
    want[p + "attn.c_proj.lora_A.weight"] = {4, 32};
    want[p + "attn.c_proj.lora_B.weight"] = {32, 4};
    want[p + "mlp.c_fc.lora_A.weight"] = {4, 32};
    want[p + "mlp.c_fc.lora_B.weight"] = {128, 4};
    want[p + "mlp.c_proj.lora_A.weight"] = {4, 128};
    want[p + "mlp.c_proj.lora_B.weight"] = {32, 4};
  }
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& [name, t] : ad->tensors) got[name] = t.shape;
  EXPECT_EQ(got, want);
  EXPECT_EQ(ad->tensors.begin()->second.dtype, "F32");

  // The merged model: frozen tensors byte-identical to the base, target weights moved.
  auto merged = ReadSafetensors(out + "/model.safetensors");
  auto base = ReadSafetensors(base_dir + "/model.safetensors");
  ASSERT_TRUE(merged.ok() && base.ok());
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  ASSERT_EQ(merged->tensors.size(), base->tensors.size());
  int moved = 0;
  for (const auto& [name, t] : base->tensors) {
    const auto m = merged->tensors.at(name).ToF32();
    const auto b = t.ToF32();
    const bool target = name.find("c_attn.weight") != std::string::npos ||
                        name.find("c_proj.weight") != std::string::npos ||
                        name.find("c_fc.weight") != std::string::npos;
    if (target) {
      moved += *m != *b;
    } else {
      EXPECT_EQ(*m, *b) << name << " is frozen but changed";
    }
  }
  EXPECT_EQ(moved, 8);  // every adapter trained (B left zero)
  // No full checkpoint weights: checkpoints hold the adapters only.
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6/adapter_config.json"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-6/model.safetensors"));
}

TEST_F(LoraJob, PlanEqualsPeakAndMemoryFollowsTheTrainableFraction) {
  const JobSpec spec = Spec("plan", false);
  RunOptions o = testing::TestRunOptions();
  auto est = EstimateJob(spec, o.device);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  auto r = RunJob(spec, o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->plan.bytes.total(), est->bytes.total());
  EXPECT_EQ(r->peak_memory_bytes, est->bytes.total()) << "planned " << est->bytes.total();
  // The parameter counts status shows (HF counting: vocabulary 64, tied, n_positions 32).
  const int64_t adapters =
      2 * (4 * 32 + 96 * 4 + 4 * 32 + 32 * 4 + 4 * 32 + 128 * 4 + 4 * 128 + 32 * 4);
  const int64_t base = 64 * 32 + 32 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32;
  EXPECT_EQ(est->trainable_params, adapters);
  EXPECT_EQ(est->total_params, base + adapters);
  JobSpec full_spec = spec;
  full_spec.training.peft.reset();
  auto full_est = EstimateJob(full_spec, o.device);
  ASSERT_TRUE(full_est.ok());
  EXPECT_EQ(full_est->trainable_params, base);
  EXPECT_EQ(full_est->total_params, base);
  std::printf("[lora plan] planned %lld measured peak %lld\n",
              static_cast<long long>(est->bytes.total()),
              static_cast<long long>(r->peak_memory_bytes));

  // The small gpt2 (GPT-2 124M: 12 layers, d768, vocab 50257, T 1024, B 1): optimizer and
  // gradient bytes of LoRA r=8 on c_attn over full fine-tuning = trainable / total parameters.
  ModelConfig c;
  c.arch = Arch::kGpt2;
  c.vocab_size = 50257;
  c.n_positions = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  ModelOptions full;
  full.micro_batch = 1;
  full.seq_len = 1024;
  ModelOptions lora = full;
  lora.lora.r = 8;
  lora.lora.alpha = 16;
  lora.lora.targets = {"c_attn"};
  const MemoryBytes bf = JobBytes(c, full);
  const MemoryBytes bl = JobBytes(c, lora);
  int64_t trainable = 0, total = 0;
  for (const ParamInfo& p : Model::TrainableParamsOf(c, lora)) trainable += p.numel;
  for (const ParamInfo& p : Model::TrainableParamsOf(c, full)) total += p.numel;
  EXPECT_EQ(trainable, 12 * 8 * (768 + 3 * 768));  // 294,912 (PEFT prints the same)
  const double frac = static_cast<double>(trainable) / static_cast<double>(total);
  EXPECT_NEAR(static_cast<double>(bl.gradients) / bf.gradients, frac, 1e-12);
  EXPECT_NEAR(static_cast<double>(bl.optimizer) / bf.optimizer, frac, 1e-12);
  std::printf("[lora memory] gpt2-124M r8 c_attn: trainable %lld of %lld (%.3f%%); gradients "
              "%lld -> %lld bytes, optimizer %lld -> %lld bytes; total %.1f -> %.1f MiB\n",
              static_cast<long long>(trainable), static_cast<long long>(total), 100 * frac,
              static_cast<long long>(bf.gradients), static_cast<long long>(bl.gradients),
              static_cast<long long>(bf.optimizer), static_cast<long long>(bl.optimizer),
              bf.total() / 1048576.0, bl.total() / 1048576.0);
}

TEST_F(LoraJob, ResumeIsBitIdentical) {
  auto spec = [&](const std::string& sub) {
    JobSpec s = Spec(sub, /*merge=*/true);
    s.training.save_steps = 2;
    s.training.logging_steps = 3;
    s.training.eval_steps = 4;
    return s;
  };
  const JobSpec a = spec("a"), b = spec("b");
  const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(a, b, [&] {
    EXPECT_TRUE(fs::exists(b.output_dir + "/checkpoint-2/adapter_model.safetensors"));
    EXPECT_FALSE(fs::exists(b.output_dir + "/checkpoint-2/model.safetensors"));
  });
  ASSERT_TRUE(r.a && r.a->ok()) << (r.a ? r.a->status().ToString() : "not run");
  ASSERT_TRUE(r.b_cancelled);
  ASSERT_FALSE(r.b_cancelled->ok());
  EXPECT_EQ(r.b_cancelled->status().code(), Status::Code::kCancelled);
  ASSERT_TRUE(r.b_resumed && r.b_resumed->ok())
      << (r.b_resumed ? r.b_resumed->status().ToString() : "not run");
  testing::ExpectResumedLossesIdentical(r);
  EXPECT_EQ((*r.b_resumed)->eval_loss, (*r.a)->eval_loss);
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json", "model.safetensors",
                        "checkpoint-6/adapter_model.safetensors",
                        "checkpoint-6/optimizer.safetensors", "checkpoint-4/optimizer.safetensors"}) {
    const std::string fa = testing::ReadFile(a.output_dir + "/" + f);
    EXPECT_FALSE(fa.empty()) << f;
    EXPECT_EQ(fa, testing::ReadFile(b.output_dir + "/" + f)) << f;
  }
  // The optimizer state covers the adapters only.
  auto opt = ReadSafetensors(a.output_dir + "/checkpoint-6/optimizer.safetensors");
  ASSERT_TRUE(opt.ok());
  int64_t state = 0;
  for (const auto& [name, t] : opt->tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    if (t.dtype == "F32") state += n;
  }
  const int64_t adapters = 2 * (4 * 32 + 96 * 4 + 4 * 32 + 32 * 4 + 4 * 32 + 128 * 4 + 4 * 128 + 32 * 4);
  EXPECT_LE(state, 2 * adapters + 16) << "optimizer state beyond the adapters' m and v";
  EXPECT_GE(state, 2 * adapters);
}

// ---- lora_dropout ----

// The op itself (CPU backend, the reference): over 2^20 elements the kept fraction is 1 - p within
// 5 standard deviations, every kept element is exactly x * (1 / (1 - p)) (fp32), bf16 inputs are
// widened first, the mask depends on (key, stream) only (not on the thread count), and masks of
// two streams are independent (they agree on p^2 + (1-p)^2 of the elements).
TEST(LoraDropout, OpKeepsOneMinusPAndScalesKeptValues) {
  const int64_t n = int64_t{1} << 20;
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  for (float& v : x) v = (rng() & 1) ? ud(rng) : -ud(rng);  // never zero: zero output = dropped
  for (float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(p);
    auto run = [&](int threads, uint64_t key, uint64_t stream, DType t) {
      auto be = MakeCpuBackend(threads);
      std::vector<float> out(static_cast<size_t>(n));
      if (t == DType::kF32) {
        be->Dropout(out.data(), x.data(), t, n, p, &key, stream, false);
      } else {
        std::vector<uint16_t> x16(x.size());
        be->Cast(x16.data(), t, x.data(), DType::kF32, n);
        be->Dropout(out.data(), x16.data(), t, n, p, &key, stream, false);
      }
      return out;
    };
    const std::vector<float> a = run(1, 42, 3, DType::kF32);
    const float scale = 1.0f / (1.0f - p);
    int64_t kept = 0;
    bool exact = true;
    for (int64_t i = 0; i < n; ++i) {
      if (a[i] == 0.0f) continue;
      ++kept;
      exact = exact && a[i] == x[i] * scale;
    }
    EXPECT_TRUE(exact) << "kept values are x / (1 - p)";
    const double frac = static_cast<double>(kept) / n;
    const double sd = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(frac, 1.0 - p, 5 * sd);
    std::printf("[lora dropout op] p %.1f: kept %.5f of 2^20 (1-p = %.1f, 5 sd = %.5f)\n", p, frac,
                1.0 - p, 5 * sd);
    EXPECT_EQ(run(2, 42, 3, DType::kF32), a) << "threads must not change the mask";
    const std::vector<float> b = run(1, 42, 4, DType::kF32);
    const std::vector<float> c = run(1, 43, 3, DType::kF32);
    int64_t agree_stream = 0, agree_key = 0;
    for (int64_t i = 0; i < n; ++i) {
      agree_stream += (a[i] == 0.0f) == (b[i] == 0.0f);
      agree_key += (a[i] == 0.0f) == (c[i] == 0.0f);
    }
    const double indep = p * p + (1.0 - p) * (1.0 - p);
    EXPECT_NEAR(static_cast<double>(agree_stream) / n, indep, 0.005);
    EXPECT_NEAR(static_cast<double>(agree_key) / n, indep, 0.005);
    // bf16 input: the same mask, the kept values are the widened bf16 times the scale.
    const std::vector<float> h = run(1, 42, 3, DType::kBF16);
    for (int64_t i = 0; i < n; i += 997) {
      EXPECT_EQ(h[i], a[i] == 0.0f ? 0.0f : BF16ToF32(F32ToBF16(x[i])) * scale) << i;
    }
    // accumulate: out += the same.
    auto be = MakeCpuBackend(1);
    std::vector<float> acc(x.begin(), x.end());
    const uint64_t key = 42;
    be->Dropout(acc.data(), x.data(), DType::kF32, n, p, &key, 3, true);
    for (int64_t i = 0; i < n; i += 991) EXPECT_EQ(acc[i], x[i] + a[i]) << i;
  }
}

// No dropout outside a forward for backward: the eval loss (Forward(false)) of a lora_dropout 0.3
// model equals the loss of the same adapters without dropout bit for bit, whatever the key; the
// training forward's differs; and the merged export (no dropout in a merge) reproduces the eval
// logits.
TEST(LoraDropout, EvalAndMergedModelHaveNoDropout) {
  for (const GradCase& gc : std::vector<GradCase>{{"gpt2", testing::TinyGpt2(), kGpt2All},
                                                  {"llama", testing::TinyLlama(false), kLlamaAll}}) {
    SCOPED_TRACE(gc.name);
    ModelOptions o = LoraOptionsFor(gc.targets, 4, 16.0);
    ModelOptions od = o;
    od.lora.dropout = 0.3;
    TestModel plain = TestModel::Make(gc.config, o);
    TestModel drop = TestModel::Make(gc.config, od);
    ASSERT_TRUE(plain.model && drop.model);
    InitForCheck(plain, 41);
    InitForCheck(drop, 41);
    const testing::Batch batch = MakeBatch(o.micro_batch * o.seq_len, gc.config.vocab_size, 3);
    testing::SetBatch(plain, batch);
    testing::SetBatch(drop, batch);
    const double want = plain.model->Forward(false, 1.0f);
    for (uint64_t key : {uint64_t{1}, uint64_t{977}}) {
      drop.backend->CopyHostToDevice(drop.model->dropout_key(), &key, sizeof(key));
      EXPECT_EQ(drop.model->Forward(false, 1.0f), want) << "eval with key " << key;
    }
    const double train = drop.model->Forward(true, 1.0f);
    EXPECT_GT(std::abs(train - want), 1e-4 * want) << "the training forward drops";
    drop.model->Backward();
    const int64_t n = o.micro_batch * o.seq_len * drop.model->logits_stride();
    drop.model->Forward(false, 1.0f);
    const std::vector<float> eval_logits = ToHost(*drop.backend, drop.model->logits(), n);
    TestModel merged = TestModel::Make(gc.config, testing::TinyOptions(3, 16));
    ASSERT_TRUE(merged.model->LoadHf(drop.model->ExportMerged()).ok());
    testing::SetBatch(merged, batch);
    merged.model->Forward(false, 1.0f);
    const std::vector<float> merged_logits = ToHost(*merged.backend, merged.model->logits(), n);
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      max_ref = std::max(max_ref, std::abs(double(eval_logits[i])));
      max_diff = std::max(max_diff, std::abs(double(eval_logits[i]) - merged_logits[i]));
    }
    EXPECT_LE(max_diff / max_ref, kLogitsRelTol);
    std::printf("[%s lora_dropout 0.3] eval loss %.6f (= no-dropout %.6f), training forward %.6f; "
                "merged vs eval logits %.2e\n", gc.name, want, want, train, max_diff / max_ref);
  }
}

// Gradient checkpointing recomputes the blocks in backward: the recomputed forward must draw the
// same masks (same key), so the adapter gradients equal those without checkpointing (bf16 too).
TEST(LoraDropout, CheckpointingRecomputesTheSameMasks) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(t));
    ModelOptions o = LoraOptionsFor(kLlamaAll, 4, 8.0);
    o.lora.dropout = 0.2;
    o.compute_type = t;
    ModelOptions oc = o;
    oc.gradient_checkpointing = true;
    oc.checkpoint_every = 1;
    std::vector<float> g[2];
    for (int k = 0; k < 2; ++k) {
      TestModel m = TestModel::Make(testing::TinyLlama(false), k == 0 ? o : oc);
      ASSERT_NE(m.model, nullptr);
      InitForCheck(m, 51);
      testing::SetBatch(m, MakeBatch(o.micro_batch * o.seq_len, 67, 8));
      m.backend->CopyHostToDevice(m.model->dropout_key(), &kRefKey, sizeof(kRefKey));
      m.model->ZeroGrad();
      m.model->Forward(true, 1.0f);
      m.model->Backward();
      g[k] = ToHost(*m.backend, m.model->grad_data(), m.model->num_trainable());
    }
    EXPECT_LE(testing::RelErr(g[1], g[0]), 1e-6);
  }
}

// Resume through RunJob with lora_dropout 0.1 (the masks of micro-batch a of step s come from
// (seed, s * accumulation + a), so the resumed run draws the uninterrupted run's masks): every
// step loss, the eval loss and the output files bit-identical; in fp32 and in fp16 (loss scaler
// restored too). Dropout really acts in the step runner's path: the losses differ from the
// lora_dropout 0 run's after step 1 (B starts at zero, so step 1's loss cannot).
TEST_F(LoraJob, ResumeWithDropoutIsBitIdentical) {
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    auto spec = [&](const std::string& sub, double p) {
      JobSpec s = Spec(std::string(precision) + sub, /*merge=*/true);
      s.training.peft->lora_dropout = p;
      s.training.fp16 = std::string(precision) == "fp16";
      s.training.gradient_accumulation_steps = 2;
      s.training.save_steps = 2;
      s.training.eval_steps = 3;
      return s;
    };
    const JobSpec a = spec("a", 0.1), b = spec("b", 0.1);
    const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(a, b);
    ASSERT_TRUE(r.a && r.a->ok()) << (r.a ? r.a->status().ToString() : "not run");
    ASSERT_TRUE(r.b_resumed && r.b_resumed->ok())
        << (r.b_resumed ? r.b_resumed->status().ToString() : "not run");
    testing::ExpectResumedLossesIdentical(r);
    EXPECT_EQ((*r.b_resumed)->eval_loss, (*r.a)->eval_loss);
    for (const char* f : {"adapter_model.safetensors", "model.safetensors",
                          "checkpoint-6/optimizer.safetensors"}) {
      const std::string fa = testing::ReadFile(a.output_dir + "/" + f);
      EXPECT_FALSE(fa.empty()) << f;
      EXPECT_EQ(fa, testing::ReadFile(b.output_dir + "/" + f)) << f;
    }
    // lora_dropout 0: B starts at zero and step 1's learning rate is 0 (warmup 2), so steps 1
    // and 2 add nothing through the adapters; from step 3 on dropout changes every loss.
    std::vector<double> no_drop;
    RunCallbacks cb;
    cb.on_step = [&](const StepReport& s) { no_drop.push_back(s.loss); };
    ASSERT_TRUE(RunJob(spec("c", 0.0), testing::TestRunOptions(2), cb).ok());
    ASSERT_EQ(no_drop.size(), r.losses_a.size());
    EXPECT_EQ(no_drop[0], r.losses_a[0]) << "step 1: B = 0, the adapters add nothing yet";
    EXPECT_EQ(no_drop[1], r.losses_a[1]) << "step 2: B = 0 still (lr 0 at step 1)";
    int differ = 0;
    for (size_t i = 2; i < no_drop.size(); ++i) differ += no_drop[i] != r.losses_a[i];
    EXPECT_EQ(differ, 4) << "lora_dropout 0.1 must change steps 3..6";
  }
}

// ---- LoRA in bf16 / fp16 ----

// The same LoRA job (tiny gpt2, every module, r 4, 30 steps) in fp32, bf16 and fp16 from the same
// base and batches: every step loss of the 16-bit runs within kMixedLossTol (relative) of the fp32
// run's, the final eval loss too, the loss really falls, and the arena's peak is the plan (the
// adapters' fp32 input scratch included). The base is first trained (full fine-tuning, fp32, 60
// steps) so that its logits are far from uniform: at the 0.02 init every precision gives nearly
// ln(64) and the comparison would be empty. (Measured: bf16 within 2.7e-4, fp16 within 3.9e-5.)
constexpr double kMixedLossTol[2] = {2e-3, 5e-4};  // bf16, fp16: per-step relative
TEST_F(LoraJob, Bf16AndFp16TrackFp32) {
  JobSpec pre = testing::TinySpec(dir_ + "/pretrain", data_);
  pre.training.max_steps = 60;
  pre.training.warmup_steps = 5;
  pre.training.learning_rate = 1e-2;
  auto base = RunJob(pre, testing::TestRunOptions(), {});
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ASSERT_TRUE(fs::exists(pre.output_dir + "/model.safetensors"));
  std::printf("[lora mixed precision] base pretrained to eval loss %.4f\n", base->eval_loss);
  for (double p : {0.0, 0.1}) {
    std::map<std::string, std::vector<double>> losses;
    std::map<std::string, double> eval;
    for (const char* precision : {"fp32", "bf16", "fp16"}) {
      JobSpec s = Spec(std::string("mp_") + precision + (p > 0 ? "_drop" : ""), false);
      s.training.peft->lora_dropout = p;
      s.model.init_from = pre.output_dir;
      s.training.max_steps = 30;
      s.training.warmup_steps = 3;
      s.training.learning_rate = 1e-2;
      s.training.bf16 = std::string(precision) == "bf16";
      s.training.fp16 = std::string(precision) == "fp16";
      RunCallbacks cb;
      cb.on_step = [&](const StepReport& st) { losses[precision].push_back(st.loss); };
      auto est = EstimateJob(s, testing::TestRunOptions().device);
      ASSERT_TRUE(est.ok()) << est.status().ToString();
      auto r = RunJob(s, testing::TestRunOptions(), cb);
      ASSERT_TRUE(r.ok()) << precision << ": " << r.status().ToString();
      EXPECT_EQ(r->peak_memory_bytes, r->plan.bytes.total()) << precision;
      EXPECT_EQ(r->plan.bytes.total(), est->bytes.total()) << precision;
      eval[precision] = r->eval_loss;
      std::printf("[lora %s lora_dropout %.1f] plan %lld = peak %lld bytes; loss %.4f -> %.4f, "
                  "eval %.4f\n", precision, p, static_cast<long long>(est->bytes.total()),
                  static_cast<long long>(r->peak_memory_bytes), losses[precision].front(),
                  losses[precision].back(), r->eval_loss);
    }
    const std::vector<double>& f = losses["fp32"];
    ASSERT_EQ(f.size(), 30u);
    EXPECT_LT(f.back(), f.front() - 0.1) << "the adapters must learn";
    for (int k = 0; k < 2; ++k) {
      const char* name = k == 0 ? "bf16" : "fp16";
      const std::vector<double>& g = losses[name];
      ASSERT_EQ(g.size(), f.size()) << name;
      double worst = 0;
      for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::abs(g[i] - f[i]) / f[i]);
      EXPECT_LE(worst, kMixedLossTol[k]) << name;
      const double eval_rel = std::abs(eval[name] - eval["fp32"]) / eval["fp32"];
      EXPECT_LE(eval_rel, kMixedLossTol[k]) << name << " eval";
      std::printf("[lora %s vs fp32, lora_dropout %.1f] worst per-step loss rel diff %.2e, eval "
                  "%.2e (tol %.0e)\n", name, p, worst, eval_rel, kMixedLossTol[k]);
    }
  }
}

}  // namespace
}  // namespace traind::engine
