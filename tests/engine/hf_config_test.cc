// HF config.json tests: real HF configs (gpt2, a llama with GQA) read correctly, our written
// configs read back to the same ModelConfig, and unsupported math-changing keys are rejected.
#include "models/hf_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The config.json of HF's `gpt2` (124M) checkpoint, verbatim.
constexpr char kGpt2Config[] = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

// The config.json of HF's `bert-base-uncased`, verbatim, with the classification head's
// architecture and labels as a fine-tuned checkpoint (transformers 4.x) writes them.
constexpr char kBertConfig[] = R"({
  "architectures": ["BertForSequenceClassification"],
  "attention_probs_dropout_prob": 0.1,
  "classifier_dropout": null,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "label2id": {"negative": 0, "neutral": 1, "positive": 2},
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "problem_type": "single_label_classification",
  "transformers_version": "4.6.0.dev0",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
})";

// A TinyLlama-1.1B style config (GQA 32/4), as transformers 4.3x writes it.
constexpr char kLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

class HfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("traind_hf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string p = (dir_ / "config.json").string();
    std::ofstream(p) << text;
    return p;
  }
  // kGpt2Config / kLlamaConfig with one key replaced (or added); null `value` erases it.
  std::string Patched(const char* base, const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(base);
    if (value.is_discarded()) j.erase(key);
    else j[key] = value;
    return Write(j.dump());
  }
  fs::path dir_;
};

TEST_F(HfConfigTest, ReadsHfGpt2Config) {
  Result<ModelConfig> c = ReadHfConfig(Write(kGpt2Config));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, "gpt2");
  EXPECT_EQ(c->vocab_size, 50257);
  EXPECT_EQ(c->n_positions, 1024);
  EXPECT_EQ(c->n_embd, 768);
  EXPECT_EQ(c->n_layer, 12);
  EXPECT_EQ(c->n_head, 12);
  EXPECT_DOUBLE_EQ(c->layer_norm_epsilon, 1e-5);
  EXPECT_TRUE(c->tied_embeddings());
}

TEST_F(HfConfigTest, ReadsHfLlamaConfigWithGqa) {
  Result<ModelConfig> c = ReadHfConfig(Write(kLlamaConfig));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->num_hidden_layers, 22);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  // Absent num_key_value_heads means no grouping (HF's rule).
  c = ReadHfConfig(Patched(kLlamaConfig, "num_key_value_heads", nlohmann::json::value_t::discarded));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_key_value_heads, 32);
}

void ExpectSame(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_positions(), b.max_positions());
  EXPECT_EQ(a.channels(), b.channels());
  EXPECT_EQ(a.num_layers(), b.num_layers());
  EXPECT_EQ(a.num_heads(), b.num_heads());
  EXPECT_EQ(a.num_kv_heads(), b.num_kv_heads());
  EXPECT_EQ(a.tied_embeddings(), b.tied_embeddings());
  if (a.arch == "gpt2") {
    EXPECT_EQ(a.layer_norm_epsilon, b.layer_norm_epsilon);
  } else {
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
    EXPECT_EQ(a.rope_theta, b.rope_theta);
  }
}

TEST_F(HfConfigTest, WrittenConfigsReadBackIdentically) {
  ModelConfig g;
  g.vocab_size = 256;
  g.n_positions = 128;
  g.n_embd = 64;
  g.n_layer = 2;
  g.n_head = 4;
  g.layer_norm_epsilon = 1.5e-5;
  ModelConfig l;
  l.arch = "llama";
  l.vocab_size = 300;
  l.hidden_size = 96;
  l.intermediate_size = 200;
  l.num_hidden_layers = 3;
  l.num_attention_heads = 6;
  l.num_key_value_heads = 2;
  l.rms_norm_eps = 1e-6;
  l.rope_theta = 500000.0;
  l.max_position_embeddings = 64;
  l.tie_word_embeddings = true;
  for (const ModelConfig& c : {g, l}) {
    const std::string text = WriteHfConfigJson(c);
    Result<ModelConfig> back = ReadHfConfig(Write(text));
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
    ExpectSame(c, *back);
    EXPECT_EQ(WriteHfConfigJson(*back), text);
    nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_EQ(j["torch_dtype"], "float32");
    EXPECT_EQ(j["model_type"], c.arch);
  }
  nlohmann::json gj = nlohmann::json::parse(WriteHfConfigJson(g));
  EXPECT_EQ(gj["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(gj["activation_function"], "gelu_new");
  EXPECT_EQ(gj["n_ctx"], 128);
  EXPECT_EQ(gj["bos_token_id"], 255);  // vocab_size - 1 when the vocab is smaller than GPT-2's
  EXPECT_EQ(gj["resid_pdrop"], 0.0);
  EXPECT_EQ(nlohmann::json::parse(WriteHfConfigJson(ModelConfig{}))["eos_token_id"], 50256);
  nlohmann::json lj = nlohmann::json::parse(WriteHfConfigJson(l));
  EXPECT_EQ(lj["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(lj["hidden_act"], "silu");
  EXPECT_TRUE(lj["rope_scaling"].is_null());
}

struct Reject {
  const char* base;
  const char* key;
  nlohmann::json value;
  const char* want;
};

TEST_F(HfConfigTest, RejectsWhatWouldChangeTheMath) {
  const std::vector<Reject> cases = {
      {kGpt2Config, "activation_function", "relu", "activation_function: \"relu\" is not supported"},
      {kGpt2Config, "n_inner", 1000, "n_inner: 1000 is not supported"},
      {kGpt2Config, "scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx"},
      {kGpt2Config, "tie_word_embeddings", false, "gpt2 always ties"},
      {kGpt2Config, "n_head", 7, "n_embd 768 is not divisible by n_head 7"},
      {kGpt2Config, "n_embd", "768", "n_embd: expected an integer"},
      {kGpt2Config, "vocab_size", 0, "vocab_size: must be >= 1"},
      {kGpt2Config, "model_type", "t5", "model_type: 't5' is not supported (gpt2 | llama | bert | mixtral)"},
      {kBertConfig, "hidden_act", "gelu_new", "hidden_act: \"gelu_new\" is not supported"},
      {kBertConfig, "position_embedding_type", "relative_key", "position_embedding_type"},
      {kBertConfig, "problem_type", "multi_label_classification", "problem_type"},
      {kBertConfig, "is_decoder", true, "is_decoder: true is not supported"},
      {kBertConfig, "num_attention_heads", 7, "hidden_size 768 is not divisible"},
      {kBertConfig, "pad_token_id", 40000, "pad_token_id: 40000 is not a token id"},
      {kLlamaConfig, "hidden_act", "gelu", "hidden_act: \"gelu\" is not supported"},
      {kLlamaConfig, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}},
       "rope_scaling: {\"factor\":2.0,\"type\":\"linear\"} is not supported"},
      {kLlamaConfig, "attention_bias", true, "attention_bias: true is not supported"},
      {kLlamaConfig, "mlp_bias", true, "mlp_bias"},
      {kLlamaConfig, "head_dim", 128, "head_dim: 128 is not supported"},
      {kLlamaConfig, "num_key_value_heads", 5, "num_attention_heads 32 is not divisible by "
                                               "num_key_value_heads 5"},
      {kLlamaConfig, "hidden_size", 2080, "head size hidden_size / num_attention_heads = 65"},
      {kLlamaConfig, "tie_word_embeddings", "no", "tie_word_embeddings: expected true or false"},
  };
  for (const Reject& c : cases) {
    const std::string path = Patched(c.base, c.key, c.value);
    Result<ModelConfig> r = ReadHfConfig(path);
    ASSERT_FALSE(r.ok()) << c.key << " " << c.value.dump();
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(path)) << c.key;
    EXPECT_THAT(r.status().message(), HasSubstr(c.want)) << c.key;
  }
  // Accepted: the math-neutral spelling of the same activation, and a matching head_dim.
  EXPECT_TRUE(ReadHfConfig(Patched(kGpt2Config, "activation_function", "gelu_pytorch_tanh")).ok());
  EXPECT_TRUE(ReadHfConfig(Patched(kLlamaConfig, "head_dim", 64)).ok());
}

TEST_F(HfConfigTest, BertReadsAndRoundTrips) {
  Result<ModelConfig> r = ReadHfConfig(Write(kBertConfig));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, "bert");
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.num_kv_heads(), 12);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-12);
  EXPECT_EQ(c.head, "sequence_classification");
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.id2label, (std::vector<std::string>{"negative", "neutral", "positive"}));
  // Written back: transformers' keys, labels both ways, dropout 0 (traind trains without it).
  const nlohmann::json j = nlohmann::json::parse(WriteHfConfigJson(c));
  EXPECT_EQ(j["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(j["label2id"]["positive"], 2);
  EXPECT_EQ(j["id2label"]["1"], "neutral");
  EXPECT_EQ(j["hidden_dropout_prob"], 0.0);
  Result<ModelConfig> back = ReadHfConfig(Write(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->head, c.head);
  EXPECT_EQ(back->id2label, c.id2label);
  EXPECT_EQ(back->hidden_size, c.hidden_size);
  EXPECT_DOUBLE_EQ(back->layer_norm_eps, c.layer_norm_eps);
  // masked_lm; a BertModel file (no head) reads with the head left to the job spec.
  ModelConfig mlm = c;
  mlm.head = "masked_lm";
  const nlohmann::json jm = nlohmann::json::parse(WriteHfConfigJson(mlm));
  EXPECT_EQ(jm["architectures"][0], "BertForMaskedLM");
  EXPECT_FALSE(jm.contains("label2id"));
  Result<ModelConfig> base = ReadHfConfig(Patched(kBertConfig, "architectures", {"BertModel"}));
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  EXPECT_EQ(base->head, "");
}

// Mixtral-8x7B-v0.1's config.json (transformers 4.36), verbatim.
constexpr char kMixtralConfig[] = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

TEST_F(HfConfigTest, MixtralReadsAndRoundTrips) {
  Result<ModelConfig> r = ReadHfConfig(Write(kMixtralConfig));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->arch, "mixtral");
  EXPECT_EQ(r->num_local_experts, 8);
  EXPECT_EQ(r->num_experts_per_tok, 2);
  EXPECT_DOUBLE_EQ(r->router_aux_loss_coef, 0.02);
  EXPECT_FALSE(r->output_router_logits);
  EXPECT_EQ(r->num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);
  EXPECT_EQ(r->max_position_embeddings, 32768);
  ModelConfig c = *r;
  c.output_router_logits = true;
  Result<ModelConfig> back = ReadHfConfig(Write(WriteHfConfigJson(c)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->output_router_logits);
  EXPECT_EQ(back->num_local_experts, 8);
  EXPECT_DOUBLE_EQ(back->router_aux_loss_coef, 0.02);
  Result<ModelConfig> bad = ReadHfConfig(Patched(kMixtralConfig, "sliding_window", 4096));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("sliding_window: 4096 is not supported"));
  bad = ReadHfConfig(Patched(kMixtralConfig, "num_experts_per_tok", 9));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("num_experts_per_tok: 9 exceeds"));
}

TEST_F(HfConfigTest, MissingOrMalformedFiles) {
  Result<ModelConfig> r = ReadHfConfig((dir_ / "none.json").string());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  r = ReadHfConfig(Write("{\"model_type\": \"gpt2\", "));
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("not a JSON object"));
  r = ReadHfConfig(Write("{\"n_embd\": 8}"));
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("model_type: missing"));
}

}  // namespace
}  // namespace traind::engine
