// JobSpec: the validated, typed form of a job spec document (docs/jobspec.md).
// ParseJobSpec turns YAML or JSON text into a JobSpec; every unknown field, wrong type or bad value
// is an INVALID_ARGUMENT whose message starts with the field path ("training.lerning_rate: unknown
// field"). A field whose feature is not built yet is rejected the same way ("training.optim:
// adafactor is not supported yet"), never ignored.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "traind/engine/status.h"

namespace traind::engine {

// A model family (model.arch, HF config.json model_type). Parsed once, by ParseArch, from the
// spec's model.arch or init_from's config.json; everything after switches over the enum (no
// default case, so a new entry fails the build until every switch handles it) or reads the
// family's row (engine/src/models/layout.cc, FamilyOf).
enum class Arch { kGpt2, kLlama, kMistral, kQwen2, kQwen3, kGemma, kBert, kMixtral };
inline constexpr int kNumArchs = 8;
inline constexpr Arch kAllArchs[kNumArchs] = {Arch::kGpt2,  Arch::kLlama, Arch::kMistral,
                                              Arch::kQwen2, Arch::kQwen3, Arch::kGemma,
                                              Arch::kBert,  Arch::kMixtral};
// The family's model.arch and HF model_type: "gpt2", "llama", ...
const char* ArchName(Arch arch);
// The one parser of a family name: the family whose model_type is `name`, or nullopt (the
// caller's message names the known ones; a family whose row is not built yet parses, and the
// job spec refuses it as "not supported yet").
std::optional<Arch> ParseArch(std::string_view name);
std::ostream& operator<<(std::ostream& os, Arch arch);  // ArchName (messages, test output)

// Architecture hyper-parameters, named as in the HF config.json of the architecture. Fields that do
// not apply to an arch stay at their defaults. Defaults are HF's defaults for that arch.
struct ModelConfig {
  Arch arch = Arch::kGpt2;
  int64_t vocab_size = 50257;
  // gpt2
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;
  // llama
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // < num_attention_heads: grouped-query attention
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;  // gpt2 is always tied
  // The llama-like families (llama, mistral, qwen2, mixtral). head_dim: the size of one head (0:
  // hidden_size / num_attention_heads, HF's default). attention_bias (llama): q/k/v/o_proj carry
  // biases; qwen2 always has q/k/v biases and none on o_proj.
  int64_t head_dim = 0;
  bool attention_bias = false;
  // HF rope_scaling (newer config.json files write it as rope_parameters): rope_type "default"
  // (plain RoPE), "linear" (factor) or "llama3" (factor, low_freq_factor, high_freq_factor,
  // original_max_position_embeddings; Llama 3.1 / 3.2).
  struct RopeScaling {
    std::string rope_type = "default";
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position_embeddings = 8192;
    bool operator==(const RopeScaling&) const = default;
  };
  RopeScaling rope_scaling;
  // mistral (and qwen2 with use_sliding_window): each query attends its sliding_window most
  // recent keys (itself included); 0 = full causal attention.
  int64_t sliding_window = 0;
  // The config.json this config was read from (a JSON object; empty for a spec's config): the
  // output config.json keeps every key of it that traind does not write itself (token ids,
  // transformers_version, ...), so transformers loads the output as the same model.
  std::string hf_source_json;
  // bert (HF BertConfig; it shares hidden_size, intermediate_size, num_hidden_layers,
  // num_attention_heads and max_position_embeddings with llama's names; its MLM decoder is always
  // tied to the word embeddings)
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  // The task head (model.head): "" for the causal families (their lm_head); bert:
  // "sequence_classification" (pooler + classifier) | "masked_lm" (the MLM head).
  std::string head;
  int64_t num_labels = 2;             // sequence_classification: the classifier's outputs
  std::vector<std::string> id2label;  // label names by id (config.json id2label; empty: LABEL_i)
  // mixtral (HF MixtralConfig; the rest is llama's names): a sparse mixture-of-experts MLP in
  // every block, each token routed to num_experts_per_tok of num_local_experts SwiGLU experts.
  // With output_router_logits the load-balancing loss (router_aux_loss_coef x HF's
  // load_balancing_loss_func) is part of the training loss, as in MixtralForCausalLM.
  int64_t num_local_experts = 8;
  int64_t num_experts_per_tok = 2;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;

  // Arch-independent views (the family's row says which of its keys hold each; layout.cc).
  bool encoder() const;  // bidirectional, with a padding mask (bert)
  int64_t num_layers() const;
  int64_t channels() const;
  int64_t num_heads() const;
  // The size of one attention head: head_dim where the family has it and it is set.
  int64_t head_size() const;
  int64_t num_kv_heads() const;
  int64_t max_positions() const;
  int64_t mlp_width() const;  // the MLP's hidden size (4 n_embd for gpt2, else intermediate_size)
  double norm_eps() const;    // the norms' epsilon under the family's key
  // The config key that holds max_positions(): "n_positions" or "max_position_embeddings".
  const char* max_positions_key() const;
  bool tied_embeddings() const;
};

// model.quantization_config (JOBSPEC.md): QLoRA's frozen base in 4 bits, under HF
// BitsAndBytesConfig's names and defaults. Only with training.peft. bnb_4bit_compute_dtype agrees
// with training.bf16 / fp16, or sets them when neither is given; after parsing it always names the
// job's compute type.
struct QuantizationSpec {
  bool load_in_4bit = false;                 // must be true (4 bits are the one width built)
  std::string bnb_4bit_quant_type = "fp4";   // "nf4" | "fp4" (BitsAndBytesConfig's default: fp4)
  bool bnb_4bit_use_double_quant = false;    // the absmax values in 8 bits (blocks of 256)
  std::string bnb_4bit_compute_dtype;        // "bfloat16" | "float16" | "float32"
};

struct ModelSpec {
  ModelConfig config;
  std::optional<QuantizationSpec> quantization_config;  // null: the base in the compute type
  // An HF model folder (config.json + model.safetensors or model.safetensors.index.json) to
  // fine-tune. When set, its config.json is the model config and `model.config` must be absent or
  // agree with it.
  std::optional<std::string> init_from;
  // The model.config keys the spec wrote (only these are compared with init_from's config.json;
  // the others take config.json's values, or HF's defaults where neither gives them).
  std::vector<std::string> config_keys;
};

struct DataSpec {
  std::string train_file;           // required; resolved against the spec's base directory
  std::string format = "text";      // "text" | "tokens" | "jsonl"
  std::string token_dtype = "uint16";  // "uint16" | "uint32" (format: tokens)
  std::string tokenizer = "byte";   // "byte", or a tokenizer file or folder (JOBSPEC.md)
  std::string text_field = "text";  // format: jsonl: the field of each line's object with the text
  // format: jsonl with model.head sequence_classification (required there, refused elsewhere): the
  // field holding each line's label, an integer in [0, num_labels) or a name of config id2label.
  std::optional<std::string> label_field;
  // format: jsonl for the causal families (JOBSPEC.md "Instruction data"): the fields of the
  // prompt-completion and conversational kinds, the chat template file (null: the tokenizer
  // folder's), which tokens carry loss, and packing (several examples a row, instruction_data.h).
  std::string prompt_field = "prompt";
  std::string completion_field = "completion";
  std::string messages_field = "messages";
  std::optional<std::string> chat_template;  // resolved against the spec's base directory
  bool assistant_only_loss = false;
  bool completion_only_loss = true;
  bool packing = false;
  int64_t seq_len = 128;
  double validation_split = 0.1;    // last fraction of the token stream held out for eval, [0, 1)
  bool shuffle = true;
};

// training.optim_args: per-optimizer options under their HF / torch names (JOBSPEC.md). Only the
// options of the chosen optimizer may be given; absent ones keep these defaults.
struct OptimArgs {
  // sgd (torch.optim.SGD)
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // adafactor (transformers.optimization.Adafactor). Defaults as the HF Trainer's
  // optim="adafactor": the scheduled learning_rate, no relative step, no parameter scaling.
  bool scale_parameter = false;
  bool relative_step = false;
  bool warmup_init = false;
  std::optional<double> beta1;  // first moment only when set
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
};

// training.peft: LoRA adapters (HF PEFT's LoraConfig names and defaults).
struct PeftSpec {
  std::string type = "lora";                 // the only type
  int64_t r = 8;                             // adapter rank, >= 1
  double lora_alpha = 8.0;                   // scaling = lora_alpha / r
  double lora_dropout = 0.0;                 // only 0.0 is built
  std::vector<std::string> target_modules;   // empty: PEFT's default for the family
  bool merge = false;                        // also write the merged full model
};

struct TrainingSpec {
  int64_t max_steps = 200;                   // optimizer steps, >= 1
  int64_t per_device_train_batch_size = 8;   // sequences per micro-batch; 0 means "auto"
  int64_t gradient_accumulation_steps = 1;
  std::optional<int64_t> effective_batch_size;  // sequences per optimizer step (with "auto")
  double learning_rate = 3e-4;
  std::string lr_scheduler_type = "cosine";  // "constant" | "linear" | "cosine"
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;                // 0 disables clipping
  std::string optim = "adamw";               // "adamw" | "adafactor" | "adamw_8bit" | "sgd"
  OptimArgs optim_args;
  bool fp16 = false;
  bool bf16 = false;
  bool tf32 = false;
  bool gradient_checkpointing = false;
  int64_t gradient_checkpointing_every = 1;  // checkpoint every k-th block (extension)
  std::string offload = "none";
  std::optional<std::string> offload_dir;
  std::optional<PeftSpec> peft;              // null: full fine-tuning
  int64_t seed = 42;
  int64_t logging_steps = 10;
  int64_t eval_steps = 0;                    // 0 = only at the end
  int64_t save_steps = 0;                    // 0 = only at the end
  int64_t sample_every = 0;                  // > 0: a generated sample in the log every N steps
  // A fresh run refuses an output_dir holding another run's files (model.safetensors,
  // adapter_model.safetensors, trainer_state.json, checkpoint-<step>/) unless this is true.
  bool overwrite_output_dir = false;
  // resume_from_checkpoint (HF's name): true = continue from the newest checkpoint-<step>/ in
  // output_dir; a path = continue from that checkpoint folder (resolved against base_dir). A
  // restart of the same job (RunOptions::resume) prefers output_dir's newest checkpoint.
  bool resume_from_last_checkpoint = false;
  std::optional<std::string> resume_from_checkpoint;

  bool auto_batch() const { return per_device_train_batch_size == 0; }
};

// `distributed:` (data parallel, one rank per process). A field left out stays unset here; the
// job runner (worker/, `traind run`) fills it from WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT as
// torchrun / PyTorchJob set them, and opens the communicator (RunOptions::open_communicator).
struct DistributedSpec {
  std::optional<int64_t> world_size;  // >= 1; 1 = a plain run
  std::optional<int64_t> rank;        // 0 .. world_size-1
  std::optional<std::string> master_addr;
  std::optional<int64_t> master_port;  // 1 .. 65535
  int64_t zero_stage = 0;              // 0 (1: later)
};

struct JobSpec {
  std::string name;
  ModelSpec model;
  DataSpec data;
  TrainingSpec training;
  std::string output_dir = "./runs/job";
  std::optional<DistributedSpec> distributed;  // null / absent: one process (env not read)
};

// Offset of the first byte of `s` that breaks UTF-8, or npos (every string of a spec must be UTF-8:
// specs are printed as JSON).
size_t FirstInvalidUtf8(std::string_view s);

// Parses a YAML (or JSON, a subset of YAML) job spec. Relative paths (data.train_file,
// model.init_from, output_dir, training.offload_dir) are resolved against `base_dir` when it is not
// empty. Validates every field; does not touch the file system (see ValidateJobInputs).
Result<JobSpec> ParseJobSpec(std::string_view text, const std::string& base_dir = "");

// Checks what needs the file system: the data file exists and is readable and long enough for one
// window, init_from holds a loadable config.json, resume_from_checkpoint names a checkpoint (a
// path) or output_dir holds one (true). FAILED_PRECONDITION / NOT_FOUND with the path.
Status ValidateJobInputs(const JobSpec& spec);

// For a fresh run (not a restart or resume of the same job): FAILED_PRECONDITION naming output_dir
// and the files when it holds another run's results (model.safetensors, adapter_model.safetensors,
// trainer_state.json, checkpoint-<step>/) and the spec neither sets training.overwrite_output_dir
// nor training.resume_from_checkpoint. OK for a missing or empty output_dir.
Status CheckOutputDirFree(const JobSpec& spec);

// The spec as a canonical JSON document (every field, resolved values), parseable by ParseJobSpec.
std::string JobSpecToJson(const JobSpec& spec);

}  // namespace traind::engine
