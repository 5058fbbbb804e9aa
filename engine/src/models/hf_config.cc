// HF config.json reading and writing for gpt2 and llama, and ModelConfig sanity checks.
// Reading tolerates bookkeeping keys and rejects keys that would change the math we implement.
#include "models/hf_config.h"
#include "models/layout.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace traind::engine {
namespace {

using nlohmann::json;

Status Bad(const std::string& file, const std::string& key, const std::string& why) {
  return Status::InvalidArgument(file + ": " + key + ": " + why);
}

Status GetInt(const std::string& file, const json& j, const char* key, int64_t* out) {
  if (!j.contains(key)) return Status::Ok();
  const json& v = j[key];
  if (!v.is_number_integer()) return Bad(file, key, "expected an integer, got " + v.dump());
  *out = v.get<int64_t>();
  return Status::Ok();
}

Status GetDouble(const std::string& file, const json& j, const char* key, double* out) {
  if (!j.contains(key)) return Status::Ok();
  const json& v = j[key];
  if (!v.is_number()) return Bad(file, key, "expected a number, got " + v.dump());
  *out = v.get<double>();
  return Status::Ok();
}

Status GetBool(const std::string& file, const json& j, const char* key, bool* out) {
  if (!j.contains(key)) return Status::Ok();
  const json& v = j[key];
  if (!v.is_boolean()) return Bad(file, key, "expected true or false, got " + v.dump());
  *out = v.get<bool>();
  return Status::Ok();
}

// A key that must be absent or have the one value we implement.
Status Require(const std::string& file, const json& j, const char* key, const json& want,
               const std::string& what) {
  if (!j.contains(key) || j[key] == want) return Status::Ok();
  return Bad(file, key, j[key].dump() + " is not supported (" + what + ")");
}

Status ReadGpt2(const std::string& f, const json& j, ModelConfig* c) {
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "vocab_size", &c->vocab_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "n_positions", &c->n_positions));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "n_embd", &c->n_embd));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "n_layer", &c->n_layer));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "n_head", &c->n_head));
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "layer_norm_epsilon", &c->layer_norm_epsilon));
  if (j.contains("activation_function") &&
      j["activation_function"] != "gelu_new" && j["activation_function"] != "gelu_pytorch_tanh") {
    return Bad(f, "activation_function",
               j["activation_function"].dump() +
                   " is not supported (only gelu_new, the tanh approximation, is implemented)");
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != json(4 * c->n_embd)) {
    return Bad(f, "n_inner", j["n_inner"].dump() + " is not supported (only null = 4 * n_embd = " +
                                 std::to_string(4 * c->n_embd) + ")");
  }
  TRAIND_RETURN_IF_ERROR(Require(f, j, "scale_attn_weights", true, "attention is always scaled"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "scale_attn_by_inverse_layer_idx", false,
                                 "only false is implemented"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "add_cross_attention", false, "decoder-only models only"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "tie_word_embeddings", true,
                                 "gpt2 always ties lm_head to wte"));
  return Status::Ok();
}

// HF's rope_scaling / rope_parameters object: rope_type (older files: "type") default | linear |
// llama3 with its factors; anything else (dynamic, yarn, longrope, ...) is refused naming the key.
// rope_parameters (newer transformers) may also hold rope_theta.
Status ReadRopeScaling(const std::string& f, const json& j, ModelConfig* c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& r = j[key];
    if (!r.is_object()) return Bad(f, key, "expected an object or null, got " + r.dump());
    std::string type = "default";
    for (const char* tk : {"rope_type", "type"}) {
      if (r.contains(tk)) {
        if (!r[tk].is_string()) return Bad(f, key, std::string(tk) + " must be a string");
        type = r[tk].get<std::string>();
        break;
      }
    }
    if (type != "default" && type != "linear" && type != "llama3") {
      return Bad(f, key, "rope_type '" + type + "' is not supported (default, linear, llama3)");
    }
    ModelConfig::RopeScaling rs;
    rs.rope_type = type;
    const std::string k = key;
    auto num = [&](const char* name, double* out) -> Status {
      if (!r.contains(name)) return Status::Ok();
      if (!r[name].is_number()) return Bad(f, k + "." + name, "expected a number, got " + r[name].dump());
      *out = r[name].get<double>();
      return Status::Ok();
    };
    if (type != "default" && !r.contains("factor")) return Bad(f, k + ".factor", "required");
    TRAIND_RETURN_IF_ERROR(num("factor", &rs.factor));
    TRAIND_RETURN_IF_ERROR(num("low_freq_factor", &rs.low_freq_factor));
    TRAIND_RETURN_IF_ERROR(num("high_freq_factor", &rs.high_freq_factor));
    if (r.contains("original_max_position_embeddings")) {
      if (!r["original_max_position_embeddings"].is_number_integer()) {
        return Bad(f, k + ".original_max_position_embeddings", "expected an integer");
      }
      rs.original_max_position_embeddings = r["original_max_position_embeddings"].get<int64_t>();
    }
    if (r.contains("rope_theta")) {
      double theta = c->rope_theta;
      TRAIND_RETURN_IF_ERROR(num("rope_theta", &theta));
      c->rope_theta = theta;
    }
    // Keys of a scaling that change the math and that traind does not implement.
    for (const char* other : {"attention_factor", "beta_fast", "beta_slow", "short_factor",
                              "long_factor", "mrope_section", "partial_rotary_factor"}) {
      if (r.contains(other) && !r[other].is_null()) {
        return Bad(f, k + "." + other, r[other].dump() + " is not supported");
      }
    }
    if (type == "default") rs = ModelConfig::RopeScaling{};
    c->rope_scaling = rs;
  }
  return Status::Ok();
}

// The keys of a llama-like config.json (llama, mistral, qwen2, mixtral) onto the family's
// defaults. num_key_value_heads defaults to num_attention_heads where HF's class says so (llama,
// qwen2); mistral and mixtral default to 8.
Status ReadLlamaLike(const std::string& f, const json& j, ModelConfig* c) {
  const ModelFamily& family = FamilyOf(c->arch);
  const HfConfigRow& hf = family.hf;
  const std::string name = family.model_type;
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "vocab_size", &c->vocab_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "hidden_size", &c->hidden_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "intermediate_size", &c->intermediate_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_hidden_layers", &c->num_hidden_layers));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_attention_heads", &c->num_attention_heads));
  if (hf.kv_heads_default_heads) c->num_key_value_heads = c->num_attention_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_key_value_heads", &c->num_key_value_heads));
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "head_dim", &c->head_dim));
  }
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "rms_norm_eps", &c->rms_norm_eps));
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "rope_theta", &c->rope_theta));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "max_position_embeddings", &c->max_position_embeddings));
  TRAIND_RETURN_IF_ERROR(GetBool(f, j, "tie_word_embeddings", &c->tie_word_embeddings));
  if (family.features.mlp == FamilyFeatures::Mlp::kGeGluTanh) {
    // Gemma: transformers 4.38-4.4x read hidden_activation (null: gelu_pytorch_tanh) and ignore
    // hidden_act; the newest read hidden_act alone. hidden_act "gelu" beside hidden_activation
    // gelu_pytorch_tanh (gemma's published files) is the tanh GELU the model was trained with;
    // without it, "gelu" means the exact GELU to the newest transformers and is refused.
    const bool named = j.contains("hidden_activation") && !j["hidden_activation"].is_null();
    if (named) {
      TRAIND_RETURN_IF_ERROR(Require(f, j, "hidden_activation", hf.hidden_act,
                                     std::string("only ") + hf.hidden_act + " is implemented"));
    }
    if (j.contains("hidden_act") && j["hidden_act"] != hf.hidden_act &&
        !(named && j["hidden_act"] == "gelu")) {
      return Bad(f, "hidden_act",
                 j["hidden_act"].dump() + " is not supported (only " + hf.hidden_act +
                     ", or gelu beside hidden_activation " + hf.hidden_act + ")");
    }
  } else {
    TRAIND_RETURN_IF_ERROR(Require(f, j, "hidden_act", hf.hidden_act,
                                   std::string("only ") + hf.hidden_act + " is implemented"));
  }
  TRAIND_RETURN_IF_ERROR(ReadRopeScaling(f, j, c));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "mlp_bias", false, "the MLP has no biases"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "partial_rotary_factor", 1.0, "only full rotary embedding"));
  if (hf.attention_bias_key) {
    TRAIND_RETURN_IF_ERROR(GetBool(f, j, "attention_bias", &c->attention_bias));
  } else {
    TRAIND_RETURN_IF_ERROR(Require(f, j, "attention_bias", false,
                                   family.features.qkv_bias
                                       ? name + " has q/k/v biases and none on o_proj"
                                       : name + " has no attention biases"));
  }
  if (hf.sliding_window_key) {
    if (j.contains("sliding_window")) {
      if (j["sliding_window"].is_null()) {
        c->sliding_window = 0;
      } else {
        TRAIND_RETURN_IF_ERROR(GetInt(f, j, "sliding_window", &c->sliding_window));
      }
    }
  } else if (hf.use_sliding_window_key) {
    // Qwen2's window applies only with use_sliding_window, and then only to the layers from
    // max_window_layers on: not implemented.
    TRAIND_RETURN_IF_ERROR(Require(f, j, "use_sliding_window", false,
                                   "only full attention in every layer is implemented"));
  }
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (const json& t : j["layer_types"]) {
      if (t != "full_attention" && !(t == "sliding_attention" && c->sliding_window > 0 &&
                                     hf.sliding_window_key)) {
        return Bad(f, "layer_types", t.dump() + " is not supported (only full_attention, or "
                                                "sliding_attention in every layer of mistral)");
      }
    }
  }
  if (hf.experts_keys) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_local_experts", &c->num_local_experts));
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_experts_per_tok", &c->num_experts_per_tok));
    TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "router_aux_loss_coef", &c->router_aux_loss_coef));
    TRAIND_RETURN_IF_ERROR(GetBool(f, j, "output_router_logits", &c->output_router_logits));
    if (j.contains("router_jitter_noise") && j["router_jitter_noise"].is_number() &&
        j["router_jitter_noise"].get<double>() != 0.0) {
      return Bad(f, "router_jitter_noise",
                 j["router_jitter_noise"].dump() + " is not supported (only 0: no jitter)");
    }
  }
  return Status::Ok();
}

}  // namespace

// HF BertConfig defaults (bert-base-uncased) where ModelConfig's differ.
void BertConfigDefaults(ModelConfig* c) {
  c->vocab_size = 30522;
  c->hidden_size = 768;
  c->intermediate_size = 3072;
  c->num_hidden_layers = 12;
  c->num_attention_heads = 12;
  c->num_key_value_heads = 12;
  c->max_position_embeddings = 512;
  c->tie_word_embeddings = true;
}

// GPT2Config's defaults are ModelConfig's own.
void Gpt2ConfigDefaults(ModelConfig*) {}

// LlamaConfig (Llama-2-7B's shape).
void LlamaConfigDefaults(ModelConfig* c) {
  c->vocab_size = 32000;
  c->tie_word_embeddings = false;
}

// MistralConfig (Mistral-7B).
void MistralConfigDefaults(ModelConfig* c) {
  LlamaConfigDefaults(c);
  c->intermediate_size = 14336;
  c->num_key_value_heads = 8;
  c->max_position_embeddings = 4096 * 32;
  c->sliding_window = 4096;
}

// Qwen2Config.
void Qwen2ConfigDefaults(ModelConfig* c) {
  LlamaConfigDefaults(c);
  c->vocab_size = 151936;
  c->intermediate_size = 22016;
  c->max_position_embeddings = 32768;
}

// Qwen3Config.
void Qwen3ConfigDefaults(ModelConfig* c) {
  Qwen2ConfigDefaults(c);
  c->head_dim = 128;
}

// GemmaConfig (gemma-7b's shape).
void GemmaConfigDefaults(ModelConfig* c) {
  LlamaConfigDefaults(c);
  c->vocab_size = 256000;
  c->hidden_size = 3072;
  c->intermediate_size = 24576;
  c->num_hidden_layers = 28;
  c->num_attention_heads = 16;
  c->num_key_value_heads = 16;
  c->head_dim = 256;
  c->max_position_embeddings = 8192;
  c->tie_word_embeddings = true;
}

// MixtralConfig (Mixtral-8x7B).
void MixtralConfigDefaults(ModelConfig* c) {
  LlamaConfigDefaults(c);
  c->hidden_size = 4096;
  c->intermediate_size = 14336;
  c->num_hidden_layers = 32;
  c->num_attention_heads = 32;
  c->num_key_value_heads = 8;
  c->max_position_embeddings = 4096 * 32;
  c->rms_norm_eps = 1e-5;
  c->rope_theta = 1e6;
}

namespace {

Status ReadBert(const std::string& f, const json& j, ModelConfig* c) {
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "vocab_size", &c->vocab_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "hidden_size", &c->hidden_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "intermediate_size", &c->intermediate_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_hidden_layers", &c->num_hidden_layers));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_attention_heads", &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "max_position_embeddings", &c->max_position_embeddings));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "type_vocab_size", &c->type_vocab_size));
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "layer_norm_eps", &c->layer_norm_eps));
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "pad_token_id", &c->pad_token_id));
  }
  TRAIND_RETURN_IF_ERROR(Require(f, j, "hidden_act", "gelu", "only gelu (erf) is implemented"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "position_embedding_type", "absolute",
                                 "only absolute position embeddings are implemented"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "is_decoder", false, "bert is trained as an encoder"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "add_cross_attention", false, "encoder-only models only"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "tie_word_embeddings", true,
                                 "the MLM decoder is always tied to the word embeddings"));
  if (j.contains("problem_type") && !j["problem_type"].is_null() &&
      j["problem_type"] != "single_label_classification") {
    return Bad(f, "problem_type", j["problem_type"].dump() +
                                      " is not supported (only single_label_classification)");
  }
  // The head from the architecture (model.head may set it when the file names none).
  if (j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string()) {
    const std::string a = j["architectures"][0].get<std::string>();
    if (a == "BertForSequenceClassification") c->head = "sequence_classification";
    if (a == "BertForMaskedLM" || a == "BertForPreTraining") c->head = "masked_lm";
  }
  // Labels: id2label {"0": name, ...} (HF writes both maps; num_labels is their size).
  if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty()) {
    const json& m = j["id2label"];
    std::vector<std::string> names(m.size());
    for (auto it = m.begin(); it != m.end(); ++it) {
      char* end = nullptr;
      const long id = std::strtol(it.key().c_str(), &end, 10);
      if (end == it.key().c_str() || *end != 0 || id < 0 ||
          id >= static_cast<long>(names.size()) || !it.value().is_string()) {
        return Bad(f, "id2label", "expected {\"0\": name, ..., \"" +
                                      std::to_string(names.size() - 1) + "\": name}, got " +
                                      m.dump());
      }
      names[static_cast<size_t>(id)] = it.value().get<std::string>();
    }
    c->num_labels = static_cast<int64_t>(names.size());
    c->id2label = std::move(names);
  } else if (j.contains("num_labels")) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_labels", &c->num_labels));
  }
  return Status::Ok();
}

Status Positive(const std::string& prefix, const char* key, int64_t v) {
  if (v >= 1) return Status::Ok();
  return Status::InvalidArgument(prefix + key + ": must be >= 1, got " + std::to_string(v));
}

}  // namespace

ModelConfig HfConfigDefaults(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  FamilyOf(arch).hf.defaults(&c);
  return c;
}

// long function: one check per config field, the one validator of model configs
Status ValidateModelConfig(const ModelConfig& c, const std::string& p) {
  const ModelFamily& family = FamilyOf(c.arch);
  const HfConfigRow& hf = family.hf;
  const std::string name = family.model_type;
  if (!family.built) {
    return Status::InvalidArgument("model.arch: " + name + " is not supported yet (supported: " +
                                   KnownFamilies() + ")");
  }
  TRAIND_RETURN_IF_ERROR(Positive(p, "vocab_size", c.vocab_size));
  if (c.vocab_size > (int64_t{1} << 31) - 64) {
    return Status::InvalidArgument(p + "vocab_size: " + std::to_string(c.vocab_size) +
                                   " does not fit int32 token ids");
  }
  if (hf.names == HfConfigRow::Names::kBert) {
    if (c.head != "sequence_classification" && c.head != "masked_lm") {
      return Status::InvalidArgument(
          "model.head: bert needs a head: sequence_classification or masked_lm" +
          (c.head.empty() ? std::string() : ", got '" + c.head + "'"));
    }
    TRAIND_RETURN_IF_ERROR(Positive(p, "hidden_size", c.hidden_size));
    TRAIND_RETURN_IF_ERROR(Positive(p, "intermediate_size", c.intermediate_size));
    TRAIND_RETURN_IF_ERROR(Positive(p, "num_hidden_layers", c.num_hidden_layers));
    TRAIND_RETURN_IF_ERROR(Positive(p, "num_attention_heads", c.num_attention_heads));
    TRAIND_RETURN_IF_ERROR(Positive(p, "max_position_embeddings", c.max_position_embeddings));
    TRAIND_RETURN_IF_ERROR(Positive(p, "type_vocab_size", c.type_vocab_size));
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Status::InvalidArgument(p + "num_attention_heads: hidden_size " +
                                     std::to_string(c.hidden_size) + " is not divisible by " +
                                     "num_attention_heads " +
                                     std::to_string(c.num_attention_heads));
    }
    if (!(c.layer_norm_eps > 0)) return Status::InvalidArgument(p + "layer_norm_eps: must be > 0");
    if (c.pad_token_id < 0 || c.pad_token_id >= c.vocab_size) {
      return Status::InvalidArgument(p + "pad_token_id: " + std::to_string(c.pad_token_id) +
                                     " is not a token id of the vocabulary (0 .. vocab_size - 1)");
    }
    if (c.head == "sequence_classification") {
      if (c.num_labels < 1) {
        return Status::InvalidArgument("model.num_labels: must be >= 1, got " +
                                       std::to_string(c.num_labels));
      }
      if (!c.id2label.empty() && static_cast<int64_t>(c.id2label.size()) != c.num_labels) {
        return Status::InvalidArgument(
            "model.num_labels: " + std::to_string(c.num_labels) + " but config id2label names " +
            std::to_string(c.id2label.size()) + " labels");
      }
    }
    return Status::Ok();
  }
  if (!c.head.empty() && c.head != "none") {
    return Status::InvalidArgument("model.head: " + name + " is a causal language model " +
                                   "(head none), got '" + c.head + "'");
  }
  if (hf.names == HfConfigRow::Names::kGpt2) {
    TRAIND_RETURN_IF_ERROR(Positive(p, "n_positions", c.n_positions));
    TRAIND_RETURN_IF_ERROR(Positive(p, "n_embd", c.n_embd));
    TRAIND_RETURN_IF_ERROR(Positive(p, "n_layer", c.n_layer));
    TRAIND_RETURN_IF_ERROR(Positive(p, "n_head", c.n_head));
    if (c.n_embd % c.n_head != 0) {
      return Status::InvalidArgument(p + "n_head: n_embd " + std::to_string(c.n_embd) +
                                     " is not divisible by n_head " + std::to_string(c.n_head));
    }
    if (!(c.layer_norm_epsilon > 0)) {
      return Status::InvalidArgument(p + "layer_norm_epsilon: must be > 0");
    }
    return Status::Ok();
  }
  TRAIND_RETURN_IF_ERROR(Positive(p, "hidden_size", c.hidden_size));
  TRAIND_RETURN_IF_ERROR(Positive(p, "intermediate_size", c.intermediate_size));
  TRAIND_RETURN_IF_ERROR(Positive(p, "num_hidden_layers", c.num_hidden_layers));
  TRAIND_RETURN_IF_ERROR(Positive(p, "num_attention_heads", c.num_attention_heads));
  TRAIND_RETURN_IF_ERROR(Positive(p, "num_key_value_heads", c.num_key_value_heads));
  TRAIND_RETURN_IF_ERROR(Positive(p, "max_position_embeddings", c.max_position_embeddings));
  if (c.head_dim < 0) {
    return Status::InvalidArgument(p + "head_dim: must be >= 1 (or absent), got " +
                                   std::to_string(c.head_dim));
  }
  if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
    return Status::InvalidArgument(p + "num_attention_heads: hidden_size " +
                                   std::to_string(c.hidden_size) + " is not divisible by " +
                                   "num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  if (c.sliding_window < 0) {
    return Status::InvalidArgument(p + "sliding_window: must be >= 1 (or null), got " +
                                   std::to_string(c.sliding_window));
  }
  if (c.sliding_window > 0 && !hf.sliding_window_key) {
    return Status::InvalidArgument(p + "sliding_window: " + name +
                                   " has no sliding-window attention (mistral, mixtral)");
  }
  if (c.attention_bias && !hf.attention_bias_key) {
    return Status::InvalidArgument(p + "attention_bias: only llama's config has it (qwen2 " +
                                   "always has q/k/v biases)");
  }
  {
    const ModelConfig::RopeScaling& rs = c.rope_scaling;
    const std::string k = p + "rope_scaling.";
    if (rs.rope_type != "default" && rs.rope_type != "linear" && rs.rope_type != "llama3") {
      return Status::InvalidArgument(k + "rope_type: '" + rs.rope_type +
                                     "' is not supported (default, linear, llama3)");
    }
    if (rs.rope_type != "default" && !(rs.factor > 0)) {
      return Status::InvalidArgument(k + "factor: must be > 0");
    }
    if (rs.rope_type == "llama3" &&
        (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
         rs.original_max_position_embeddings < 1)) {
      return Status::InvalidArgument(k + "low_freq_factor: llama3 needs 0 < low_freq_factor < " +
                                     "high_freq_factor and original_max_position_embeddings >= 1");
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Status::InvalidArgument(p + "num_key_value_heads: num_attention_heads " +
                                   std::to_string(c.num_attention_heads) +
                                   " is not divisible by num_key_value_heads " +
                                   std::to_string(c.num_key_value_heads));
  }
  if (c.head_size() % 2 != 0) {
    return Status::InvalidArgument(p + (c.head_dim > 0 ? "head_dim: " : "num_attention_heads: ") +
                                   "the head size " + std::to_string(c.head_size()) +
                                   " must be even for rotary embeddings");
  }
  if (!(c.rms_norm_eps > 0)) return Status::InvalidArgument(p + "rms_norm_eps: must be > 0");
  if (!(c.rope_theta > 0)) return Status::InvalidArgument(p + "rope_theta: must be > 0");
  if (hf.experts_keys) {
    TRAIND_RETURN_IF_ERROR(Positive(p, "num_local_experts", c.num_local_experts));
    TRAIND_RETURN_IF_ERROR(Positive(p, "num_experts_per_tok", c.num_experts_per_tok));
    if (c.num_experts_per_tok > c.num_local_experts) {
      return Status::InvalidArgument(p + "num_experts_per_tok: " +
                                     std::to_string(c.num_experts_per_tok) + " exceeds " +
                                     "num_local_experts " + std::to_string(c.num_local_experts));
    }
    if (!(c.router_aux_loss_coef >= 0)) {
      return Status::InvalidArgument(p + "router_aux_loss_coef: must be >= 0");
    }
  }
  return Status::Ok();
}

Result<std::string> ReadHfModelType(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("model.init_from: " + path + ": no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model_type") ||
      !j["model_type"].is_string()) {
    return Status::InvalidArgument("model.init_from: " + path +
                                   ": no model_type string (give model.arch)");
  }
  return j["model_type"].get<std::string>();
}

Result<ModelConfig> ReadHfConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(path + ": not a JSON object");
  }
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    return Status::InvalidArgument(path + ": model_type: missing (one of " + KnownFamilies() + ")");
  }
  const std::string model_type = j["model_type"].get<std::string>();
  const std::optional<Arch> arch = ParseArch(model_type);
  if (!arch || !FamilyOf(*arch).built) {
    return Status::InvalidArgument(path + ": model_type: '" + model_type +
                                   "' is not supported (" + KnownFamilies() + ")");
  }
  ModelConfig c = HfConfigDefaults(*arch);
  switch (FamilyOf(*arch).hf.names) {
    case HfConfigRow::Names::kGpt2:
      TRAIND_RETURN_IF_ERROR(ReadGpt2(path, j, &c));
      break;
    case HfConfigRow::Names::kLlama:
      TRAIND_RETURN_IF_ERROR(ReadLlamaLike(path, j, &c));
      break;
    case HfConfigRow::Names::kBert:
      TRAIND_RETURN_IF_ERROR(ReadBert(path, j, &c));
      // A BertModel file (no task head): the job spec names model.head; the rest is checked now.
      if (c.head.empty()) {
        ModelConfig headed = c;
        headed.head = "masked_lm";
        TRAIND_RETURN_IF_ERROR(ValidateModelConfig(headed, path + ": "));
        c.hf_source_json = j.dump();
        return c;
      }
      break;
  }
  TRAIND_RETURN_IF_ERROR(ValidateModelConfig(c, path + ": "));
  c.hf_source_json = j.dump();
  return c;
}

std::string RopeScalingJson(const ModelConfig::RopeScaling& rs) {
  if (rs.rope_type == "default") return "null";
  json r = {{"rope_type", rs.rope_type}, {"factor", rs.factor}};
  if (rs.rope_type == "llama3") {
    r["low_freq_factor"] = rs.low_freq_factor;
    r["high_freq_factor"] = rs.high_freq_factor;
    r["original_max_position_embeddings"] = rs.original_max_position_embeddings;
  }
  return r.dump();
}

// long function: one line per config.json key, per family, in HF's order
std::string WriteHfConfigJson(const ModelConfig& c) {
  json j;
  j["torch_dtype"] = "float32";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  const ModelFamily& family = FamilyOf(c.arch);
  const HfConfigRow& hf = family.hf;
  switch (hf.names) {
  case HfConfigRow::Names::kGpt2: {
    const int64_t special = c.vocab_size > 50256 ? 50256 : c.vocab_size - 1;
    j["model_type"] = family.model_type;
    j["architectures"] = {hf.causal_lm_class};
    j["activation_function"] = "gelu_new";
    j["n_positions"] = c.n_positions;
    j["n_ctx"] = c.n_positions;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = nullptr;
    j["layer_norm_epsilon"] = c.layer_norm_epsilon;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["tie_word_embeddings"] = true;
    j["bos_token_id"] = special;
    j["eos_token_id"] = special;
    break;
  }
  case HfConfigRow::Names::kBert: {
    const bool cls = c.head == "sequence_classification";
    j["model_type"] = family.model_type;
    j["architectures"] = {cls                 ? "BertForSequenceClassification"
                          : c.head.empty()    ? "BertModel"
                                              : "BertForMaskedLM"};
    j["hidden_act"] = "gelu";
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["type_vocab_size"] = c.type_vocab_size;
    j["layer_norm_eps"] = c.layer_norm_eps;
    j["pad_token_id"] = c.pad_token_id;
    j["position_embedding_type"] = "absolute";
    // traind trains bert without dropout: the file says so, so transformers matches it.
    j["hidden_dropout_prob"] = 0.0;
    j["attention_probs_dropout_prob"] = 0.0;
    j["classifier_dropout"] = nullptr;
    j["tie_word_embeddings"] = true;
    j.erase("use_cache");
    if (cls) {
      json id2label = json::object(), label2id = json::object();
      for (int64_t i = 0; i < c.num_labels; ++i) {
        const std::string name = i < static_cast<int64_t>(c.id2label.size())
                                     ? c.id2label[static_cast<size_t>(i)]
                                     : "LABEL_" + std::to_string(i);
        id2label[std::to_string(i)] = name;
        label2id[name] = i;
      }
      j["id2label"] = id2label;
      j["label2id"] = label2id;
      j["problem_type"] = "single_label_classification";
    }
    break;
  }
  case HfConfigRow::Names::kLlama: {
    // The llama-like families: one writer, the family row's class name and keys.
    j["model_type"] = family.model_type;
    j["architectures"] = {hf.causal_lm_class};
    j["hidden_act"] = hf.hidden_act;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_size();
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = json::parse(RopeScalingJson(c.rope_scaling));
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    if (hf.attention_bias_key) j["attention_bias"] = c.attention_bias;
    if (hf.sliding_window_key) {
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    }
    if (hf.experts_keys) {
      j["num_local_experts"] = c.num_local_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["output_router_logits"] = c.output_router_logits;
    }
    const json constants = json::parse(hf.written_constants);
    for (auto it = constants.begin(); it != constants.end(); ++it) j[it.key()] = it.value();
    j["bos_token_id"] = c.vocab_size > 1 ? 1 : 0;
    j["eos_token_id"] = c.vocab_size > 2 ? 2 : c.vocab_size - 1;
    break;
  }
  }
  // Every other key of the config.json the model came from (token ids, transformers_version,
  // quantization-free bookkeeping) is kept; newer files' rope_parameters carry the same values.
  if (!c.hf_source_json.empty()) {
    json src = json::parse(c.hf_source_json, nullptr, /*allow_exceptions=*/false);
    if (src.is_object()) {
      for (auto it = src.begin(); it != src.end(); ++it) {
        const std::string& k = it.key();
        if (k == "rope_parameters" && j.contains("rope_scaling")) {
          json r = j["rope_scaling"].is_null() ? json{{"rope_type", "default"}} : j["rope_scaling"];
          r["rope_theta"] = c.rope_theta;
          j["rope_parameters"] = r;
          continue;
        }
        if (k == "torch_dtype" || k == "dtype" || k == "quantization_config") continue;
        // The task head's keys follow the head traind trains (bert: written above when it
        // classifies), not the head the source was saved with.
        if (k == "id2label" || k == "label2id" || k == "problem_type" || k == "num_labels") continue;
        // The source's token ids and bookkeeping win over the defaults written above.
        const bool bookkeeping = k == "bos_token_id" || k == "eos_token_id" ||
                                 k == "pad_token_id" || k == "initializer_range" ||
                                 k == "use_cache";
        if (bookkeeping || !j.contains(k)) j[k] = it.value();
      }
      if (src.contains("rope_parameters") && !src.contains("rope_scaling")) j.erase("rope_scaling");
      if (src.contains("rope_parameters") && !src.contains("rope_theta")) j.erase("rope_theta");
    }
  }
  return j.dump(2) + "\n";
}

}  // namespace traind::engine
