// The bert encoder (EncoderModel) against an independent PyTorch reference
// (tests/engine/reference/bert_reference.py, written from HF's BertModel semantics with torch
// primitives): loss, every parameter gradient and 3 AdamW steps on padded batches, both heads;
// plus the padding mask's invariance, the memory plan, gradient checkpointing and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/encoder.h"
#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

using nlohmann::json;

ModelConfig TinyBert(const std::string& head) {
  ModelConfig c;
  c.arch = Arch::kBert;
  c.vocab_size = 61;  // not a multiple of 64: the padded vocabulary
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 24;
  c.type_vocab_size = 2;
  c.layer_norm_eps = 1e-12;
  c.pad_token_id = 0;
  c.head = head;
  c.num_labels = 3;
  return c;
}

struct BertBatch {
  std::vector<int32_t> ids, mask, targets;
};

// Sequences of lengths T, 7 and 3 (the rest padding: pad id, mask 0); one pad id inside a real
// sequence too (nn.Embedding(padding_idx) gives its row no gradient wherever it appears).
// classification: labels 2, 0, 1; masked_lm: about a third of the real positions as targets.
BertBatch MakeBertBatch(const ModelConfig& c, int64_t B, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(c.vocab_size - 1));
  const int64_t lengths[] = {T, 7, 3};
  BertBatch b;
  for (int64_t s = 0; s < B; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < lengths[s % 3];
      b.ids.push_back(real ? (s == 0 && t == 5 ? 0 : tok(rng)) : 0);
      b.mask.push_back(real ? 1 : 0);
    }
  }
  b.targets.assign(static_cast<size_t>(B * T), -1);
  if (c.head == "sequence_classification") {
    const int32_t labels[] = {2, 0, 1};
    for (int64_t s = 0; s < B; ++s) b.targets[s] = labels[s % 3];
  } else {
    for (int64_t n = 0; n < B * T; ++n) {
      if (b.mask[n] && rng() % 3 == 0) b.targets[n] = tok(rng);
    }
  }
  return b;
}

void SetBertBatch(TestModel& t, const BertBatch& b) {
  Model& m = *t.model;
  t.backend->CopyHostToDevice(m.inputs(), b.ids.data(), b.ids.size() * sizeof(int32_t));
  t.backend->CopyHostToDevice(m.targets(), b.targets.data(), b.targets.size() * sizeof(int32_t));
  ASSERT_NE(m.attention_mask(), nullptr);
  t.backend->CopyHostToDevice(m.attention_mask(), b.mask.data(), b.mask.size() * sizeof(int32_t));
}

json BertConfigJson(const ModelConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_hidden_layers", c.num_hidden_layers},
          {"layer_norm_eps", c.layer_norm_eps},
          {"pad_token_id", c.pad_token_id}};
}

constexpr double kRelTol = 1e-5;  // the bar, norm-wise per tensor against float64
constexpr int kAdamSteps = 3;
const json kAdam = {{"lr", 1e-3},        {"beta1", 0.9},  {"beta2", 0.999},
                    {"eps", 1e-8},       {"weight_decay", 0.1}, {"steps", kAdamSteps}};

struct BertCase {
  ModelConfig config;
  std::string dir;
  double loss = 0;
  std::vector<double> adam_losses;
  SafetensorsFile grads, adam_weights;
};

void PrepareBert(BertCase* bc, uint64_t seed) {
  const ModelOptions opt = TinyOptions(3, 12);
  TestModel t = TestModel::Make(bc->config, opt);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(seed);
  // 4x the 0.02 init: attention far from uniform and GELU/tanh well inside their curves.
  t.backend->Scale(m.param_data(), 4.0f, m.num_params());
  const BertBatch batch = MakeBertBatch(bc->config, opt.micro_batch, opt.seq_len, 99 + seed);
  SetBertBatch(t, batch);
  ASSERT_TRUE(WriteSafetensors(bc->dir + "/model.safetensors", m.ExportHf()).ok());
  m.ZeroGrad();
  bc->loss = m.Forward(true, 1.0f);
  m.Backward();
  bc->grads = GradsAsHf(t);

  // 3 AdamW steps on the same batch, torch semantics (weight decay on >= 2-D tensors only).
  const int64_t P = m.num_params();
  float* state = nullptr;
  std::vector<float> zeros(static_cast<size_t>(2 * P), 0.0f);
  state = static_cast<float*>(t.backend->Alloc(zeros.size() * sizeof(float)));
  ASSERT_NE(state, nullptr);
  t.backend->CopyHostToDevice(state, zeros.data(), zeros.size() * sizeof(float));
  for (int step = 1; step <= kAdamSteps; ++step) {
    m.ZeroGrad();
    bc->adam_losses.push_back(m.Forward(true, 1.0f));
    m.Backward();
    const float b1 = 0.9f, b2 = 0.999f;
    for (const ParamInfo& info : m.params()) {
      t.backend->AdamW(m.param_data() + info.offset, m.grad_data() + info.offset,
                       state + info.offset, state + P + info.offset, info.numel, 1e-3f, b1, b2,
                       1e-8f, info.weight_decay ? 0.1f : 0.0f,
                       static_cast<float>(1.0 - std::pow(0.9, step)),
                       static_cast<float>(1.0 - std::pow(0.999, step)), 1.0f);
    }
    m.ParamsChanged();
  }
  bc->adam_weights = m.ExportHf();
  t.backend->Free(state);
  json c = {{"config", BertConfigJson(bc->config)}, {"head", bc->config.head},
            {"B", opt.micro_batch},                 {"T", opt.seq_len},
            {"ids", batch.ids},                     {"mask", batch.mask},
            {"targets", batch.targets},             {"adam", kAdam}};
  std::ofstream(bc->dir + "/case.json") << c.dump();
}

// The key projection's bias: adding it shifts every score of a query row by the same q.b_k, which
// softmax ignores, so its gradient is exactly 0 in exact arithmetic (torch-f64 gives ~1e-17, fp32
// rounding noise ~1e-9), and AdamW turns that noise into steps of up to lr: no relative
// comparison means anything there. Its gradient is checked to be noise (below), and it is left
// out of the AdamW weight comparison.
bool IsKeyBias(const std::string& name) {
  return name.find("attention.self.key.bias") != std::string::npos;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

// Norm-wise relative error of every tensor of `ours` against `ref` (same names); the worst.
double CompareTensors(const SafetensorsFile& ours, const SafetensorsFile& ref, double tol,
                      const std::string& what, bool gradients) {
  EXPECT_EQ(ours.tensors.size(), ref.tensors.size()) << what << ": tensor count (HF names)";
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, r] : ref.tensors) {
    auto it = ours.tensors.find(name);
    if (it == ours.tensors.end()) {
      ADD_FAILURE() << what << ": the engine has no " << name;
      continue;
    }
    EXPECT_EQ(it->second.shape, r.shape) << name;
    if (IsKeyBias(name)) {
      if (gradients) {  // zero up to rounding: far below the query bias's gradient
        std::string q = name;
        q.replace(q.find("key.bias"), 8, "query.bias");
        const double query_scale = MaxAbs(ref.tensors.at(q).ToF32().value());
        EXPECT_LE(MaxAbs(it->second.ToF32().value()), 1e-5 * query_scale) << name;
        EXPECT_LE(MaxAbs(r.ToF32().value()), 1e-12 * query_scale) << name << " (reference)";
      }
      continue;
    }
    const double rel = RelErr(it->second.ToF32().value(), r.ToF32().value());
    EXPECT_LE(rel, tol) << what << " " << name;
    if (rel > worst) worst = rel, worst_name = name;
  }
  std::printf("  %s: worst rel err %.2e (%s) over %zu tensors\n", what.c_str(), worst,
              worst_name.c_str(), ref.tensors.size());
  return worst;
}

TEST(BertModel, BothHeadsMatchTorchOnPaddedBatches) {
  if (!PythonTorchAvailable()) {
    GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON
                 << " cannot import torch; install python3-torch (./run.sh does) to run parity";
  }
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::vector<BertCase> cases(2);
  cases[0].config = TinyBert("sequence_classification");
  cases[1].config = TinyBert("masked_lm");
  std::string dirs;
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].dir = dir.path + "/case" + std::to_string(i);
    std::filesystem::create_directory(cases[i].dir);
    PrepareBert(&cases[i], 11 + i);
    if (HasFatalFailure()) return;
    dirs += " " + cases[i].dir;
  }
  ASSERT_TRUE(RunReference("bert_reference.py", dirs)) << "reference script failed";
  for (const BertCase& bc : cases) {
    SCOPED_TRACE(bc.config.head);
    json ref;
    std::ifstream(bc.dir + "/ref.json") >> ref;
    const double loss64 = ref["loss_f64"].get<double>();
    std::printf("[bert %s] loss ours %.9f torch-f64 %.9f torch-f32 %.9f\n", bc.config.head.c_str(),
                bc.loss, loss64, ref["loss_f32"].get<double>());
    EXPECT_NEAR(bc.loss, loss64, kRelTol * std::abs(loss64));
    auto g64 = ReadSafetensors(bc.dir + "/ref_f64.safetensors");
    ASSERT_TRUE(g64.ok());
    CompareTensors(bc.grads, *g64, kRelTol, "gradients", true);
    const auto& ref_losses = ref["adam_losses"];
    ASSERT_EQ(ref_losses.size(), bc.adam_losses.size());
    for (size_t i = 0; i < bc.adam_losses.size(); ++i) {
      const double want = ref_losses[i].get<double>();
      EXPECT_NEAR(bc.adam_losses[i], want, kRelTol * std::abs(want)) << "AdamW step " << i + 1;
    }
    auto w64 = ReadSafetensors(bc.dir + "/ref_adamw.safetensors");
    ASSERT_TRUE(w64.ok());
    CompareTensors(bc.adam_weights, *w64, kRelTol, "weights after 3 AdamW steps", false);
  }
}

// What a padded position holds does not change a real position's output: the classifier's loss
// and every gradient are the same when the padding ids change.
TEST(BertModel, PaddingIsMaskedOut) {
  const ModelConfig c = TinyBert("sequence_classification");
  const ModelOptions opt = TinyOptions(3, 12);
  TestModel t = TestModel::Make(c, opt);
  ASSERT_NE(t.model, nullptr);
  Model& m = *t.model;
  m.InitRandom(5);
  t.backend->Scale(m.param_data(), 4.0f, m.num_params());
  BertBatch batch = MakeBertBatch(c, 3, 12, 7);
  SetBertBatch(t, batch);
  m.ZeroGrad();
  const double loss_a = m.Forward(true, 1.0f);
  m.Backward();
  const std::vector<float> grad_a = ToHost(*t.backend, m.grad_data(), m.num_params());
  for (size_t n = 0; n < batch.ids.size(); ++n) {
    if (!batch.mask[n]) batch.ids[n] = 17;  // another token under the mask
  }
  SetBertBatch(t, batch);
  m.ZeroGrad();
  const double loss_b = m.Forward(true, 1.0f);
  m.Backward();
  const std::vector<float> grad_b = ToHost(*t.backend, m.grad_data(), m.num_params());
  EXPECT_NEAR(loss_a, loss_b, 1e-6 * std::abs(loss_a));
  // Only the embedding rows of the padded ids differ (their lookups still get gradients, as in
  // HF): every other tensor's gradient is equal within float reassociation.
  const auto& infos = m.params();
  for (const ParamInfo& info : infos) {
    if (info.hf_name == "bert.embeddings.word_embeddings.weight") continue;
    std::vector<float> a(grad_a.begin() + info.offset, grad_a.begin() + info.offset + info.numel);
    std::vector<float> b(grad_b.begin() + info.offset, grad_b.begin() + info.offset + info.numel);
    EXPECT_LE(RelErr(b, a), 1e-5) << info.hf_name;
  }
  // And the mask matters: without it the loss changes.
  std::vector<int32_t> all(batch.mask.size(), 1);
  t.backend->CopyHostToDevice(m.attention_mask(), all.data(), all.size() * sizeof(int32_t));
  const double loss_unmasked = m.Forward(false, 1.0f);
  EXPECT_GT(std::abs(loss_unmasked - loss_b), 1e-4);
}

// Plan == arena peak for both heads and every compute type, with and without checkpointing; the
// checkpointed gradients are bit-identical to the plain run's.
TEST(BertModel, PlanIsExactAndCheckpointingIsBitIdentical) {
  for (const std::string head : {"sequence_classification", "masked_lm"}) {
    const ModelConfig c = TinyBert(head);
    const BertBatch batch = MakeBertBatch(c, 3, 12, 3);
    std::vector<float> plain;
    for (int ck : {0, 1, 2}) {
      for (DType ct : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(head + " checkpoint_every " + std::to_string(ck) + " bf16 " +
                     std::to_string(ct == DType::kBF16));
        ModelOptions opt = TinyOptions(3, 12);
        opt.gradient_checkpointing = ck > 0;
        opt.checkpoint_every = std::max(ck, 1);
        opt.compute_type = ct;
        const MemoryBytes plan = Model::PlanBytes(c, opt);
        TestModel t = TestModel::Make(c, opt);
        ASSERT_NE(t.model, nullptr);
        t.model->InitRandom(9);
        SetBertBatch(t, batch);
        t.model->ZeroGrad();
        const double loss = t.model->Forward(true, 1.0f);
        t.model->Backward();
        EXPECT_TRUE(std::isfinite(loss));
        EXPECT_EQ(t.arena->peak_bytes(), plan.total());
        if (ct != DType::kF32) continue;
        std::vector<float> g = ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
        if (ck == 0) {
          plain = g;
        } else {
          EXPECT_EQ(g, plain) << "checkpointed gradients differ from the plain run";
        }
      }
    }
  }
}

// bf16 against fp32: the same loss and gradients within bf16's rounding.
TEST(BertModel, Bf16FollowsFp32) {
  for (const std::string head : {"sequence_classification", "masked_lm"}) {
    SCOPED_TRACE(head);
    const ModelConfig c = TinyBert(head);
    const BertBatch batch = MakeBertBatch(c, 3, 12, 4);
    double loss[2];
    std::vector<float> grads[2];
    for (int i = 0; i < 2; ++i) {
      ModelOptions opt = TinyOptions(3, 12);
      opt.compute_type = i == 0 ? DType::kF32 : DType::kBF16;
      TestModel t = TestModel::Make(c, opt);
      ASSERT_NE(t.model, nullptr);
      t.model->InitRandom(21);
      SetBertBatch(t, batch);
      t.model->ZeroGrad();
      loss[i] = t.model->Forward(true, 1.0f);
      t.model->Backward();
      grads[i] = ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-2 * std::abs(loss[0]));
    EXPECT_LE(RelErr(grads[1], grads[0]), 3e-2);
  }
}

// bf16 with pack_weights (a cpu job) at 2048 rows: each layer input is packed for its weight
// gradient (PackedActivationBytes); the loss and gradients equal the unpacked model's within fp32
// reassociation (1e-6), and the plan, with the room, is still the measured peak.
TEST(BertModel, PackedInputsTrainAsWithout) {
  // oneDNN's bf16 kernels, which pack, on every AVX-512 CPU (its emulation where the CPU has no
  // bf16 arithmetic; there traind itself widens bf16 to fp32 and packs nothing).
  testing::ScopedBf16GemmNative onednn(true);
  for (const std::string head : {"sequence_classification", "masked_lm"}) {
    SCOPED_TRACE(head);
    const ModelConfig c = TinyBert(head);
    const BertBatch batch = MakeBertBatch(c, 128, 16, 5);
    double loss[2];
    std::vector<float> grads[2];
    for (int pack = 0; pack < 2; ++pack) {
      ModelOptions opt = TinyOptions(128, 16);
      opt.compute_type = DType::kBF16;
      opt.pack_weights = pack == 1;
      EXPECT_EQ(PackedActivationBytes(MakeArchDims(c), opt) > 0, pack == 1);
      const MemoryBytes plan = Model::PlanBytes(c, opt);
      TestModel t = TestModel::Make(c, opt);
      ASSERT_NE(t.model, nullptr);
      t.model->InitRandom(23);
      SetBertBatch(t, batch);
      t.model->ZeroGrad();
      loss[pack] = t.model->Forward(true, 1.0f);
      t.model->Backward();
      EXPECT_EQ(t.arena->peak_bytes(), plan.total());
      grads[pack] = ToHost(*t.backend, t.model->grad_data(), t.model->num_params());
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::abs(loss[0]));
    EXPECT_LT(RelErr(grads[1], grads[0]), 1e-6);
  }
}

// HF names in and out; a checkpoint without the task head (a pretrained base) loads with the head
// newly initialised, and a misshapen tensor is a clear error.
TEST(BertModel, HfNamesRoundTripAndHeadInit) {
  const ModelConfig c = TinyBert("sequence_classification");
  TestModel t = TestModel::Make(c, TinyOptions(2, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(1);
  SafetensorsFile f = t.model->ExportHf();
  for (const char* name : {"bert.embeddings.word_embeddings.weight", "bert.pooler.dense.weight",
                           "bert.encoder.layer.1.attention.self.value.bias", "classifier.weight",
                           "bert.encoder.layer.0.output.LayerNorm.weight"}) {
    EXPECT_TRUE(f.tensors.count(name)) << name;
  }
  EXPECT_EQ(f.tensors.at("bert.embeddings.word_embeddings.weight").shape,
            (std::vector<int64_t>{61, 32}));
  EXPECT_EQ(f.tensors.at("classifier.weight").shape, (std::vector<int64_t>{3, 32}));
  // Round trip.
  TestModel u = TestModel::Make(c, TinyOptions(2, 8));
  ASSERT_TRUE(u.model->LoadHf(f).ok());
  EXPECT_EQ(ToHost(*u.backend, u.model->param_data(), u.model->num_params()),
            ToHost(*t.backend, t.model->param_data(), t.model->num_params()));
  // A base without the head (names without the "bert." prefix, as BertModel files).
  SafetensorsFile base;
  for (const auto& [name, tensor] : f.tensors) {
    if (name.rfind("bert.", 0) == 0 && name.rfind("bert.pooler", 0) != 0) {
      base.tensors[name.substr(5)] = tensor;
    }
  }
  ASSERT_TRUE(u.model->LoadHf(base).ok());
  auto* enc = dynamic_cast<EncoderModel*>(u.model.get());
  ASSERT_NE(enc, nullptr);
  EXPECT_EQ(enc->NewlyInitialized(),
            (std::vector<std::string>{"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                      "classifier.weight", "classifier.bias"}));
  // A base tensor missing or misshapen is an error naming it.
  base.tensors.erase("encoder.layer.0.intermediate.dense.weight");
  Status s = u.model->LoadHf(base);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bert.encoder.layer.0.intermediate.dense.weight"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace traind::engine::testing
