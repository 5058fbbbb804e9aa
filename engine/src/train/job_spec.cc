// Job spec parsing (YAML/JSON -> validated JobSpec), input checks on the file system, and the
// canonical JSON form. The contract is docs/jobspec.md; field reading and error
// wording live in spec_reader.h.
#include "traind/engine/job_spec.h"
#include "traind/engine/tokenizer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "data/instruction_data.h"
#include "data/window_order.h"
#include "models/hf_config.h"
#include "models/layout.h"
#include "models/lora.h"
#include "optim/optimizer.h"
#include "optim/sharded_optimizer.h"
#include "train/checkpoint.h"
#include "train/quantization_spec.h"
#include "train/spec_reader.h"

namespace traind::engine {
namespace {

using spec::SpecReader;

const std::vector<std::string> kRootKeys = {"name", "model", "data", "training", "output_dir", "distributed"};
const std::vector<std::string> kModelKeys = {"arch", "config", "init_from", "head", "num_labels",
                                             "quantization_config"};
const std::vector<std::string> kDataKeys = {"train_file", "format",           "token_dtype",
                                            "tokenizer",  "seq_len",          "validation_split",
                                            "shuffle",    "text_field",       "label_field",
                                            "prompt_field", "completion_field", "messages_field",
                                            "chat_template", "assistant_only_loss",
                                            "completion_only_loss", "packing"};
const std::vector<std::string> kTrainingKeys = {
    "max_steps",     "per_device_train_batch_size", "gradient_accumulation_steps",
    "effective_batch_size", "learning_rate",        "lr_scheduler_type",
    "warmup_steps",  "weight_decay",                "adam_beta1",
    "adam_beta2",    "adam_epsilon",                "max_grad_norm",
    "optim",         "optim_args",                  "fp16",                        "bf16",
    "tf32",          "gradient_checkpointing",      "gradient_checkpointing_every",
    "offload",       "offload_dir",                 "peft",
    "seed",          "logging_steps",               "eval_steps",
    "save_steps",    "overwrite_output_dir",        "resume_from_checkpoint",
    "sample_every"};
const std::vector<std::string> kGpt2Keys = {"vocab_size", "n_positions", "n_embd",
                                            "n_layer",    "n_head",      "layer_norm_epsilon"};
const std::vector<std::string> kBertKeys = {
    "vocab_size",        "hidden_size",          "intermediate_size",
    "num_hidden_layers", "num_attention_heads",  "max_position_embeddings",
    "type_vocab_size",   "layer_norm_eps",       "pad_token_id",
    "label2id",          "id2label"};
const std::vector<std::string> kLlamaKeys = {
    "vocab_size",          "hidden_size",         "intermediate_size",
    "num_hidden_layers",   "num_attention_heads", "num_key_value_heads",
    "rms_norm_eps",        "rope_theta",          "max_position_embeddings",
    "tie_word_embeddings"};
// The model.config keys of a family (its row's key names): the llama-like families have llama's
// keys, head_dim and rope_scaling (also spelled rope_parameters), and the keys their row adds
// (attention_bias, sliding_window, mixtral's experts: HF MixtralConfig).
std::vector<std::string> ConfigKeysOf(Arch arch) {
  const HfConfigRow& hf = FamilyOf(arch).hf;
  switch (hf.names) {
    case HfConfigRow::Names::kGpt2:
      return kGpt2Keys;
    case HfConfigRow::Names::kBert:
      return kBertKeys;
    case HfConfigRow::Names::kLlama:
      break;
  }
  std::vector<std::string> keys = kLlamaKeys;
  keys.insert(keys.end(), {"head_dim", "rope_scaling", "rope_parameters"});
  if (hf.attention_bias_key) keys.push_back("attention_bias");
  if (hf.sliding_window_key) keys.push_back("sliding_window");
  if (FamilyOf(arch).features.mlp == FamilyFeatures::Mlp::kGeGluTanh) {
    keys.push_back("hidden_activation");  // gemma: the GeGLU's GELU (one value is built)
  }
  if (hf.experts_keys) {
    keys.insert(keys.end(), {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
                             "output_router_logits"});
  }
  return keys;
}

std::string Resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || base_dir.empty()) return p;
  std::filesystem::path path(p);
  if (path.is_absolute()) return p;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// model.config.id2label ({0: name, ...} or {"0": name, ...}) and label2id ({name: 0, ...}): the
// label names by id; when both are given they must be inverse maps. Ids must be 0 .. n-1.
Status ParseLabelMaps(const SpecReader& r, ModelConfig* c) {
  std::vector<std::string> by_id;
  auto read_map = [&](const std::string& key, bool names_are_keys) -> Status {
    const YAML::Node n = r.Child(key);
    if (!n || n.IsNull()) return Status::Ok();
    if (!n.IsMap() || n.size() == 0) {
      return r.Error(key, "expected a non-empty mapping of " +
                              std::string(names_are_keys ? "name: id" : "id: name") + ", got " +
                              spec::Describe(n));
    }
    std::vector<std::string> names(n.size());
    std::vector<bool> seen(n.size(), false);
    for (const auto& kv : n) {
      const YAML::Node& id_node = names_are_keys ? kv.second : kv.first;
      const YAML::Node& name_node = names_are_keys ? kv.first : kv.second;
      int64_t id = -1;
      if (!spec::ParseInt64(id_node, &id)) {
        // JSON writes id2label's keys as strings: "0".
        if (id_node.IsScalar()) {
          try {
            size_t used = 0;
            id = std::stoll(id_node.Scalar(), &used);
            if (used != id_node.Scalar().size()) id = -1;
          } catch (const std::exception&) {
            id = -1;
          }
        }
      }
      if (id < 0 || id >= static_cast<int64_t>(names.size()) || seen[static_cast<size_t>(id)]) {
        return r.Error(key, "label ids must be 0 .. " + std::to_string(names.size() - 1) +
                                ", each once; got " + spec::Describe(id_node));
      }
      if (!name_node.IsScalar() || name_node.Scalar().empty()) {
        return r.Error(key, "expected a label name, got " + spec::Describe(name_node));
      }
      seen[static_cast<size_t>(id)] = true;
      names[static_cast<size_t>(id)] = name_node.Scalar();
    }
    for (size_t i = 0; i < names.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (names[i] == names[j]) return r.Error(key, "label name '" + names[i] + "' is used twice");
      }
    }
    if (!by_id.empty() && by_id != names) {
      return r.Error(key, "disagrees with id2label (they must be inverse maps)");
    }
    by_id = std::move(names);
    return Status::Ok();
  };
  TRAIND_RETURN_IF_ERROR(read_map("id2label", /*names_are_keys=*/false));
  TRAIND_RETURN_IF_ERROR(read_map("label2id", /*names_are_keys=*/true));
  if (!by_id.empty()) {
    c->id2label = std::move(by_id);
    c->num_labels = static_cast<int64_t>(c->id2label.size());
  }
  return Status::Ok();
}

// model.config.rope_scaling (or rope_parameters): HF's object, {rope_type (or type): default |
// linear | llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}
// (rope_parameters may also hold rope_theta); null = plain RoPE.
Status ParseRopeScaling(const SpecReader& parent, const char* key, ModelConfig* c) {
  if (!parent.Has(key) || parent.Child(key).IsNull()) return Status::Ok();
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(parent.Child(key), parent.PathOf(key)));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys({"rope_type", "type", "factor", "low_freq_factor",
                                      "high_freq_factor", "original_max_position_embeddings",
                                      "rope_theta"}));
  ModelConfig::RopeScaling rs;
  if (r.Has("rope_type") && r.Has("type")) return r.Error("type", "give rope_type or type, not both");
  const char* type_key = r.Has("type") ? "type" : "rope_type";
  TRAIND_RETURN_IF_ERROR(r.Enum(type_key, &rs.rope_type, {"default", "linear", "llama3"}));
  if (rs.rope_type != "default" && !r.Has("factor")) return r.Error("factor", "required");
  TRAIND_RETURN_IF_ERROR(r.Double("factor", &rs.factor));
  TRAIND_RETURN_IF_ERROR(r.Double("low_freq_factor", &rs.low_freq_factor));
  TRAIND_RETURN_IF_ERROR(r.Double("high_freq_factor", &rs.high_freq_factor));
  TRAIND_RETURN_IF_ERROR(
      r.Int("original_max_position_embeddings", &rs.original_max_position_embeddings, 1));
  TRAIND_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta));
  if (rs.rope_type == "default") rs = ModelConfig::RopeScaling{};
  c->rope_scaling = rs;
  return Status::Ok();
}

Status ParseModelConfig(const YAML::Node& node, ModelConfig* c) {
  if (!node || node.IsNull()) return Status::Ok();
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "model.config"));
  const ModelFamily& family = FamilyOf(c->arch);
  const HfConfigRow& hf = family.hf;
  const bool gpt2 = hf.names == HfConfigRow::Names::kGpt2;
  const bool bert = hf.names == HfConfigRow::Names::kBert;
  const std::vector<std::string> mine = ConfigKeysOf(c->arch);
  std::set<std::string> foreign;
  for (Arch arch : kAllArchs) {
    const std::vector<std::string> keys = ConfigKeysOf(arch);
    foreign.insert(keys.begin(), keys.end());
  }
  for (const std::string& k : mine) foreign.erase(k);
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(mine, foreign,
                                     "not a " + std::string(family.model_type) + " config key"));
  TRAIND_RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size, 1));
  if (bert) {
    TRAIND_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads, 1));
    c->num_key_value_heads = c->num_attention_heads;
    TRAIND_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("type_vocab_size", &c->type_vocab_size, 1));
    TRAIND_RETURN_IF_ERROR(r.Double("layer_norm_eps", &c->layer_norm_eps));
    TRAIND_RETURN_IF_ERROR(r.Int("pad_token_id", &c->pad_token_id, 0));
    return ParseLabelMaps(r, c);
  }
  if (gpt2) {
    TRAIND_RETURN_IF_ERROR(r.Int("n_positions", &c->n_positions, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("n_embd", &c->n_embd, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("n_layer", &c->n_layer, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("n_head", &c->n_head, 1));
    TRAIND_RETURN_IF_ERROR(r.Double("layer_norm_epsilon", &c->layer_norm_epsilon));
  } else {
    TRAIND_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers, 1));
    TRAIND_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads, 1));
    // HF: absent means no grouping (llama, qwen2); Mistral's and Mixtral's default is 8.
    if (hf.kv_heads_default_heads) c->num_key_value_heads = c->num_attention_heads;
    TRAIND_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_key_value_heads, 1));
    TRAIND_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
    TRAIND_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta));
    TRAIND_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings, 1));
    TRAIND_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
    TRAIND_RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim, 1));
    if (hf.attention_bias_key) {
      TRAIND_RETURN_IF_ERROR(r.Bool("attention_bias", &c->attention_bias));
    }
    if (r.Has("hidden_activation")) {  // gemma (ConfigKeysOf): the tanh GELU is the one built
      std::string act = hf.hidden_act;
      TRAIND_RETURN_IF_ERROR(r.Enum("hidden_activation", &act, {hf.hidden_act}));
    }
    if (r.Has("sliding_window")) {
      if (r.Child("sliding_window").IsNull()) {
        c->sliding_window = 0;
      } else {
        TRAIND_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window, 1));
      }
    }
    if (r.Has("rope_scaling") && r.Has("rope_parameters")) {
      return r.Error("rope_parameters", "give rope_scaling or rope_parameters, not both");
    }
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      TRAIND_RETURN_IF_ERROR(ParseRopeScaling(r, key, c));
    }
    if (hf.experts_keys) {
      TRAIND_RETURN_IF_ERROR(r.Int("num_local_experts", &c->num_local_experts, 1));
      TRAIND_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c->num_experts_per_tok, 1));
      TRAIND_RETURN_IF_ERROR(r.Double("router_aux_loss_coef", &c->router_aux_loss_coef));
      TRAIND_RETURN_IF_ERROR(r.Bool("output_router_logits", &c->output_router_logits));
    }
  }
  return Status::Ok();
}

Status ParseModel(const YAML::Node& node, ModelSpec* m, const std::string& base_dir) {
  if (!node) {
    return Status::InvalidArgument("model: required (with model.arch: " + KnownFamilies() + ")");
  }
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "model"));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(kModelKeys));
  std::string arch_name;
  if (r.Has("arch")) {
    TRAIND_RETURN_IF_ERROR(r.String("arch", &arch_name));
  } else {
    // JOBSPEC.md: without arch, init_from's config.json model_type names the family.
    std::optional<std::string> from;
    TRAIND_RETURN_IF_ERROR(r.OptionalString("init_from", &from));
    if (!from || from->empty()) {
      return r.Error("arch", "required without init_from (" + KnownFamilies() + ")");
    }
    TRAIND_ASSIGN_OR_RETURN(arch_name,
                            ReadHfModelType(Resolve(base_dir, *from) + "/config.json"));
  }
  // The one place a family name is parsed (ParseArch); everything after reads the enum.
  const std::optional<Arch> parsed = ParseArch(arch_name);
  if (!parsed) {
    return r.Error("arch", "expected one of " + KnownFamilies() + ", got '" + arch_name + "'");
  }
  const Arch arch = *parsed;
  if (!FamilyOf(arch).built) return r.Error("arch", arch_name + " is not supported yet");
  // Task heads are the encoder's (bert); the causal families' head is none.
  const bool bert = !FamilyOf(arch).features.causal;
  // JOBSPEC.md's head (bert: sequence_classification | masked_lm, required; causal families:
  // none) and num_labels (HF's config key, 2 by default for every model; it matters only with
  // head sequence_classification).
  std::string head;
  if (r.Has("head") && !r.Child("head").IsNull()) {
    TRAIND_RETURN_IF_ERROR(r.String("head", &head));
    if (head != "none" && head != "sequence_classification" && head != "masked_lm") {
      return r.Error("head", "expected none, sequence_classification or masked_lm, got '" + head + "'");
    }
  }
  if (bert && (head.empty() || head == "none")) {
    return r.Error("head", arch_name + " needs a head: sequence_classification or masked_lm");
  }
  if (!bert && !head.empty() && head != "none") {
    return r.Error("head", arch_name + " is a causal language model: only none (or null), got '" +
                               head + "' (the task heads are bert's)");
  }
  m->config = HfConfigDefaults(arch);
  TRAIND_RETURN_IF_ERROR(ParseModelConfig(r.Child("config"), &m->config));
  m->config_keys.clear();
  if (r.Has("config") && r.Child("config").IsMap()) {
    for (const auto& kv : r.Child("config")) m->config_keys.push_back(kv.first.Scalar());
  }
  if (bert) m->config.head = head;
  if (r.Has("num_labels") && !r.Child("num_labels").IsNull()) {
    int64_t labels = 2;
    TRAIND_RETURN_IF_ERROR(r.Int("num_labels", &labels, 1));
    if (bert && !m->config.id2label.empty() &&
        labels != static_cast<int64_t>(m->config.id2label.size())) {
      return r.Error("num_labels", std::to_string(labels) + " but model.config.id2label/label2id "
                                   "name " + std::to_string(m->config.id2label.size()) + " labels");
    }
    if (bert) m->config.num_labels = labels;
  }
  TRAIND_RETURN_IF_ERROR(ValidateModelConfig(m->config, "model.config."));
  TRAIND_RETURN_IF_ERROR(r.OptionalString("init_from", &m->init_from));
  if (m->init_from) {
    if (m->init_from->empty()) return r.Error("init_from", "must be a folder or null, got ''");
    m->init_from = Resolve(base_dir, *m->init_from);
  }
  TRAIND_RETURN_IF_ERROR(ParseQuantizationConfig(r.Child("quantization_config"), &m->quantization_config));
  return Status::Ok();
}

Status ParseData(const YAML::Node& node, DataSpec* d, const std::string& base_dir) {
  if (!node) return Status::InvalidArgument("data: required (with data.train_file)");
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "data"));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(kDataKeys));
  if (!r.Has("train_file")) return r.Error("train_file", "required (a path to the data file)");
  TRAIND_RETURN_IF_ERROR(r.String("train_file", &d->train_file));
  if (d->train_file.empty()) return r.Error("train_file", "must not be empty");
  d->train_file = Resolve(base_dir, d->train_file);
  TRAIND_RETURN_IF_ERROR(r.String("format", &d->format));
  if (d->format != "text" && d->format != "tokens" && d->format != "jsonl") {
    return r.Error("format", "expected text, tokens or jsonl, got '" + d->format + "'");
  }
  TRAIND_RETURN_IF_ERROR(r.String("text_field", &d->text_field));
  if (d->text_field.empty()) return r.Error("text_field", "must not be empty");
  TRAIND_RETURN_IF_ERROR(r.OptionalString("label_field", &d->label_field));
  if (d->label_field && d->label_field->empty()) {
    return r.Error("label_field", "must not be empty (or null)");
  }
  for (auto [key, field] : {std::pair<const char*, std::string*>{"prompt_field", &d->prompt_field},
                             {"completion_field", &d->completion_field},
                             {"messages_field", &d->messages_field}}) {
    TRAIND_RETURN_IF_ERROR(r.String(key, field));
    if (field->empty()) return r.Error(key, "must not be empty");
  }
  TRAIND_RETURN_IF_ERROR(r.OptionalString("chat_template", &d->chat_template));
  if (d->chat_template) {
    if (d->chat_template->empty()) return r.Error("chat_template", "must be a file or null, got ''");
    d->chat_template = Resolve(base_dir, *d->chat_template);
  }
  TRAIND_RETURN_IF_ERROR(r.Bool("assistant_only_loss", &d->assistant_only_loss));
  TRAIND_RETURN_IF_ERROR(r.Bool("completion_only_loss", &d->completion_only_loss));
  TRAIND_RETURN_IF_ERROR(r.Bool("packing", &d->packing));
  if (d->packing && d->format != "jsonl") {
    return r.Error("packing", "true packs prompt-completion or conversational examples: needs "
                              "format jsonl, got " + d->format);
  }
  TRAIND_RETURN_IF_ERROR(r.Enum("token_dtype", &d->token_dtype, {"uint16", "uint32"}));
  TRAIND_RETURN_IF_ERROR(r.String("tokenizer", &d->tokenizer));
  // byte, or a tokenizer file or folder (JOBSPEC.md): resolved here, opened (and its errors
  // reported) when the data is loaded (engine/src/data/tokenizers/).
  if (d->tokenizer.empty()) return r.Error("tokenizer", "must be byte or a path, got ''");
  if (d->tokenizer != "byte") d->tokenizer = Resolve(base_dir, d->tokenizer);
  TRAIND_RETURN_IF_ERROR(r.Int("seq_len", &d->seq_len, 1));
  TRAIND_RETURN_IF_ERROR(r.Double("validation_split", &d->validation_split));
  if (!(d->validation_split >= 0.0 && d->validation_split < 1.0)) {
    return r.Error("validation_split", "must be in [0, 1), got " +
                                           r.Child("validation_split").Scalar());
  }
  TRAIND_RETURN_IF_ERROR(r.Bool("shuffle", &d->shuffle));
  return Status::Ok();
}

Status ParseBatch(const SpecReader& r, TrainingSpec* t) {
  const YAML::Node b = r.Child("per_device_train_batch_size");
  if (b) {
    if (b.IsScalar() && b.Scalar() == "auto") {
      t->per_device_train_batch_size = 0;
    } else if (!spec::ParseInt64(b, &t->per_device_train_batch_size)) {
      return r.Error("per_device_train_batch_size",
                     "expected an integer >= 1 or \"auto\", got " + spec::Describe(b));
    } else if (t->per_device_train_batch_size < 1) {
      return r.Error("per_device_train_batch_size",
                     "must be >= 1 or \"auto\", got " + b.Scalar());
    }
  }
  TRAIND_RETURN_IF_ERROR(r.Int("gradient_accumulation_steps", &t->gradient_accumulation_steps, 1));
  const YAML::Node e = r.Child("effective_batch_size");
  if (e && !e.IsNull()) {
    int64_t v = 0;
    TRAIND_RETURN_IF_ERROR(r.Int("effective_batch_size", &v, 1));
    t->effective_batch_size = v;
  }
  if (!t->effective_batch_size) return Status::Ok();
  const int64_t eff = *t->effective_batch_size;
  const bool accum_given = r.Has("gradient_accumulation_steps");
  if (t->auto_batch()) {
    if (accum_given && t->gradient_accumulation_steps != 1) {
      return r.Error("gradient_accumulation_steps",
                     "is chosen by the planner when per_device_train_batch_size is \"auto\" "
                     "with effective_batch_size; remove it");
    }
    return Status::Ok();
  }
  const int64_t B = t->per_device_train_batch_size;
  if (!accum_given) {
    if (eff % B != 0) {
      return r.Error("effective_batch_size",
                     std::to_string(eff) + " is not a multiple of per_device_train_batch_size " +
                         std::to_string(B));
    }
    t->gradient_accumulation_steps = eff / B;
  } else if (eff != B * t->gradient_accumulation_steps) {
    return r.Error("effective_batch_size",
                   std::to_string(eff) + " != per_device_train_batch_size " + std::to_string(B) +
                       " x gradient_accumulation_steps " +
                       std::to_string(t->gradient_accumulation_steps) + "; drop one of them");
  }
  return Status::Ok();
}

// training.peft: null or a LoRA mapping (PEFT's LoraConfig names). Module names are checked
// against the model family later (ValidateLora), where the arch is known.
Status ParsePeft(const SpecReader& training, TrainingSpec* t) {
  const YAML::Node node = training.Child("peft");
  if (!node || node.IsNull()) return Status::Ok();
  if (!node.IsMap()) {
    return training.Error("peft", "expected a mapping {type: lora, r: ...} or null, got " +
                                      spec::Describe(node));
  }
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "training.peft"));
  TRAIND_RETURN_IF_ERROR(
      r.CheckKeys({"type", "r", "lora_alpha", "lora_dropout", "target_modules", "merge"}));
  PeftSpec p;
  if (!r.Has("type")) return r.Error("type", "missing (expected lora)");
  TRAIND_RETURN_IF_ERROR(r.Enum("type", &p.type, {"lora"}));
  TRAIND_RETURN_IF_ERROR(r.Int("r", &p.r, 1));
  TRAIND_RETURN_IF_ERROR(r.Double("lora_alpha", &p.lora_alpha));
  if (!(p.lora_alpha > 0)) return r.Error("lora_alpha", "must be > 0");
  TRAIND_RETURN_IF_ERROR(r.Double("lora_dropout", &p.lora_dropout));
  if (p.lora_dropout < 0 || p.lora_dropout >= 1) {
    return r.Error("lora_dropout", "must be in [0, 1)");
  }
  const YAML::Node tm = r.Child("target_modules");
  if (tm && !tm.IsNull()) {
    if (!tm.IsSequence() || tm.size() == 0) {
      return r.Error("target_modules",
                     "expected a non-empty list of module names, got " + spec::Describe(tm));
    }
    for (size_t i = 0; i < tm.size(); ++i) {
      const std::string path = "target_modules[" + std::to_string(i) + "]";
      if (!tm[i].IsScalar() || tm[i].Scalar().empty()) {
        return r.Error(path, "expected a module name, got " + spec::Describe(tm[i]));
      }
      for (const std::string& seen : p.target_modules) {
        if (seen == tm[i].Scalar()) return r.Error(path, "'" + seen + "' is listed twice");
      }
      p.target_modules.push_back(tm[i].Scalar());
    }
  }
  TRAIND_RETURN_IF_ERROR(r.Bool("merge", &p.merge));
  t->peft = std::move(p);
  return Status::Ok();
}

// training.optim_args: a mapping (or null) holding only the chosen optimizer's options.
Status ParseOptimArgs(const SpecReader& training, TrainingSpec* t) {
  const YAML::Node node = training.Child("optim_args");
  if (!node || node.IsNull()) return Status::Ok();
  if (!node.IsMap()) return training.Error("optim_args", "expected a mapping, got " + spec::Describe(node));
  // The optimizer's row names its keys and checks their values (optim/optimizer.cc).
  const OptimizerRow& row = OptimizerOf(*t);
  const std::vector<std::string>& known = row.args;
  std::set<std::string> foreign;
  for (const OptimizerRow& other : Optimizers()) foreign.insert(other.args.begin(), other.args.end());
  for (const std::string& k : known) foreign.erase(k);
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "training.optim_args"));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(known, foreign,
                                     "not an option of optim " + t->optim + " (its options: " +
                                         (list.empty() ? std::string("none") : list) + ")"));
  OptimArgs& a = t->optim_args;
  // Every key by its type (only the optimizer's own can be present), then the row's checks.
  TRAIND_RETURN_IF_ERROR(r.Double("momentum", &a.momentum));
  TRAIND_RETURN_IF_ERROR(r.Double("dampening", &a.dampening));
  TRAIND_RETURN_IF_ERROR(r.Bool("nesterov", &a.nesterov));
  TRAIND_RETURN_IF_ERROR(r.Bool("scale_parameter", &a.scale_parameter));
  TRAIND_RETURN_IF_ERROR(r.Bool("relative_step", &a.relative_step));
  TRAIND_RETURN_IF_ERROR(r.Bool("warmup_init", &a.warmup_init));
  if (r.Has("beta1") && !r.Child("beta1").IsNull()) {
    double b1 = 0;
    TRAIND_RETURN_IF_ERROR(r.Double("beta1", &b1));
    a.beta1 = b1;
  }
  TRAIND_RETURN_IF_ERROR(r.Double("clip_threshold", &a.clip_threshold));
  TRAIND_RETURN_IF_ERROR(r.Double("decay_rate", &a.decay_rate));
  return row.check_args(a);
}

Status ParseTraining(const YAML::Node& node, TrainingSpec* t, const std::string& base_dir) {
  if (!node) return Status::Ok();  // every training field has a default
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "training"));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(kTrainingKeys));
  TRAIND_RETURN_IF_ERROR(r.Int("max_steps", &t->max_steps, 1));
  TRAIND_RETURN_IF_ERROR(ParseBatch(r, t));
  TRAIND_RETURN_IF_ERROR(r.Double("learning_rate", &t->learning_rate));
  if (t->learning_rate < 0) return r.Error("learning_rate", "must be >= 0");
  TRAIND_RETURN_IF_ERROR(
      r.Enum("lr_scheduler_type", &t->lr_scheduler_type, {"constant", "linear", "cosine"}));
  TRAIND_RETURN_IF_ERROR(r.Int("warmup_steps", &t->warmup_steps, 0));
  TRAIND_RETURN_IF_ERROR(r.Double("weight_decay", &t->weight_decay));
  if (t->weight_decay < 0) return r.Error("weight_decay", "must be >= 0");
  TRAIND_RETURN_IF_ERROR(r.Double("adam_beta1", &t->adam_beta1));
  if (!(t->adam_beta1 >= 0 && t->adam_beta1 < 1)) return r.Error("adam_beta1", "must be in [0, 1)");
  TRAIND_RETURN_IF_ERROR(r.Double("adam_beta2", &t->adam_beta2));
  if (!(t->adam_beta2 >= 0 && t->adam_beta2 < 1)) return r.Error("adam_beta2", "must be in [0, 1)");
  TRAIND_RETURN_IF_ERROR(r.Double("adam_epsilon", &t->adam_epsilon));
  if (!(t->adam_epsilon > 0)) return r.Error("adam_epsilon", "must be > 0");
  TRAIND_RETURN_IF_ERROR(r.Double("max_grad_norm", &t->max_grad_norm));
  if (t->max_grad_norm < 0) return r.Error("max_grad_norm", "must be >= 0 (0 disables clipping)");
  {
    // The one parser of an optimizer name: the registry's rows (optim/optimizer.h).
    std::vector<std::string> names;
    for (const OptimizerRow& row : Optimizers()) names.push_back(row.name);
    TRAIND_RETURN_IF_ERROR(r.Enum("optim", &t->optim, names));
  }
  TRAIND_RETURN_IF_ERROR(ParseOptimArgs(r, t));
  TRAIND_RETURN_IF_ERROR(r.Bool("fp16", &t->fp16));
  TRAIND_RETURN_IF_ERROR(r.Bool("bf16", &t->bf16));
  if (t->fp16 && t->bf16) {
    return r.Error("bf16", "fp16 and bf16 are both true: choose one mixed precision type");
  }
  TRAIND_RETURN_IF_ERROR(r.Bool("tf32", &t->tf32));
  TRAIND_RETURN_IF_ERROR(r.Bool("gradient_checkpointing", &t->gradient_checkpointing));
  TRAIND_RETURN_IF_ERROR(
      r.Int("gradient_checkpointing_every", &t->gradient_checkpointing_every, 1));
  TRAIND_RETURN_IF_ERROR(r.String("offload", &t->offload));
  if (t->offload != "none" && t->offload != "cpu" && t->offload != "nvme") {
    return r.Error("offload", "expected one of none, cpu, nvme, got '" + t->offload + "'");
  }
  TRAIND_RETURN_IF_ERROR(r.OptionalString("offload_dir", &t->offload_dir));
  if (t->offload_dir) t->offload_dir = Resolve(base_dir, *t->offload_dir);
  if (t->offload == "nvme" && (!t->offload_dir || t->offload_dir->empty())) {
    return r.Error("offload_dir", "offload: nvme needs offload_dir, a directory on a local drive "
                                  "for the optimizer state");
  }
  TRAIND_RETURN_IF_ERROR(ParsePeft(r, t));
  TRAIND_RETURN_IF_ERROR(r.Int("seed", &t->seed, 0));
  TRAIND_RETURN_IF_ERROR(r.Int("logging_steps", &t->logging_steps, 1));
  TRAIND_RETURN_IF_ERROR(r.Int("eval_steps", &t->eval_steps, 0));
  TRAIND_RETURN_IF_ERROR(r.Int("save_steps", &t->save_steps, 0));
  TRAIND_RETURN_IF_ERROR(r.Int("sample_every", &t->sample_every, 0));
  TRAIND_RETURN_IF_ERROR(r.Bool("overwrite_output_dir", &t->overwrite_output_dir));
  // resume_from_checkpoint: null | false | true | a checkpoint folder's path.
  if (r.Has("resume_from_checkpoint") && !r.Child("resume_from_checkpoint").IsNull()) {
    const YAML::Node n = r.Child("resume_from_checkpoint");
    if (!n.IsScalar()) {
      return r.Error("resume_from_checkpoint", "expected true, false or a checkpoint folder's path");
    }
    const std::string v = n.Scalar();
    if (v == "true" || v == "True") {
      t->resume_from_last_checkpoint = true;
    } else if (v != "false" && v != "False") {
      if (v.empty()) return r.Error("resume_from_checkpoint", "must not be empty (true, false or a path)");
      t->resume_from_checkpoint = Resolve(base_dir, v);
    }
  }
  return Status::Ok();
}

// distributed: {world_size, rank, master_addr, master_port, zero_stage}; a field left out stays
// unset (the job runner fills it from WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT).
Status ParseDistributed(const YAML::Node& node, DistributedSpec* d) {
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(node, "distributed"));
  TRAIND_RETURN_IF_ERROR(
      r.CheckKeys({"world_size", "rank", "master_addr", "master_port", "zero_stage"}));
  auto opt_int = [&](const char* key, std::optional<int64_t>* out, int64_t min) -> Status {
    if (!r.Has(key) || r.Child(key).IsNull()) return Status::Ok();
    int64_t v = 0;
    TRAIND_RETURN_IF_ERROR(r.Int(key, &v, min));
    *out = v;
    return Status::Ok();
  };
  TRAIND_RETURN_IF_ERROR(opt_int("world_size", &d->world_size, 1));
  TRAIND_RETURN_IF_ERROR(opt_int("rank", &d->rank, 0));
  TRAIND_RETURN_IF_ERROR(opt_int("master_port", &d->master_port, 1));
  if (d->master_port && *d->master_port > 65535) {
    return r.Error("master_port", "must be <= 65535, got " + std::to_string(*d->master_port));
  }
  if (d->world_size && d->rank && *d->rank >= *d->world_size) {
    return r.Error("rank", "must be < world_size " + std::to_string(*d->world_size) + ", got " +
                               std::to_string(*d->rank));
  }
  TRAIND_RETURN_IF_ERROR(r.OptionalString("master_addr", &d->master_addr));
  if (d->master_addr && d->master_addr->empty()) return r.Error("master_addr", "must not be empty");
  TRAIND_RETURN_IF_ERROR(r.Int("zero_stage", &d->zero_stage, 0));
  if (d->zero_stage != 0 && d->zero_stage != 1) {
    return r.Error("zero_stage", "must be 0 or 1, got " + std::to_string(d->zero_stage));
  }
  return Status::Ok();
}

// What the model's head needs of the data and the training options (JOBSPEC.md): bert
// sequence_classification reads labelled jsonl examples (data.label_field), masked_lm any format;
// label_field is refused everywhere else; no samples or LoRA for bert.
Status CheckHeadAndData(const JobSpec& s) {
  const ModelConfig& c = s.model.config;
  const DataSpec& d = s.data;
  const ModelFamily& family = FamilyOf(c.arch);
  const std::string name = family.model_type;
  const bool classify = c.encoder() && c.head == "sequence_classification";
  if (classify && d.format != "jsonl") {
    return Status::InvalidArgument(
        "data.format: model.head sequence_classification reads labelled examples: format jsonl "
        "with data.text_field and data.label_field, got '" + d.format + "'");
  }
  if (classify && !d.label_field) {
    return Status::InvalidArgument(
        "data.label_field: required with model.head sequence_classification (the field of each "
        "jsonl line holding its label: an integer in [0, num_labels) or a label name)");
  }
  if (!classify && d.label_field) {
    return Status::InvalidArgument(
        "data.label_field: only for model.head sequence_classification with data.format jsonl " +
        std::string(c.encoder() ? "(masked_lm trains on the text alone)"
                                : "(" + name + " is a causal language model)") +
        "; remove it");
  }
  // Instruction data (prompt-completion / conversational jsonl) is for the causal families.
  const DataSpec def;
  const bool instruction_keys = d.prompt_field != def.prompt_field ||
                                d.completion_field != def.completion_field ||
                                d.messages_field != def.messages_field || d.chat_template ||
                                d.assistant_only_loss != def.assistant_only_loss ||
                                d.completion_only_loss != def.completion_only_loss;
  if (instruction_keys && (c.encoder() || d.format != "jsonl")) {
    const char* key = d.chat_template                     ? "chat_template"
                      : d.assistant_only_loss             ? "assistant_only_loss"
                      : !d.completion_only_loss           ? "completion_only_loss"
                      : d.prompt_field != def.prompt_field ? "prompt_field"
                      : d.completion_field != def.completion_field ? "completion_field"
                                                                   : "messages_field";
    return Status::InvalidArgument(
        std::string("data.") + key + ": only for instruction data (data.format jsonl with " +
        "prompt-completion or conversational lines) of the causal families (gpt2, llama, ...), " +
        "got " + (c.encoder() ? "arch " + name : "format " + d.format));
  }
  if (!family.generation && s.training.sample_every > 0) {
    return Status::InvalidArgument(
        "training.sample_every: generated samples are for the causal families (gpt2, llama); " +
        name + (c.encoder() ? " is an encoder" : " has no generation") + ": set it to 0");
  }
  if (family.lora_modules.empty() && s.training.peft) {
    const std::string why = "training.peft: LoRA is not built for " + name +
                            " yet (gpt2 and llama only): set it to null";
    // An encoder's adapters are not planned; a decoder's are (not built yet).
    return c.encoder() ? Status::InvalidArgument(why) : Status::Unimplemented(why);
  }
  return Status::Ok();
}

Result<JobSpec> ParseRoot(const YAML::Node& root, const std::string& base_dir) {
  if (!root || root.IsNull()) {
    return Status::InvalidArgument("job spec: empty document (expected a mapping with model, "
                                   "data, training)");
  }
  TRAIND_ASSIGN_OR_RETURN(SpecReader r, SpecReader::Open(root, ""));
  TRAIND_RETURN_IF_ERROR(r.CheckKeys(kRootKeys));
  JobSpec s;
  if (r.Has("distributed") && !r.Child("distributed").IsNull()) {
    s.distributed.emplace();
    TRAIND_RETURN_IF_ERROR(ParseDistributed(r.Child("distributed"), &*s.distributed));
  }
  if (r.Has("name") && !r.Child("name").IsNull()) TRAIND_RETURN_IF_ERROR(r.String("name", &s.name));
  TRAIND_RETURN_IF_ERROR(ParseModel(r.Child("model"), &s.model, base_dir));
  TRAIND_RETURN_IF_ERROR(ParseData(r.Child("data"), &s.data, base_dir));
  // JOBSPEC.md: with init_from and no data.tokenizer, the init_from folder's tokenizer files
  // (byte when it has none).
  if (s.model.init_from && !(r.Child("data").IsMap() && r.Child("data")["tokenizer"]) &&
      HasTokenizerFiles(*s.model.init_from)) {
    s.data.tokenizer = *s.model.init_from;
  }
  TRAIND_RETURN_IF_ERROR(ParseTraining(r.Child("training"), &s.training, base_dir));
  // A pre-quantized init_from's quantization_config when the spec gives none (reads its config.json).
  TRAIND_RETURN_IF_ERROR(ApplyCheckpointQuantization(&s));
  TRAIND_RETURN_IF_ERROR(ReconcileQuantization(&s));  // may set training.bf16 / fp16
  TRAIND_RETURN_IF_ERROR(CheckHeadAndData(s));
  if (s.training.peft) {  // target modules of this arch
    LoraOptions lo;
    lo.r = s.training.peft->r;
    lo.alpha = s.training.peft->lora_alpha;
    lo.dropout = s.training.peft->lora_dropout;
    lo.targets = s.training.peft->target_modules;
    TRAIND_RETURN_IF_ERROR(ValidateLora(s.model.config.arch, lo,
                                        s.training.bf16   ? DType::kBF16
                                        : s.training.fp16 ? DType::kF16
                                                          : DType::kF32));
  }
  // ZeRO-1 over more than one rank (a world of one is a plain run): an optimizer it shards (with
  // offload, each rank offloading its shard).
  if (s.distributed && s.distributed->zero_stage == 1 && s.distributed->world_size.value_or(2) > 1) {
    TRAIND_RETURN_IF_ERROR(CheckZeroOneOptimizer(s.training));
  }
  if (s.training.sample_every > 0 && s.training.peft) {
    return Status::InvalidArgument(
        "training.sample_every: samples during a LoRA fine-tune are not supported yet (the "
        "adapters would have to be merged each time); use trainctl generate on the result");
  }
  TRAIND_RETURN_IF_ERROR(r.String("output_dir", &s.output_dir));
  if (s.output_dir.empty()) return r.Error("output_dir", "must not be empty");
  s.output_dir = Resolve(base_dir, s.output_dir);
  // With init_from the positions limit comes from its config.json (checked in ValidateJobInputs).
  if (!s.model.init_from && s.data.seq_len > s.model.config.max_positions()) {
    return Status::InvalidArgument("data.seq_len: " + std::to_string(s.data.seq_len) +
                                   " exceeds model.config." +
                                   s.model.config.max_positions_key() + " " +
                                   std::to_string(s.model.config.max_positions()));
  }
  return s;
}

// model.config as a document: every key of the arch with its value (ParseModelConfig's keys).
nlohmann::ordered_json ModelConfigJson(const ModelConfig& c) {
  using oj = nlohmann::ordered_json;
  oj config;
  config["vocab_size"] = c.vocab_size;
  const HfConfigRow& hf = FamilyOf(c.arch).hf;
  switch (hf.names) {
  case HfConfigRow::Names::kBert:
    config["hidden_size"] = c.hidden_size;
    config["intermediate_size"] = c.intermediate_size;
    config["num_hidden_layers"] = c.num_hidden_layers;
    config["num_attention_heads"] = c.num_attention_heads;
    config["max_position_embeddings"] = c.max_position_embeddings;
    config["type_vocab_size"] = c.type_vocab_size;
    config["layer_norm_eps"] = c.layer_norm_eps;
    config["pad_token_id"] = c.pad_token_id;
    if (!c.id2label.empty()) {
      oj id2label = oj::object();
      for (size_t i = 0; i < c.id2label.size(); ++i) id2label[std::to_string(i)] = c.id2label[i];
      config["id2label"] = id2label;
    }
    break;
  case HfConfigRow::Names::kGpt2:
    config["n_positions"] = c.n_positions;
    config["n_embd"] = c.n_embd;
    config["n_layer"] = c.n_layer;
    config["n_head"] = c.n_head;
    config["layer_norm_epsilon"] = c.layer_norm_epsilon;
    break;
  case HfConfigRow::Names::kLlama:
    config["hidden_size"] = c.hidden_size;
    config["intermediate_size"] = c.intermediate_size;
    config["num_hidden_layers"] = c.num_hidden_layers;
    config["num_attention_heads"] = c.num_attention_heads;
    config["num_key_value_heads"] = c.num_key_value_heads;
    config["rms_norm_eps"] = c.rms_norm_eps;
    config["rope_theta"] = c.rope_theta;
    config["max_position_embeddings"] = c.max_position_embeddings;
    config["tie_word_embeddings"] = c.tie_word_embeddings;
    config["head_dim"] = c.head_size();
    if (hf.attention_bias_key) config["attention_bias"] = c.attention_bias;
    if (hf.sliding_window_key) {
      config["sliding_window"] = c.sliding_window > 0 ? oj(c.sliding_window) : oj(nullptr);
    }
    if (c.rope_scaling.rope_type != "default") {
      config["rope_scaling"] = oj::parse(RopeScalingJson(c.rope_scaling));
    }
    if (hf.experts_keys) {
      config["num_local_experts"] = c.num_local_experts;
      config["num_experts_per_tok"] = c.num_experts_per_tok;
      config["router_aux_loss_coef"] = c.router_aux_loss_coef;
      config["output_router_logits"] = c.output_router_logits;
    }
    break;
  }
  return config;
}

// FAILED_PRECONDITION unless every model.config key the spec wrote agrees with init_from's
// config.json; keys the spec did not write come from the file (HF's defaults only where neither
// gives them). Label maps (bert) are the spec's to set (ResolveModelConfig).
Status CheckAgreement(const ModelSpec& spec, const ModelConfig& file, const std::string& src) {
  const nlohmann::ordered_json mine = ModelConfigJson(spec.config);
  const nlohmann::ordered_json theirs = ModelConfigJson(file);
  for (const std::string& key : spec.config_keys) {
    if (key == "id2label" || key == "label2id") continue;
    // rope_parameters is rope_scaling's newer spelling: both compare as rope_scaling.
    const std::string k = key == "rope_parameters" ? "rope_scaling" : key;
    const nlohmann::ordered_json a = mine.contains(k) ? mine[k] : nlohmann::ordered_json(nullptr);
    const nlohmann::ordered_json f = theirs.contains(k) ? theirs[k] : nlohmann::ordered_json(nullptr);
    if (a == f) continue;
    return Status::FailedPrecondition("model.config." + key + ": " + a.dump() +
                                      " disagrees with " + src + " (" + f.dump() +
                                      "); remove it from the spec");
  }
  return Status::Ok();
}

Status ValidateInitFrom(const JobSpec& spec) {
  namespace fs = std::filesystem;
  const std::string& dir = *spec.model.init_from;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("model.init_from: " + dir + ": no such folder");
  }
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(cfg_path, ec)) {
    return Status::NotFound("model.init_from: " + cfg_path + ": no such file (an HF model folder "
                            "holds config.json and model.safetensors)");
  }
  Result<ModelConfig> file = ReadHfConfig(cfg_path);
  if (!file.ok()) {
    return Status::FailedPrecondition("model.init_from: " + file.status().message());
  }
  if (file->arch != spec.model.config.arch) {
    return Status::FailedPrecondition("model.init_from: " + cfg_path + " has model_type " +
                                      ArchName(file->arch) + " but model.arch is " +
                                      ArchName(spec.model.config.arch));
  }
  TRAIND_RETURN_IF_ERROR(CheckAgreement(spec.model, *file, cfg_path));
  TRAIND_RETURN_IF_ERROR(CheckCheckpointQuantization(
      spec, nlohmann::json::parse(file->hf_source_json, nullptr, /*allow_exceptions=*/false), cfg_path));
  if (!fs::exists(fs::path(dir) / "model.safetensors", ec) &&
      !fs::exists(fs::path(dir) / "model.safetensors.index.json", ec)) {
    return Status::NotFound("model.init_from: " + dir + ": neither model.safetensors nor "
                            "model.safetensors.index.json exists");
  }
  if (spec.data.seq_len > file->max_positions()) {
    return Status::FailedPrecondition("data.seq_len: " + std::to_string(spec.data.seq_len) +
                                      " exceeds the max positions " +
                                      std::to_string(file->max_positions()) + " of " + cfg_path);
  }
  return Status::Ok();
}

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

namespace {

// The dotted path of the first key or scalar that is not UTF-8 (yaml-cpp passes raw bytes
// through unchecked), or empty.
std::string FirstNonUtf8Path(const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    return FirstInvalidUtf8(n.Scalar()) == std::string_view::npos ? "" : (path.empty() ? "job spec" : path);
  }
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) {
      std::string bad = FirstNonUtf8Path(n[i], path + "[" + std::to_string(i) + "]");
      if (!bad.empty()) return bad;
    }
  }
  if (n.IsMap()) {
    for (const auto& kv : n) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const std::string sub = path.empty() ? key : path + "." + key;
      if (FirstInvalidUtf8(key) != std::string_view::npos) return path.empty() ? "a key" : path + " (a key)";
      std::string bad = FirstNonUtf8Path(kv.second, sub);
      if (!bad.empty()) return bad;
    }
  }
  return "";
}

}  // namespace

Result<JobSpec> ParseJobSpec(std::string_view text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("job spec: malformed YAML at line " +
                                   std::to_string(e.mark.line + 1) + ", column " +
                                   std::to_string(e.mark.column + 1) + ": " + e.msg);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("job spec: cannot parse: ") + e.what());
  }
  if (const std::string bad = FirstNonUtf8Path(root, ""); !bad.empty()) {
    return Status::InvalidArgument(bad + ": not valid UTF-8 text");
  }
  try {
    return ParseRoot(root, base_dir);
  } catch (const std::exception& e) {  // yaml-cpp may throw on odd nodes; never let it escape
    return Status::InvalidArgument(std::string("job spec: ") + e.what());
  }
}

Status ValidateJobInputs(const JobSpec& spec) {
  const std::string& path = spec.data.train_file;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return Status::NotFound("data.train_file: " + path + ": no such file");
    }
    return Status::FailedPrecondition("data.train_file: " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::FailedPrecondition("data.train_file: " + path + ": not a regular file");
  }
  if (::access(path.c_str(), R_OK) != 0) {
    return Status::FailedPrecondition("data.train_file: " + path + ": not readable: " +
                                      std::strerror(errno));
  }
  const int64_t bytes = static_cast<int64_t>(st.st_size);
  int64_t width = 1;
  if (spec.data.format == "tokens") width = spec.data.token_dtype == "uint32" ? 4 : 2;
  if (bytes % width != 0) {
    return Status::FailedPrecondition("data.train_file: " + path + ": " + std::to_string(bytes) +
                                      " bytes is not a multiple of " + std::to_string(width) +
                                      " (data.token_dtype " + spec.data.token_dtype + ")");
  }
  const int64_t n = bytes / width;
  const int64_t n_train = TrainTokenCount(n, spec.data.validation_split);
  // bert with jsonl: one example per line, of any length (their count is checked when loaded).
  // Causal jsonl of prompt-completion or conversational lines: examples too.
  bool examples = spec.model.config.encoder() && spec.data.format == "jsonl";
  if (!examples && spec.data.format == "jsonl") {
    Result<JsonlKind> kind = PeekJsonlKind(spec.data);
    examples = kind.ok() && *kind != JsonlKind::kText;
  }
  if (examples) {
    // nothing to check from the size alone
  } else if (n_train < spec.data.seq_len + 1) {
    return Status::FailedPrecondition(
        "data.train_file: " + path + ": " + std::to_string(n) + " tokens give a training stream "
        "of " + std::to_string(n_train) + " tokens, shorter than one window of seq_len + 1 = " +
        std::to_string(spec.data.seq_len + 1) + ": use more data or a smaller data.seq_len");
  }
  if (!examples && n - n_train > 0 && n - n_train < spec.data.seq_len + 1) {
    return Status::FailedPrecondition(
        "data.validation_split: the validation stream of " + path + " has " +
        std::to_string(n - n_train) + " tokens, shorter than one window of seq_len + 1 = " +
        std::to_string(spec.data.seq_len + 1) + ": raise validation_split, set it to 0, or lower "
        "data.seq_len");
  }
  if (spec.model.init_from) TRAIND_RETURN_IF_ERROR(ValidateInitFrom(spec));
  const TrainingSpec& t = spec.training;
  if (t.resume_from_checkpoint) {
    const std::string& dir = *t.resume_from_checkpoint;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Status::NotFound("training.resume_from_checkpoint: " + dir + ": no such folder");
    }
    if (::stat((dir + "/" + kTrainerStateFile).c_str(), &st) != 0) {
      return Status::FailedPrecondition("training.resume_from_checkpoint: " + dir +
                                        " is not a checkpoint (no " + kTrainerStateFile + ")");
    }
  }
  if (t.resume_from_last_checkpoint && FindLatestCheckpoint(spec.output_dir) < 0) {
    return Status::FailedPrecondition("training.resume_from_checkpoint: true, but output_dir " + spec.output_dir +
                                      " holds no complete checkpoint-<step>/ to continue from");
  }
  return Status::Ok();
}

Status CheckOutputDirFree(const JobSpec& spec) {
  const TrainingSpec& t = spec.training;
  if (t.overwrite_output_dir || t.resume_from_last_checkpoint || t.resume_from_checkpoint) return Status::Ok();
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(spec.output_dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f == kModelFile || f == kAdapterModelFile || f == kTrainerStateFile ||
        (f.rfind("checkpoint-", 0) == 0 && e.is_directory(ec))) {
      found.push_back(f);
    }
  }
  if (found.empty()) return Status::Ok();  // also a missing output_dir (ec set)
  std::sort(found.begin(), found.end());
  std::string names;
  for (size_t i = 0; i < found.size() && i < 3; ++i) names += (i ? ", " : "") + found[i];
  if (found.size() > 3) names += " and " + std::to_string(found.size() - 3) + " more";
  return Status::FailedPrecondition(
      "output_dir: " + spec.output_dir + " holds another run's files (" + names +
      "); set training.overwrite_output_dir: true to replace them, training.resume_from_checkpoint: "
      "true to continue that run, or choose another output_dir");
}

// long function: one line per spec field, in the spec's order (the inverse of the parser)
std::string JobSpecToJson(const JobSpec& s) {
  using oj = nlohmann::ordered_json;
  const ModelConfig& c = s.model.config;
  oj config = ModelConfigJson(c);
  if (s.model.init_from) {
    // With init_from only the keys the spec wrote: the rest comes from config.json (a re-parse of
    // this document must not turn defaults into values that disagree with the file).
    oj given = oj::object();
    for (const std::string& k : s.model.config_keys) {
      if (config.contains(k)) given[k] = config[k];
    }
    config = given;
  }
  auto opt = [](const std::optional<std::string>& v) { return v ? oj(*v) : oj(nullptr); };
  oj j;
  j["name"] = s.name;
  j["model"] = {{"arch", ArchName(c.arch)}, {"config", config}, {"init_from", opt(s.model.init_from)}};
  if (s.model.quantization_config) {
    j["model"]["quantization_config"] = QuantizationConfigJson(*s.model.quantization_config);
  }
  if (c.encoder()) {  // the causal families' head is none: their documents stay as before
    j["model"]["head"] = c.head;
    j["model"]["num_labels"] = c.num_labels;
  }
  const DataSpec& d = s.data;
  j["data"] = {{"train_file", d.train_file},     {"format", d.format},
               {"token_dtype", d.token_dtype},   {"tokenizer", d.tokenizer},
               {"seq_len", d.seq_len},           {"validation_split", d.validation_split},
               {"shuffle", d.shuffle},           {"text_field", d.text_field}};
  if (d.label_field) j["data"]["label_field"] = *d.label_field;
  if (!c.encoder() && d.format == "jsonl") {  // instruction data's fields (JOBSPEC.md)
    j["data"]["prompt_field"] = d.prompt_field;
    j["data"]["completion_field"] = d.completion_field;
    j["data"]["messages_field"] = d.messages_field;
    j["data"]["chat_template"] = opt(d.chat_template);
    j["data"]["assistant_only_loss"] = d.assistant_only_loss;
    j["data"]["completion_only_loss"] = d.completion_only_loss;
    j["data"]["packing"] = d.packing;
  }
  const TrainingSpec& t = s.training;
  oj tr;
  tr["max_steps"] = t.max_steps;
  tr["per_device_train_batch_size"] =
      t.auto_batch() ? oj("auto") : oj(t.per_device_train_batch_size);
  tr["gradient_accumulation_steps"] = t.gradient_accumulation_steps;
  tr["effective_batch_size"] = t.effective_batch_size ? oj(*t.effective_batch_size) : oj(nullptr);
  tr["learning_rate"] = t.learning_rate;
  tr["lr_scheduler_type"] = t.lr_scheduler_type;
  tr["warmup_steps"] = t.warmup_steps;
  tr["weight_decay"] = t.weight_decay;
  tr["adam_beta1"] = t.adam_beta1;
  tr["adam_beta2"] = t.adam_beta2;
  tr["adam_epsilon"] = t.adam_epsilon;
  tr["max_grad_norm"] = t.max_grad_norm;
  tr["optim"] = t.optim;
  {
    const OptimArgs& a = t.optim_args;
    switch (OptimizerOf(t).kind) {
      case OptimKind::kSgd:
        tr["optim_args"] = {{"momentum", a.momentum}, {"dampening", a.dampening}, {"nesterov", a.nesterov}};
        break;
      case OptimKind::kAdafactor:
        tr["optim_args"] = {{"scale_parameter", a.scale_parameter}, {"relative_step", a.relative_step},
                            {"warmup_init", a.warmup_init}, {"beta1", a.beta1 ? oj(*a.beta1) : oj(nullptr)},
                            {"clip_threshold", a.clip_threshold}, {"decay_rate", a.decay_rate}};
        break;
      case OptimKind::kAdamW:
      case OptimKind::kAdamW8bit:
        tr["optim_args"] = nullptr;
        break;
    }
  }
  tr["fp16"] = t.fp16;
  tr["bf16"] = t.bf16;
  tr["tf32"] = t.tf32;
  tr["gradient_checkpointing"] = t.gradient_checkpointing;
  tr["gradient_checkpointing_every"] = t.gradient_checkpointing_every;
  tr["offload"] = t.offload;
  tr["offload_dir"] = opt(t.offload_dir);
  if (t.peft) {
    const PeftSpec& p = *t.peft;
    tr["peft"] = {{"type", p.type}, {"r", p.r}, {"lora_alpha", p.lora_alpha},
                  {"lora_dropout", p.lora_dropout}, {"target_modules", p.target_modules},
                  {"merge", p.merge}};
  } else {
    tr["peft"] = nullptr;
  }
  tr["seed"] = t.seed;
  tr["logging_steps"] = t.logging_steps;
  tr["eval_steps"] = t.eval_steps;
  tr["save_steps"] = t.save_steps;
  if (t.sample_every > 0) tr["sample_every"] = t.sample_every;
  tr["overwrite_output_dir"] = t.overwrite_output_dir;
  tr["resume_from_checkpoint"] = t.resume_from_checkpoint ? oj(*t.resume_from_checkpoint)
                                 : t.resume_from_last_checkpoint ? oj(true)
                                                                 : oj(nullptr);
  j["training"] = tr;
  j["output_dir"] = s.output_dir;
  if (s.distributed) {
    const DistributedSpec& ds = *s.distributed;
    auto opt_int = [](const std::optional<int64_t>& v) { return v ? oj(*v) : oj(nullptr); };
    j["distributed"] = {{"world_size", opt_int(ds.world_size)}, {"rank", opt_int(ds.rank)},
                        {"master_addr", opt(ds.master_addr)},
                        {"master_port", opt_int(ds.master_port)}, {"zero_stage", ds.zero_stage}};
  }
  return j.dump(2);
}

}  // namespace traind::engine
