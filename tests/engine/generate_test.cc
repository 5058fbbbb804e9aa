// Generation: the key/value-cache decoder against the training model's full forward (logits at
// every position, greedy decoding token for token), the sampler's rules, and Generate() on model
// folders (a full model, PEFT adapters over a base, errors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "backend/arena.h"
#include "core/safetensors.h"
#include "model_test_util.h"
#include "models/hf_config.h"
#include "models/kv_decoder.h"
#include "traind/engine/generate.h"

namespace traind::engine {
namespace {

using testing::TempDir;
using testing::TestModel;
using testing::TinyGpt2;
using testing::TinyLlama;

// The logits of position pos from a full forward over `ids` (B = 1, T = the model's seq_len; the
// rows after the sequence hold token 0 and do not influence earlier rows: causal attention).
std::vector<float> FullForwardLogits(TestModel& t, const std::vector<int32_t>& ids, int64_t pos) {
  const int64_t T = t.model->options().seq_len;
  std::vector<int32_t> in(static_cast<size_t>(T), 0), tg(static_cast<size_t>(T), 0);
  std::copy(ids.begin(), ids.end(), in.begin());
  t.backend->CopyHostToDevice(t.model->inputs(), in.data(), in.size() * sizeof(int32_t));
  t.backend->CopyHostToDevice(t.model->targets(), tg.data(), tg.size() * sizeof(int32_t));
  t.model->Forward(false, 1.0f);
  const int64_t V = t.model->config().vocab_size;
  std::vector<float> row(static_cast<size_t>(V));
  t.backend->CopyDeviceToHost(row.data(), t.model->logits() + pos * t.model->logits_stride(),
                              row.size() * sizeof(float));
  t.backend->Synchronize();
  return row;
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

class KvDecoderTest : public ::testing::TestWithParam<std::string> {
 protected:
  ModelConfig Config() const {
    if (GetParam() == "gpt2") return TinyGpt2();
    if (GetParam() == "mixtral") {  // the MoE MLP routed per token in the decoder
      ModelConfig c = TinyLlama(false);
      c.arch = Arch::kMixtral;
      c.intermediate_size = 24;
      c.num_local_experts = 4;
      c.num_experts_per_tok = 2;
      return c;
    }
    if (GetParam() == "llama_tied" || GetParam() == "llama_untied") {
      return TinyLlama(GetParam() == "llama_tied");
    }
    // qwen2, mistral (a window of 5 that decoding past position 5 must honour), llama3_rope
    // (the scaled frequencies at every cached position), llama_head_dim, qwen3 (q/k norms on
    // each decoded row), gemma (the embedding scale, 1 + w norms, GeGLU).
    return testing::TinyFamily(GetParam());
  }
};

// Every position's logits from the cache equal the full forward's (float32 reassociation only),
// and greedy decoding with the cache picks the same tokens as re-running the whole sequence.
TEST_P(KvDecoderTest, CachedLogitsAndGreedyTokensEqualTheFullForward) {
  const ModelConfig c = Config();
  const int64_t T = c.max_positions();
  TestModel t = TestModel::Make(c, testing::TinyOptions(1, T));
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(7);
  DeviceArena arena(t.backend.get(), 0);
  auto dec = KvDecoder::Create(c, t.model->param_data(), T, &arena);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();

  std::vector<int32_t> seq = {3, 17, 42};
  std::vector<float> logits;
  for (size_t i = 0; i < seq.size(); ++i) {
    ASSERT_TRUE((*dec)->Step(seq[i], &logits).ok());
    const std::vector<float> want = FullForwardLogits(t, seq, static_cast<int64_t>(i));
    EXPECT_LT(testing::RelErr(logits, want), 2e-6) << "prompt position " << i;
  }
  // Greedy to the end of the positions: cache vs full re-run.
  std::vector<int32_t> cached = seq, rerun = seq;
  while (static_cast<int64_t>(cached.size()) < T) {
    const int32_t next = Argmax(logits);
    const std::vector<float> full =
        FullForwardLogits(t, rerun, static_cast<int64_t>(rerun.size()) - 1);
    EXPECT_LT(testing::RelErr(logits, full), 2e-6) << "position " << rerun.size() - 1;
    rerun.push_back(Argmax(full));
    cached.push_back(next);
    if (static_cast<int64_t>(cached.size()) < T) {
      ASSERT_TRUE((*dec)->Step(next, &logits).ok());
    }
  }
  EXPECT_EQ(cached, rerun);
  // The last token fills the cache.
  EXPECT_EQ((*dec)->length(), T - 1);
  ASSERT_TRUE((*dec)->Step(cached.back(), &logits).ok());
  EXPECT_EQ((*dec)->length(), T);
  EXPECT_EQ((*dec)->Step(1, &logits).code(), Status::Code::kFailedPrecondition);
  // Reset starts over at position 0 with the same logits.
  (*dec)->Reset();
  ASSERT_TRUE((*dec)->Step(seq[0], &logits).ok());
  EXPECT_LT(testing::RelErr(logits, FullForwardLogits(t, seq, 0)), 2e-6);
  EXPECT_EQ((*dec)->Step(static_cast<int32_t>(c.vocab_size), &logits).code(),
            Status::Code::kInvalidArgument);
}

// A bf16 model whose fp32 master weights are off the device (training.offload in bf16) generates
// from its 16-bit compute copy (Model::InferenceWeights: the GEMM weights in bf16, each GEMM's
// input rounded to bf16, embeddings and norms in fp32): the cached logits follow the model's own
// bf16 forward. Bound 2e-2 (relative L2; the GEMMs' rows and attention's
// blocking differ, and each bf16 rounding of an input is 2^-9 relative).
TEST_P(KvDecoderTest, SixteenBitWeightsFollowTheModelsBf16Forward) {
  const ModelConfig c = Config();
  const int64_t T = c.max_positions();
  ModelOptions o = testing::TinyOptions(1, T);
  o.compute_type = DType::kBF16;
  o.master_weights_off_device = true;
  TestModel t = TestModel::Make(c, o);
  ASSERT_NE(t.model, nullptr);
  t.model->InitRandom(7);
  const KvWeights w = t.model->InferenceWeights();
  ASSERT_EQ(w.gemm_type, DType::kBF16) << "the master weights are off the device: bf16 GEMM weights";
  DeviceArena arena(t.backend.get(), 0);
  auto dec = KvDecoder::Create(c, w, T, &arena);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(arena.used_bytes(), KvDecoder::PlanBytes(c, T, DType::kBF16).total());
  std::vector<int32_t> seq = {3, 17, 42, 5, 9, 11};
  std::vector<float> logits;
  double worst = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    ASSERT_TRUE((*dec)->Step(seq[i], &logits).ok());
    const std::vector<float> want = FullForwardLogits(t, seq, static_cast<int64_t>(i));
    const double err = testing::RelErr(logits, want);
    worst = std::max(worst, err);
    double norm = 0;
    for (float v : want) norm += double(v) * v;
    EXPECT_GT(norm, 1e-3) << "the logits must not be empty";
    EXPECT_LT(err, 2e-2) << "position " << i;
  }
  std::printf("[%s] bf16 cached logits vs the bf16 forward: worst rel err %.2e\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Families, KvDecoderTest,
                         ::testing::Values("gpt2", "llama_tied", "llama_untied", "mixtral",
                                           "qwen2", "mistral", "llama3_rope", "llama_head_dim",
                                           "qwen3", "gemma"));

TEST(SampleTokenTest, GreedyTopKTopPAndTheSeed) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f, 0.5f};
  std::mt19937_64 rng(1);
  GenerateOptions o;
  o.temperature = 0;
  EXPECT_EQ(SampleToken(logits, 6, o, &rng), 1);  // the first maximum
  o.temperature = 1;
  o.top_k = 1;
  EXPECT_EQ(SampleToken(logits, 6, o, &rng), 1);
  EXPECT_EQ(SampleToken(logits, 1, o, &rng), 0);  // vocab_limit cuts the candidates
  // top_k = 3: only {1, 4, 2}; top_p = 0.3: only the first maximum (its probability is > 0.3).
  o.top_k = 3;
  std::map<int32_t, int> seen;
  for (int i = 0; i < 3000; ++i) ++seen[SampleToken(logits, 6, o, &rng)];
  EXPECT_EQ(seen.size(), 3u);
  for (const auto& [id, n] : seen) EXPECT_TRUE(id == 1 || id == 4 || id == 2) << id;
  // Frequencies follow softmax over the three (e^2 : e^2 : e^1.9), 3 sigma bounds.
  const double z = 2 * std::exp(2.0) + std::exp(1.9);
  for (int32_t id : {1, 4, 2}) {
    const double p = std::exp(logits[id]) / z, sd = std::sqrt(3000 * p * (1 - p));
    EXPECT_NEAR(seen[id], 3000 * p, 4 * sd) << id;
  }
  o.top_k = 0;
  o.top_p = 0.3;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(logits, 6, o, &rng), 1);
  // Low temperature concentrates on the maxima; the same seed gives the same draws.
  o.top_p = 1;
  o.temperature = 0.01;
  for (int i = 0; i < 50; ++i) {
    const int32_t id = SampleToken(logits, 6, o, &rng);
    EXPECT_TRUE(id == 1 || id == 4) << id;
  }
  o.temperature = 1.5;
  std::mt19937_64 a(99), b(99);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(SampleToken(logits, 6, o, &a), SampleToken(logits, 6, o, &b));
}

// A model folder as a job writes it: config.json + model.safetensors.
void WriteModelDir(Model& m, const std::string& dir) {
  std::ofstream(dir + "/config.json") << WriteHfConfigJson(m.config());
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", m.ExportHf()).ok());
}

TEST(GenerateTest, GreedyFromAFolderMatchesTheDecoderAndIsRepeatable) {
  ModelConfig c = TinyGpt2();
  c.vocab_size = 256;  // the byte tokenizer's ids
  c.n_positions = 40;
  TestModel t = TestModel::Make(c, testing::TinyOptions(1, 40));
  t.model->InitRandom(11);
  TempDir dir;
  WriteModelDir(*t.model, dir.path);

  GenerateOptions o;
  o.model_dir = dir.path;
  o.prompt = "ROMEO:";
  o.max_new_tokens = 12;
  o.temperature = 0;
  o.stop_at_eos = false;
  DeviceOptions dev;
  dev.threads = 2;
  auto r = Generate(o, dev);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->device, "cpu");
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{'R', 'O', 'M', 'E', 'O', ':'}));
  ASSERT_EQ(r->ids.size(), 12u);
  EXPECT_EQ(r->finish_reason, "length");
  // The same greedy tokens from the full forward re-run.
  std::vector<int32_t> seq = r->prompt_ids;
  for (size_t i = 0; i < r->ids.size(); ++i) {
    seq.push_back(Argmax(FullForwardLogits(t, seq, static_cast<int64_t>(seq.size()) - 1)));
    EXPECT_EQ(seq.back(), r->ids[i]) << "new token " << i;
  }
  auto again = Generate(o, dev);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ids, r->ids);
  // Sampling: the seed decides; the text is valid UTF-8 even when bytes are cut.
  o.temperature = 1.0;
  o.seed = 5;
  auto s1 = Generate(o, dev), s2 = Generate(o, dev);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->ids, s2->ids);
  o.seed = 6;
  auto s3 = Generate(o, dev);
  ASSERT_TRUE(s3.ok());
  EXPECT_NE(s1->ids, s3->ids);
  for (const auto* g : {&*s1, &*s3}) {
    std::string bytes(g->ids.begin(), g->ids.end());
    const bool ascii = std::all_of(g->ids.begin(), g->ids.end(), [](int32_t b) { return b < 128; });
    if (ascii) {
      EXPECT_EQ(g->text, bytes);
    }
    // Bytes >= 0x80 that do not form UTF-8 become U+FFFD, so the text is never raw bytes.
    for (size_t i = 0; i < g->text.size(); ++i) {
      const unsigned char ch = static_cast<unsigned char>(g->text[i]);
      if (ch >= 0x80) {
        EXPECT_GE(ch, 0xC2) << "a continuation byte or overlong lead at " << i;
        break;
      }
    }
  }
  // The positions end the generation: 40 - 6 = 34 new tokens at most.
  o.max_new_tokens = 100;
  auto longer = Generate(o, dev);
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->ids.size(), 34u);
  EXPECT_EQ(longer->finish_reason, "max_positions");
}

TEST(GenerateTest, AdaptersOverABaseGenerateAsTheMergedModel) {
  ModelConfig c = TinyLlama(false);
  c.vocab_size = 256;
  ModelOptions lo = testing::TinyOptions(1, 8);
  lo.lora.r = 4;
  lo.lora.alpha = 8;
  TestModel t = TestModel::Make(c, lo);
  t.model->InitRandom(3);
  // Random, non-zero adapters (InitAdapters leaves B at zero: the merge would change nothing).
  SafetensorsFile ad = t.model->ExportAdapters();
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  for (auto& [name, tensor] : ad.tensors) {
    auto v = tensor.ToF32();
    ASSERT_TRUE(v.ok());
    for (float& x : *v) x = u(rng);
    tensor = HostTensor::FromF32(v->data(), tensor.shape);
  }
  ASSERT_TRUE(t.model->LoadAdapters(ad).ok());
  TempDir base, adapters, merged;
  WriteModelDir(*t.model, base.path);  // ExportHf: the base weights only
  std::ofstream(adapters.path + "/config.json") << WriteHfConfigJson(c);
  ASSERT_TRUE(WriteSafetensors(adapters.path + "/adapter_model.safetensors", ad).ok());
  std::ofstream(adapters.path + "/adapter_config.json")
      << "{\"base_model_name_or_path\": \"" << base.path
      << "\", \"r\": 4, \"lora_alpha\": 8, \"fan_in_fan_out\": false, \"peft_type\": \"LORA\"}";
  std::ofstream(merged.path + "/config.json") << WriteHfConfigJson(c);
  ASSERT_TRUE(WriteSafetensors(merged.path + "/model.safetensors", t.model->ExportMerged()).ok());

  GenerateOptions o;
  o.prompt = "to be";
  o.max_new_tokens = 10;
  o.temperature = 0.8;
  o.seed = 3;
  o.stop_at_eos = false;
  DeviceOptions dev;
  o.model_dir = adapters.path;
  auto from_adapters = Generate(o, dev);
  o.model_dir = merged.path;
  auto from_merged = Generate(o, dev);
  o.model_dir = base.path;
  auto from_base = Generate(o, dev);
  ASSERT_TRUE(from_adapters.ok()) << from_adapters.status().ToString();
  ASSERT_TRUE(from_merged.ok() && from_base.ok());
  EXPECT_EQ(from_adapters->ids, from_merged->ids);
  EXPECT_NE(from_adapters->ids, from_base->ids);  // the adapters matter
}

TEST(GenerateTest, BadInputIsOneClearError) {
  GenerateOptions o;
  o.model_dir = "/nonexistent/traind-model";
  o.prompt = "hi";
  DeviceOptions dev;
  auto r = Generate(o, dev);
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/traind-model"), std::string::npos);
  TempDir empty;
  o.model_dir = empty.path;
  EXPECT_EQ(Generate(o, dev).status().code(), Status::Code::kNotFound);  // no config.json
  std::ofstream(empty.path + "/config.json") << WriteHfConfigJson(TinyGpt2());
  r = Generate(o, dev);
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos);

  o.max_new_tokens = 0;
  EXPECT_NE(ValidateGenerateOptions(o).message().find("--max-new-tokens"), std::string::npos);
  o.max_new_tokens = 1;
  o.top_p = 0;
  EXPECT_NE(ValidateGenerateOptions(o).message().find("--top-p"), std::string::npos);
  o.top_p = 1;
  o.temperature = -1;
  EXPECT_NE(ValidateGenerateOptions(o).message().find("--temperature"), std::string::npos);
  o.temperature = 1;
  o.top_k = -2;
  EXPECT_NE(ValidateGenerateOptions(o).message().find("--top-k"), std::string::npos);

  // A prompt as long as the positions, and token ids the model does not have.
  ModelConfig c = TinyGpt2();
  c.vocab_size = 256;
  TestModel t = TestModel::Make(c, testing::TinyOptions(1, 24));
  t.model->InitRandom(1);
  TempDir dir;
  WriteModelDir(*t.model, dir.path);
  o.top_k = 0;
  o.model_dir = dir.path;
  o.prompt = std::string(24, 'a');
  r = Generate(o, dev);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("positions"), std::string::npos);
  ModelConfig small = TinyGpt2();  // vocab 67: 'z' (122) is beyond it
  TestModel s = TestModel::Make(small, testing::TinyOptions(1, 24));
  s.model->InitRandom(1);
  TempDir sdir;
  WriteModelDir(*s.model, sdir.path);
  o.model_dir = sdir.path;
  o.prompt = "z";
  r = Generate(o, dev);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("vocab_size"), std::string::npos);
}

}  // namespace
}  // namespace traind::engine
