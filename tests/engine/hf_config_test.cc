// HF config.json tests: real HF configs (gpt2, a llama with GQA) read correctly, our written
// configs read back to the same ModelConfig, and unsupported math-changing keys are rejected.
#include "models/hf_config.h"

#include <unistd.h>

#include <algorithm>
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
  EXPECT_EQ(c->arch, Arch::kGpt2);
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
  EXPECT_EQ(c->arch, Arch::kLlama);
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
  if (a.arch == Arch::kGpt2) {
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
  l.arch = Arch::kLlama;
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
    EXPECT_EQ(j["model_type"], ArchName(c.arch));
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
      {kGpt2Config, "model_type", "t5", "model_type: 't5' is not supported (gpt2, llama, mistral, qwen2, qwen3, gemma, bert, mixtral)"},
      {kBertConfig, "hidden_act", "gelu_new", "hidden_act: \"gelu_new\" is not supported"},
      {kBertConfig, "position_embedding_type", "relative_key", "position_embedding_type"},
      {kBertConfig, "problem_type", "multi_label_classification", "problem_type"},
      {kBertConfig, "is_decoder", true, "is_decoder: true is not supported"},
      {kBertConfig, "num_attention_heads", 7, "hidden_size 768 is not divisible"},
      {kBertConfig, "pad_token_id", 40000, "pad_token_id: 40000 is not a token id"},
      {kLlamaConfig, "hidden_act", "gelu", "hidden_act: \"gelu\" is not supported"},
      {kLlamaConfig, "rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}},
       "rope_scaling: rope_type 'dynamic' is not supported"},
      {kLlamaConfig, "rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}},
       "rope_parameters: rope_type 'yarn' is not supported"},
      {kLlamaConfig, "rope_scaling", {{"rope_type", "linear"}}, "rope_scaling.factor: required"},
      {kLlamaConfig, "attention_bias", "yes", "attention_bias: expected true or false"},
      {kLlamaConfig, "mlp_bias", true, "mlp_bias"},
      {kLlamaConfig, "head_dim", 63, "the head size 63 must be even"},
      {kLlamaConfig, "partial_rotary_factor", 0.5, "partial_rotary_factor"},
      {kLlamaConfig, "num_key_value_heads", 5, "num_attention_heads 32 is not divisible by "
                                               "num_key_value_heads 5"},
      {kLlamaConfig, "hidden_size", 2080, "the head size 65 must be even"},
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
  Result<ModelConfig> hd = ReadHfConfig(Patched(kLlamaConfig, "head_dim", 128));
  ASSERT_TRUE(hd.ok()) << hd.status().ToString();
  EXPECT_EQ(hd->head_size(), 128);
}

TEST_F(HfConfigTest, BertReadsAndRoundTrips) {
  Result<ModelConfig> r = ReadHfConfig(Write(kBertConfig));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::kBert);
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
  EXPECT_EQ(r->arch, Arch::kMixtral);
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
  Result<ModelConfig> windowed = ReadHfConfig(Patched(kMixtralConfig, "sliding_window", 4096));
  ASSERT_TRUE(windowed.ok()) << windowed.status().ToString();
  EXPECT_EQ(windowed->sliding_window, 4096);
  EXPECT_EQ(r->sliding_window, 0);
  Result<ModelConfig> bad = ReadHfConfig(Patched(kMixtralConfig, "num_experts_per_tok", 9));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("num_experts_per_tok: 9 exceeds"));
}

// Llama-3.2-1B's config.json (transformers 4.45), verbatim: head_dim, llama3 rope_scaling, tied.
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen2.5-0.5B's config.json, verbatim: q/k/v biases are implied by the family.
constexpr char kQwen25Config[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Mistral-7B-v0.1's config.json, verbatim: a 4096-token sliding window.
constexpr char kMistralConfig[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Qwen3-0.6B's config.json: head_dim 128 (NH*HS = 2048 != hidden_size), q_norm / k_norm implied
// by the family, null rope_scaling and sliding_window.
constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// gemma-2b's config.json: multi-query attention, head_dim 256, hidden_activation (the GELU the
// model uses; older transformers ignore hidden_act "gelu" beside it).
constexpr char kGemmaConfig[] = R"({
  "architectures": ["GemmaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 2,
  "eos_token_id": 1,
  "head_dim": 256,
  "hidden_act": "gelu",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 16384,
  "max_position_embeddings": 8192,
  "model_type": "gemma",
  "num_attention_heads": 8,
  "num_hidden_layers": 18,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.38.0.dev0",
  "use_cache": true,
  "vocab_size": 256000
})";

TEST_F(HfConfigTest, Qwen3AndGemmaReadAsHfDoes) {
  Result<ModelConfig> q = ReadHfConfig(Write(kQwen3Config));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->arch, Arch::kQwen3);
  EXPECT_EQ(q->head_size(), 128);
  EXPECT_EQ(q->num_key_value_heads, 8);
  EXPECT_EQ(q->sliding_window, 0);
  EXPECT_TRUE(q->tied_embeddings());
  EXPECT_DOUBLE_EQ(q->rope_theta, 1e6);
  Result<ModelConfig> qw = ReadHfConfig(Patched(kQwen3Config, "use_sliding_window", true));
  ASSERT_FALSE(qw.ok());
  EXPECT_THAT(qw.status().message(), HasSubstr("use_sliding_window"));
  // Qwen3Config's head_dim default is 128, not hidden_size / heads.
  Result<ModelConfig> qd =
      ReadHfConfig(Patched(kQwen3Config, "head_dim", nlohmann::json::value_t::discarded));
  ASSERT_TRUE(qd.ok()) << qd.status().ToString();
  EXPECT_EQ(qd->head_size(), 128);

  Result<ModelConfig> g = ReadHfConfig(Write(kGemmaConfig));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->arch, Arch::kGemma);
  EXPECT_EQ(g->head_size(), 256);
  EXPECT_EQ(g->num_key_value_heads, 1);
  EXPECT_TRUE(g->tied_embeddings());
  // The activation is tanh GELU whichever key names it; an exact GELU is refused, naming the key.
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    nlohmann::json j = nlohmann::json::parse(kGemmaConfig);
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["hidden_act"] = "gelu_pytorch_tanh";
    j[key] = "relu";
    Result<ModelConfig> bad = ReadHfConfig(Write(j.dump()));
    ASSERT_FALSE(bad.ok()) << key;
    EXPECT_THAT(bad.status().message(), HasSubstr(key));
  }
  Result<ModelConfig> gd = ReadHfConfig(Patched(kGemmaConfig, "hidden_activation", nullptr));
  EXPECT_FALSE(gd.ok()) << "hidden_act gelu without hidden_activation is ambiguous across "
                           "transformers versions (exact GELU in the newest)";
  // The model_type is enough: GemmaConfig's defaults fill the rest (gemma-7b's shape).
  Result<ModelConfig> g7 = ReadHfConfig(Write(R"({"model_type": "gemma"})"));
  ASSERT_TRUE(g7.ok()) << g7.status().ToString();
  EXPECT_EQ(g7->hidden_size, 3072);
  EXPECT_EQ(g7->head_size(), 256);
  EXPECT_EQ(g7->vocab_size, 256000);
}

TEST_F(HfConfigTest, LlamaLikeFamiliesReadAsHfDoes) {
  Result<ModelConfig> l = ReadHfConfig(Write(kLlama32Config));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->arch, Arch::kLlama);
  EXPECT_EQ(l->head_size(), 64);
  EXPECT_EQ(l->rope_scaling.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(l->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(l->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(l->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(l->rope_theta, 500000.0);
  EXPECT_TRUE(l->tied_embeddings());
  EXPECT_FALSE(l->attention_bias);

  Result<ModelConfig> q = ReadHfConfig(Write(kQwen25Config));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->arch, Arch::kQwen2);
  EXPECT_EQ(q->num_key_value_heads, 2);
  EXPECT_EQ(q->head_size(), 64);
  EXPECT_EQ(q->sliding_window, 0);  // use_sliding_window false: full attention
  EXPECT_EQ(q->vocab_size, 151936);
  Result<ModelConfig> qw = ReadHfConfig(Patched(kQwen25Config, "use_sliding_window", true));
  ASSERT_FALSE(qw.ok());
  EXPECT_THAT(qw.status().message(), HasSubstr("use_sliding_window: true is not supported"));

  Result<ModelConfig> m = ReadHfConfig(Write(kMistralConfig));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->arch, Arch::kMistral);
  EXPECT_EQ(m->sliding_window, 4096);
  Result<ModelConfig> m3 = ReadHfConfig(Patched(kMistralConfig, "sliding_window", nullptr));
  ASSERT_TRUE(m3.ok()) << m3.status().ToString();
  EXPECT_EQ(m3->sliding_window, 0);  // Mistral-7B-v0.3: null, full attention
  // HF's defaults where the file is silent: MistralConfig's num_key_value_heads is 8.
  Result<ModelConfig> md =
      ReadHfConfig(Patched(kMistralConfig, "num_key_value_heads", nlohmann::json::value_t::discarded));
  ASSERT_TRUE(md.ok());
  EXPECT_EQ(md->num_key_value_heads, 8);

  // rope_parameters (newer transformers) is read like rope_scaling, rope_theta included.
  nlohmann::json rp = nlohmann::json::parse(kLlama32Config);
  rp["rope_parameters"] = rp["rope_scaling"];
  rp["rope_parameters"]["rope_theta"] = 250000.0;
  rp.erase("rope_scaling");
  rp.erase("rope_theta");
  Result<ModelConfig> p = ReadHfConfig(Write(rp.dump()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->rope_scaling, l->rope_scaling);
  EXPECT_DOUBLE_EQ(p->rope_theta, 250000.0);
  // Written back in the same spelling, with the same values.
  const nlohmann::json pw = nlohmann::json::parse(WriteHfConfigJson(*p));
  EXPECT_FALSE(pw.contains("rope_scaling"));
  EXPECT_EQ(pw["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(pw["rope_parameters"]["rope_theta"], 250000.0);
}

// Exported and loaded again, a config.json keeps every key of the file it came from (token ids,
// transformers_version, max_window_layers, ...) and writes byte-identically the second time.
TEST_F(HfConfigTest, OutputsKeepEveryKeyAndRoundTripByteIdentically) {
  for (const char* text : {kLlama32Config, kQwen25Config, kMistralConfig, kMixtralConfig,
                           kLlamaConfig, kGpt2Config, kBertConfig, kQwen3Config, kGemmaConfig}) {
    Result<ModelConfig> c = ReadHfConfig(Write(text));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::string out = WriteHfConfigJson(*c);
    const nlohmann::json src = nlohmann::json::parse(text), o = nlohmann::json::parse(out);
    for (auto it = src.begin(); it != src.end(); ++it) {
      EXPECT_TRUE(o.contains(it.key())) << c->arch << ": " << it.key() << " lost";
      if (it.key() == "bos_token_id" || it.key() == "eos_token_id" ||
          it.key() == "transformers_version" || it.key() == "rope_scaling") {
        EXPECT_EQ(o[it.key()], it.value()) << c->arch << ": " << it.key();
      }
    }
    EXPECT_EQ(o["torch_dtype"], "float32");  // the weights traind writes
    Result<ModelConfig> back = ReadHfConfig(Write(out));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(WriteHfConfigJson(*back), out) << c->arch;
  }
  // qwen3 and gemma write their class names; gemma also hidden_activation, the key transformers
  // 4.38-4.4x read for its GELU (hidden_act the newest read), both the tanh GELU.
  ModelConfig q3 = *ReadHfConfig(Write(kQwen3Config));
  EXPECT_EQ(q3.arch, Arch::kQwen3);
  EXPECT_EQ(nlohmann::json::parse(WriteHfConfigJson(q3))["architectures"][0], "Qwen3ForCausalLM");
  ModelConfig ge = *ReadHfConfig(Write(kGemmaConfig));
  EXPECT_EQ(ge.arch, Arch::kGemma);
  const nlohmann::json gw = nlohmann::json::parse(WriteHfConfigJson(ge));
  EXPECT_EQ(gw["architectures"][0], "GemmaForCausalLM");
  EXPECT_EQ(gw["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(gw["hidden_act"], "gelu_pytorch_tanh");
  // qwen2 writes its class names; llama its attention_bias.
  ModelConfig q = *ReadHfConfig(Write(kQwen25Config));
  EXPECT_EQ(nlohmann::json::parse(WriteHfConfigJson(q))["architectures"][0], "Qwen2ForCausalLM");
  ModelConfig lb = *ReadHfConfig(Patched(kLlamaConfig, "attention_bias", true));
  EXPECT_TRUE(lb.attention_bias);
  EXPECT_EQ(nlohmann::json::parse(WriteHfConfigJson(lb))["attention_bias"], true);
}

// Every key of each llama-like family's HF config class (transformers' LlamaConfig,
// MistralConfig, Qwen2Config, MixtralConfig __init__ arguments) is either modelled (a changed
// value changes the model traind builds), refused (a value traind does not implement is an error
// naming the key), or neutral (bookkeeping that cannot change the arithmetic: token ids, init
// range, the cache; dropouts: traind trains without dropout and its output config.json says so).
struct ClassKey {
  const char* key;
  nlohmann::json value;  // a value other than the file's
  enum Kind { kModelled, kRefused, kNeutral } kind;
};

std::string Arithmetic(const ModelConfig& c) {
  nlohmann::json j = {ArchName(c.arch), c.vocab_size, c.hidden_size, c.intermediate_size,
                      c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                      c.head_size(), c.rms_norm_eps, c.rope_theta, c.max_position_embeddings,
                      c.tie_word_embeddings, c.attention_bias, c.sliding_window,
                      c.rope_scaling.rope_type, c.rope_scaling.factor,
                      c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
                      c.rope_scaling.original_max_position_embeddings, c.num_local_experts,
                      c.num_experts_per_tok, c.router_aux_loss_coef, c.output_router_logits};
  return j.dump();
}

TEST_F(HfConfigTest, EveryKeyOfTheHfConfigClassesIsModelledRefusedOrNeutral) {
  using K = ClassKey;
  const nlohmann::json linear = {{"rope_type", "linear"}, {"factor", 2.0}};
  const std::vector<K> common = {
      {"vocab_size", 32001, K::kModelled},
      {"hidden_size", 1792, K::kModelled},  // divisible by 14 and 32 heads
      {"intermediate_size", 999, K::kModelled},
      {"num_hidden_layers", 3, K::kModelled},
      {"num_attention_heads", 16, K::kModelled},
      {"num_key_value_heads", 1, K::kModelled},
      {"hidden_act", "relu", K::kRefused},
      {"max_position_embeddings", 77, K::kModelled},
      {"initializer_range", 0.5, K::kNeutral},
      {"rms_norm_eps", 1e-3, K::kModelled},
      {"use_cache", false, K::kNeutral},
      {"pad_token_id", 5, K::kNeutral},
      {"bos_token_id", 6, K::kNeutral},
      {"eos_token_id", 7, K::kNeutral},
      {"tie_word_embeddings", true, K::kModelled},
      {"rope_theta", 1234.0, K::kModelled},
      {"attention_dropout", 0.1, K::kNeutral},
      {"head_dim", 96, K::kModelled},
  };
  struct Family {
    const char* base;
    std::vector<K> keys;
  };
  const std::vector<Family> families = {
      {kLlama32Config,
       {{"rope_scaling", linear, K::kModelled},
        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}}, K::kRefused},
        {"attention_bias", true, K::kModelled},
        {"mlp_bias", true, K::kRefused},
        {"pretraining_tp", 2, K::kNeutral}}},
      {kMistralConfig, {{"sliding_window", 128, K::kModelled}}},
      {kQwen25Config,
       {{"rope_scaling", linear, K::kModelled},
        {"use_sliding_window", true, K::kRefused},
        {"sliding_window", 128, K::kNeutral},      // only with use_sliding_window
        {"max_window_layers", 3, K::kNeutral},     // likewise
        {"attention_bias", true, K::kRefused}}},
      {kQwen3Config,
       {{"rope_scaling", linear, K::kModelled},
        {"use_sliding_window", true, K::kRefused},
        {"sliding_window", 128, K::kNeutral},
        {"max_window_layers", 3, K::kNeutral},
        {"attention_bias", true, K::kModelled},
        {"num_attention_heads", 32, K::kModelled}}},  // Qwen3-0.6B has common's 16
      {kGemmaConfig,
       {{"rope_scaling", linear, K::kModelled},
        {"num_key_value_heads", 2, K::kModelled},  // gemma-2b has common's 1
        {"hidden_activation", "gelu", K::kRefused},
        {"attention_bias", true, K::kModelled}}},
      {kMixtralConfig,
       {{"sliding_window", 128, K::kModelled},
        {"num_experts_per_tok", 1, K::kModelled},
        {"num_local_experts", 4, K::kModelled},
        {"output_router_logits", true, K::kModelled},
        {"router_aux_loss_coef", 0.5, K::kModelled},
        {"router_jitter_noise", 0.1, K::kRefused}}},
  };
  for (const Family& f : families) {
    Result<ModelConfig> base = ReadHfConfig(Write(f.base));
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    // A family's own entry for a common key replaces it (a value its file already has).
    std::vector<K> keys;
    for (const K& k : common) {
      if (std::none_of(f.keys.begin(), f.keys.end(),
                       [&](const K& o) { return std::string(o.key) == k.key; })) {
        keys.push_back(k);
      }
    }
    keys.insert(keys.end(), f.keys.begin(), f.keys.end());
    for (const K& k : keys) {
      SCOPED_TRACE(std::string(ArchName(base->arch)) + "." + k.key + " = " + k.value.dump());
      const nlohmann::json value = std::string(k.key) == "tie_word_embeddings"
                                       ? nlohmann::json(!base->tie_word_embeddings)
                                       : k.value;
      const std::string path = Patched(f.base, k.key, value);
      Result<ModelConfig> r = ReadHfConfig(path);
      if (k.kind == K::kRefused) {
        ASSERT_FALSE(r.ok());
        EXPECT_THAT(r.status().message(), HasSubstr(k.key));
        continue;
      }
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (k.kind == K::kModelled) {
        EXPECT_NE(Arithmetic(*r), Arithmetic(*base));
      } else {
        EXPECT_EQ(Arithmetic(*r), Arithmetic(*base));
      }
    }
  }
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
