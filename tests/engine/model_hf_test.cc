// HF checkpoint names and layouts of the gpt2 and llama models: ExportHf -> file -> LoadHf round
// trips, the names and shapes HF uses (tied lm_head omitted, real vocab), LoadHf's errors, config
// validation errors, and TrainingFlops against a hand count.
#include <gtest/gtest.h>

#include <cstring>

#include "model_test_util.h"

namespace traind::engine::testing {
namespace {

void RoundTrip(const ModelConfig& c) {
  TestModel a = TestModel::Make(c, TinyOptions(1, 8));
  TestModel b = TestModel::Make(c, TinyOptions(1, 8));
  ASSERT_TRUE(a.model && b.model);
  a.model->InitRandom(21);
  TempDir dir;
  const std::string path = dir.path + "/model.safetensors";
  const SafetensorsFile exported = a.model->ExportHf();
  ASSERT_TRUE(WriteSafetensors(path, exported).ok());
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(b.model->LoadHf(*read).ok());
  const auto pa = ToHost(*a.backend, a.model->param_data(), a.model->num_params());
  const auto pb = ToHost(*b.backend, b.model->param_data(), b.model->num_params());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 4), 0) << "parameters differ";
  const SafetensorsFile again = b.model->ExportHf();
  ASSERT_EQ(again.tensors.size(), exported.tensors.size());
  for (const auto& [name, t] : exported.tensors) {
    EXPECT_EQ(again.tensors.at(name).data, t.data) << name;
  }
}

TEST(ModelHf, Gpt2RoundTripIsExact) { RoundTrip(TinyGpt2()); }
TEST(ModelHf, LlamaRoundTripIsExact) {
  RoundTrip(TinyLlama(false));
  RoundTrip(TinyLlama(true));
}

TEST(ModelHf, Gpt2NamesAndShapes) {
  TestModel t = TestModel::Make(TinyGpt2(), TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(1);
  const SafetensorsFile f = t.model->ExportHf();
  EXPECT_EQ(f.tensors.size(), 2u + 2 * 12 + 2);  // wte wpe, 12 per block, ln_f
  EXPECT_EQ(f.tensors.at("transformer.wte.weight").shape, (std::vector<int64_t>{67, 32}));
  EXPECT_EQ(f.tensors.at("transformer.wpe.weight").shape, (std::vector<int64_t>{24, 32}));
  // Conv1D: (C, 3C) in the file.
  EXPECT_EQ(f.tensors.at("transformer.h.1.attn.c_attn.weight").shape,
            (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(f.tensors.at("transformer.h.0.mlp.c_proj.weight").shape,
            (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(f.tensors.at("transformer.ln_f.bias").dtype, "F32");
  // The transpose: file element (c, o) is the engine's (o, c).
  const ParamInfo* info = nullptr;
  for (const ParamInfo& p : t.model->params()) {
    if (p.hf_name == "transformer.h.1.attn.c_attn.weight") info = &p;
  }
  ASSERT_NE(info, nullptr);
  const auto params = ToHost(*t.backend, t.model->param_data(), t.model->num_params());
  const auto file = f.tensors.at(info->hf_name).ToF32().value();
  EXPECT_EQ(file[5 * 96 + 70], params[info->offset + 70 * 32 + 5]);
}

TEST(ModelHf, LlamaNamesAndShapes) {
  TestModel u = TestModel::Make(TinyLlama(false), TinyOptions(1, 8));
  TestModel t = TestModel::Make(TinyLlama(true), TinyOptions(1, 8));
  ASSERT_TRUE(u.model && t.model);
  const SafetensorsFile fu = u.model->ExportHf();
  const SafetensorsFile ft = t.model->ExportHf();
  EXPECT_EQ(fu.tensors.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(ft.tensors.size(), 1u + 2 * 9 + 1);
  EXPECT_EQ(fu.tensors.at("lm_head.weight").shape, (std::vector<int64_t>{67, 32}));
  EXPECT_EQ(ft.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(fu.tensors.at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));  // GQA: NKV * HS rows
  EXPECT_EQ(fu.tensors.at("model.layers.0.mlp.gate_proj.weight").shape,
            (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(fu.tensors.at("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(fu.tensors.count("model.norm.weight"), 1u);
}

TEST(ModelHf, LoadAcceptsGpt2ModelNamesAndIgnoresExtras) {
  TestModel a = TestModel::Make(TinyGpt2(), TinyOptions(1, 8));
  TestModel b = TestModel::Make(TinyGpt2(), TinyOptions(1, 8));
  ASSERT_TRUE(a.model && b.model);
  a.model->InitRandom(2);
  SafetensorsFile f = a.model->ExportHf();
  SafetensorsFile bare;  // as in the original "gpt2" hub file: no "transformer." prefix
  for (auto& [name, t] : f.tensors) bare.tensors[name.substr(std::strlen("transformer."))] = t;
  std::vector<float> mask(16 * 16, 1.0f);
  bare.tensors["h.0.attn.bias"] = HostTensor::FromF32(mask.data(), {1, 1, 16, 16});
  ASSERT_TRUE(b.model->LoadHf(bare).ok());
  const auto pa = ToHost(*a.backend, a.model->param_data(), a.model->num_params());
  const auto pb = ToHost(*b.backend, b.model->param_data(), b.model->num_params());
  EXPECT_EQ(pa, pb);
}

// BF16 checkpoints load through the fp32 conversion: every parameter is the bf16 value.
TEST(ModelHf, LoadsBf16Checkpoints) {
  TestModel t = TestModel::Make(TinyLlama(false), TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(4);
  const SafetensorsFile f32 = t.model->ExportHf();
  SafetensorsFile bf16;
  for (const auto& [name, tensor] : f32.tensors)
    bf16.tensors[name] = CastTensor(tensor, "BF16").value();
  ASSERT_TRUE(t.model->LoadHf(bf16).ok());
  const SafetensorsFile back = t.model->ExportHf();
  for (const auto& [name, tensor] : f32.tensors) {
    const std::vector<float> orig = tensor.ToF32().value();
    const std::vector<float> got = back.tensors.at(name).ToF32().value();
    for (size_t i = 0; i < orig.size(); ++i) {
      ASSERT_EQ(got[i], BF16ToF32(F32ToBF16(orig[i]))) << name << "[" << i << "]";
    }
  }
}

TEST(ModelHf, LoadErrorsNameTheTensorAndShapes) {
  TestModel t = TestModel::Make(TinyLlama(false), TinyOptions(1, 8));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(3);
  const SafetensorsFile good = t.model->ExportHf();

  SafetensorsFile missing = good;
  missing.tensors.erase("model.layers.1.self_attn.v_proj.weight");
  Status s = t.model->LoadHf(missing);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("model.layers.1.self_attn.v_proj.weight"), std::string::npos)
      << s.message();

  SafetensorsFile no_head = good;
  no_head.tensors.erase("lm_head.weight");
  s = t.model->LoadHf(no_head);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s.message();

  SafetensorsFile wrong = good;
  std::vector<float> z(32 * 40, 0.0f);
  wrong.tensors["model.layers.0.mlp.up_proj.weight"] = HostTensor::FromF32(z.data(), {40, 32});
  s = t.model->LoadHf(wrong);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("model.layers.0.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(s.message().find("[40, 32]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[48, 32]"), std::string::npos) << s.message();

  SafetensorsFile ints = good;
  ints.tensors["model.norm.weight"].dtype = "I32";
  s = t.model->LoadHf(ints);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s.message();

  // A failed load leaves the parameters as they were.
  const auto before = ToHost(*t.backend, t.model->param_data(), t.model->num_params());
  TestModel fresh = TestModel::Make(TinyLlama(false), TinyOptions(1, 8));
  ASSERT_TRUE(fresh.model->LoadHf(good).ok());
  EXPECT_EQ(ToHost(*fresh.backend, fresh.model->param_data(), fresh.model->num_params()), before);
}

TEST(ModelHf, BadConfigsAreInvalidArgumentsNamingTheField) {
  struct Bad {
    ModelConfig c;
    ModelOptions o;
    std::string field;
  };
  std::vector<Bad> bad;
  // An unknown family cannot be a ModelConfig: ParseArch refuses its name (JobSpec, HfConfig).
  ModelConfig c = TinyGpt2();
  c.arch = Arch::kBert;  // no head
  bad.push_back({c, TinyOptions(), "model.head"});
  c = TinyGpt2();
  c.n_head = 5;
  bad.push_back({c, TinyOptions(), "model.config.n_head"});
  c = TinyLlama(false);
  c.num_key_value_heads = 3;
  bad.push_back({c, TinyOptions(), "model.config.num_key_value_heads"});
  c = TinyLlama(false);
  c.vocab_size = 0;
  bad.push_back({c, TinyOptions(), "model.config.vocab_size"});
  bad.push_back({TinyGpt2(), TinyOptions(1, 25), "data.seq_len"});
  for (const Bad& b : bad) {
    auto be = MakeCpuBackend(1);
    DeviceArena arena(be.get(), 0);
    auto m = Model::Create(b.c, b.o, &arena);
    ASSERT_FALSE(m.ok()) << b.field;
    EXPECT_EQ(m.status().code(), Status::Code::kInvalidArgument) << m.status().ToString();
    EXPECT_NE(m.status().message().find(b.field), std::string::npos) << m.status().ToString();
    EXPECT_EQ(arena.used_bytes(), 0);
  }
}

TEST(ModelHf, BudgetTooSmallIsResourceExhausted) {
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 100000);
  auto m = Model::Create(TinyGpt2(), TinyOptions(), &arena);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Status::Code::kResourceExhausted) << m.status().ToString();
}

TEST(ModelFlops, MatchesHandCount) {
  // gpt2 tiny: matmul parameters = wte (as lm_head) + blocks + ln_f (wpe excluded).
  const ModelConfig g = TinyGpt2();
  const double P = 67.0 * 32 + 2 * (12.0 * 32 * 32 + 13 * 32) + 2 * 32;
  EXPECT_DOUBLE_EQ(Model::TrainingFlops(g, 3, 16), (6 * P + 12.0 * 2 * 16 * 32) * 48);
  // llama untied: lm_head counts, embed_tokens does not.
  const ModelConfig l = TinyLlama(false);
  const double per_layer = 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 32 + 3 * 48 * 32;
  const double Pl = 2 * per_layer + 32 + 67 * 32;
  EXPECT_DOUBLE_EQ(Model::TrainingFlops(l, 2, 8), (6 * Pl + 12.0 * 2 * 8 * 32) * 16);
  // GPT-2 124M at T=1024: about 6 * 124M * tokens plus attention.
  ModelConfig big;
  const double per_token = Model::TrainingFlops(big, 1, 1024) / 1024;
  EXPECT_NEAR(per_token / 1e9, (6 * 123.65e6 + 12.0 * 12 * 1024 * 768) / 1e9, 0.01);
}

}  // namespace
}  // namespace traind::engine::testing
