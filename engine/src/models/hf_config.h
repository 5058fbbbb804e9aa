// HF config.json <-> ModelConfig: read the config.json of a gpt2 or llama HF model folder, and
// write one that transformers 4.x loads into GPT2LMHeadModel / LlamaForCausalLM. Also the shared
// sanity checks of a ModelConfig (used by the job spec parser too).
#pragma once

#include <string>

#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

// Reads `config_json_path`. model_type must name a built family (ParseArch; a bert file
// without a task head in `architectures` reads with head "": the job spec names it; the rest of
// it is validated); the keys of ModelConfig for that
// arch are mapped (missing ones take HF's defaults; llama's num_key_value_heads defaults to
// num_attention_heads). Bookkeeping keys (architectures, torch_dtype, token ids, dropouts,
// use_cache, ...) are ignored; keys whose value would change the math and that we do not
// implement (gpt2 activation_function other than gelu_new, n_inner other than 4*n_embd, llama
// hidden_act other than silu, rope_scaling, attention_bias, ...) are INVALID_ARGUMENT naming the
// file and key. NOT_FOUND when the file is missing; INVALID_ARGUMENT for bad JSON or bad values.
Result<ModelConfig> ReadHfConfig(const std::string& config_json_path);

// The model_type of a config.json (what model.arch defaults to with init_from). NOT_FOUND when
// the file is missing; INVALID_ARGUMENT naming the file when it is not JSON or has none.
Result<std::string> ReadHfModelType(const std::string& config_json_path);

// The defaults of an architecture's HF config class (LlamaConfig, MistralConfig, Qwen2Config,
// MixtralConfig, BertConfig, GPT2Config, ...) as a ModelConfig with that arch: the family row's
// HfConfigRow::defaults.
ModelConfig HfConfigDefaults(Arch arch);

// Each config class's defaults over ModelConfig's (the family rows point at these).
void Gpt2ConfigDefaults(ModelConfig* c);
void LlamaConfigDefaults(ModelConfig* c);
void MistralConfigDefaults(ModelConfig* c);
void Qwen2ConfigDefaults(ModelConfig* c);
void Qwen3ConfigDefaults(ModelConfig* c);
void GemmaConfigDefaults(ModelConfig* c);
void BertConfigDefaults(ModelConfig* c);
void MixtralConfigDefaults(ModelConfig* c);

// config.json's rope_scaling object for `rs` as JSON text ({"rope_type", "factor", and llama3's
// low_freq_factor, high_freq_factor, original_max_position_embeddings}); "null" for plain RoPE.
// The job spec's model.config.rope_scaling is written the same way.
std::string RopeScalingJson(const ModelConfig::RopeScaling& rs);

// A config.json for `config` (pretty-printed, keys sorted, torch_dtype "float32") that
// transformers loads; ReadHfConfig(WriteHfConfigJson(c)) gives back c.
std::string WriteHfConfigJson(const ModelConfig& config);

// The sanity checks of a config: positive sizes, n_embd % n_head == 0 (gpt2); hidden_size %
// num_attention_heads == 0, num_attention_heads % num_key_value_heads == 0, even head size for
// rope (llama); positive epsilons. INVALID_ARGUMENT whose message starts with `prefix` + key
// ("model.config.n_head: ...").
Status ValidateModelConfig(const ModelConfig& config, const std::string& prefix);

}  // namespace traind::engine
