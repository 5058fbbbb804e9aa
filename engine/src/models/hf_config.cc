// HF config.json reading and writing for gpt2 and llama, and ModelConfig sanity checks.
// Reading tolerates bookkeeping keys and rejects keys that would change the math we implement.
#include "models/hf_config.h"
#include "models/layout.h"

#include <fstream>
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

Status ReadLlama(const std::string& f, const json& j, ModelConfig* c) {
  c->vocab_size = 32000;  // HF LlamaConfig defaults where ModelConfig's differ
  c->tie_word_embeddings = false;
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "vocab_size", &c->vocab_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "hidden_size", &c->hidden_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "intermediate_size", &c->intermediate_size));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_hidden_layers", &c->num_hidden_layers));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_attention_heads", &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    TRAIND_RETURN_IF_ERROR(GetInt(f, j, "num_key_value_heads", &c->num_key_value_heads));
  }
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "rms_norm_eps", &c->rms_norm_eps));
  TRAIND_RETURN_IF_ERROR(GetDouble(f, j, "rope_theta", &c->rope_theta));
  TRAIND_RETURN_IF_ERROR(GetInt(f, j, "max_position_embeddings", &c->max_position_embeddings));
  TRAIND_RETURN_IF_ERROR(GetBool(f, j, "tie_word_embeddings", &c->tie_word_embeddings));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "hidden_act", "silu", "only silu (SwiGLU) is implemented"));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return Bad(f, "rope_scaling", j["rope_scaling"].dump() +
                                      " is not supported (only null: plain RoPE)");
  }
  TRAIND_RETURN_IF_ERROR(Require(f, j, "attention_bias", false, "llama has no attention biases"));
  TRAIND_RETURN_IF_ERROR(Require(f, j, "mlp_bias", false, "llama has no MLP biases"));
  if (j.contains("head_dim") && !j["head_dim"].is_null() && c->num_attention_heads > 0 &&
      j["head_dim"] != json(c->hidden_size / c->num_attention_heads)) {
    return Bad(f, "head_dim", j["head_dim"].dump() +
                                  " is not supported (only hidden_size / num_attention_heads = " +
                                  std::to_string(c->hidden_size / c->num_attention_heads) + ")");
  }
  return Status::Ok();
}

Status Positive(const std::string& prefix, const char* key, int64_t v) {
  if (v >= 1) return Status::Ok();
  return Status::InvalidArgument(prefix + key + ": must be >= 1, got " + std::to_string(v));
}

}  // namespace

Status ValidateModelConfig(const ModelConfig& c, const std::string& p) {
  const ModelFamily* family = FindFamily(c.arch);
  if (family == nullptr) {
    return Status::InvalidArgument("model.arch: unknown architecture '" + c.arch +
                                   "' (supported: " + KnownFamilies() + ")");
  }
  if (!family->features.causal || !family->features.pre_ln) {
    return Status::Unimplemented("model.arch: " + c.arch +
                                 " needs bidirectional or post-LN blocks, not built yet");
  }
  TRAIND_RETURN_IF_ERROR(Positive(p, "vocab_size", c.vocab_size));
  if (c.vocab_size > (int64_t{1} << 31) - 64) {
    return Status::InvalidArgument(p + "vocab_size: " + std::to_string(c.vocab_size) +
                                   " does not fit int32 token ids");
  }
  if (c.arch == "gpt2") {
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
  if (c.hidden_size % c.num_attention_heads != 0) {
    return Status::InvalidArgument(p + "num_attention_heads: hidden_size " +
                                   std::to_string(c.hidden_size) + " is not divisible by " +
                                   "num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Status::InvalidArgument(p + "num_key_value_heads: num_attention_heads " +
                                   std::to_string(c.num_attention_heads) +
                                   " is not divisible by num_key_value_heads " +
                                   std::to_string(c.num_key_value_heads));
  }
  if ((c.hidden_size / c.num_attention_heads) % 2 != 0) {
    return Status::InvalidArgument(p + "num_attention_heads: head size hidden_size / " +
                                   "num_attention_heads = " +
                                   std::to_string(c.hidden_size / c.num_attention_heads) +
                                   " must be even for rotary embeddings");
  }
  if (!(c.rms_norm_eps > 0)) return Status::InvalidArgument(p + "rms_norm_eps: must be > 0");
  if (!(c.rope_theta > 0)) return Status::InvalidArgument(p + "rope_theta: must be > 0");
  return Status::Ok();
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
    return Status::InvalidArgument(path + ": model_type: missing (expected \"gpt2\" or \"llama\")");
  }
  ModelConfig c;
  c.arch = j["model_type"].get<std::string>();
  if (c.arch == "gpt2") {
    TRAIND_RETURN_IF_ERROR(ReadGpt2(path, j, &c));
  } else if (c.arch == "llama") {
    TRAIND_RETURN_IF_ERROR(ReadLlama(path, j, &c));
  } else {
    return Status::InvalidArgument(path + ": model_type: '" + c.arch +
                                   "' is not supported (gpt2 | llama)");
  }
  TRAIND_RETURN_IF_ERROR(ValidateModelConfig(c, path + ": "));
  return c;
}

std::string WriteHfConfigJson(const ModelConfig& c) {
  json j;
  j["torch_dtype"] = "float32";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  if (c.arch == "gpt2") {
    const int64_t special = c.vocab_size > 50256 ? 50256 : c.vocab_size - 1;
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
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
  } else {
    j["model_type"] = "llama";
    j["architectures"] = {"LlamaForCausalLM"};
    j["hidden_act"] = "silu";
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.vocab_size > 1 ? 1 : 0;
    j["eos_token_id"] = c.vocab_size > 2 ? 2 : c.vocab_size - 1;
  }
  return j.dump(2) + "\n";
}

}  // namespace traind::engine
