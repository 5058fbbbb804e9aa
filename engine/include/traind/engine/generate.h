// Text generation from a trained model: `trainctl generate` (run by traind's job runner on its
// device) and the engine's tests. The model folder is what a job writes to output_dir (config.json
// + model.safetensors, or PEFT's adapter files over a local base model), or any HF gpt2/llama
// folder. Decoding uses a key/value cache (one token per step, never a re-run of the sequence).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "traind/engine/devices.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  // The prompt is a user message (trainctl generate --chat): rendered as
  // [{"role": "user", "content": prompt}] with the model's chat template (the model folder's
  // tokenizer_config.json "chat_template", else its chat_template.jinja; then the tokenizer
  // folder's), add_generation_prompt true and its special tokens, then encoded without adding
  // special tokens (the template writes them), as transformers' apply_chat_template does.
  // INVALID_ARGUMENT when the model has no chat template.
  bool chat = false;
  // data.tokenizer's forms ("byte", a file or folder); "" = the model folder's tokenizer files
  // (for adapters, then the base model's), else byte.
  std::string tokenizer;
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off; 1: greedy
  double top_p = 1.0;        // nucleus sampling; 1: off
  uint64_t seed = 0;
  bool stop_at_eos = true;   // stop after the tokenizer's end-of-text token
};

struct GenerateResult {
  std::string prompt;          // the text prompt_ids encode (with chat: the rendered template)
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;   // the new tokens (the eos that ended it included)
  std::string text;           // the continuation (prompt excluded), valid UTF-8
  std::string finish_reason;  // "length" | "eos" | "max_positions"
  std::string device;         // the device it ran on ("cpu", "cuda:0", ...)
  double seconds = 0;         // decoding time (prompt and new tokens), loading excluded
};

// INVALID_ARGUMENT naming the option (max_new_tokens >= 1, temperature >= 0, top_k >= 0,
// 0 < top_p <= 1, a model_dir and a prompt) without touching any file.
Status ValidateGenerateOptions(const GenerateOptions& options);

// Loads the model folder and its tokenizer, opens `device` and generates. NOT_FOUND naming the
// missing file; INVALID_ARGUMENT for a folder that is not a gpt2/llama model, a prompt longer
// than the model's positions or a tokenizer whose ids the model does not have.
Result<GenerateResult> Generate(const GenerateOptions& options, const DeviceOptions& device);

// The next token from `logits` (the first `vocab_limit` entries are candidates), HF's order:
// temperature, then top-k, then top-p; greedy (the first maximum) when temperature == 0 or
// top_k == 1.
int32_t SampleToken(const std::vector<float>& logits, int64_t vocab_limit,
                    const GenerateOptions& options, std::mt19937_64* rng);

}  // namespace traind::engine
