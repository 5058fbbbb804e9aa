// Instruction data for the causal families (JOBSPEC.md data.format jsonl, "Instruction data"):
// each jsonl line one example, its kind read from the fields present, as TRL's SFTTrainer does:
//   {text_field: ...}                          language modelling: the token stream (token_data.h)
//   {prompt_field: ..., completion_field: ...} prompt-completion
//   {messages_field: [{role, content}, ...]}   conversational
// The whole file is one kind; a line of another kind, a line that is not a JSON object, lacks
// every known field, or holds a malformed conversation is one error naming the file, the 1-based
// line and the field ("data.train_file: /p/chat.jsonl line 7: messages[2].content: expected a
// string"). Nothing is skipped silently (blank lines aside).
//
// Examples (packed or not, see LoadInstructionData):
// - prompt-completion: Encode(prompt + completion, add_special_tokens) then the tokenizer's eos
//   id (an error when it has none). completion_only_loss: the tokens from the count of
//   Encode(prompt, add_special_tokens) on carry loss (TRL's completion mask), the eos included;
//   else every token does.
// - conversational: the chat template (data.chat_template, else the tokenizer folder's
//   tokenizer_config.json "chat_template" (a string, or a list of {name, template}: "default"),
//   else its chat_template.jinja) rendered with messages, add_generation_prompt false and the
//   tokenizer_config.json's special tokens, encoded without special tokens.
//   assistant_only_loss: the tokens whose first character lies in an assistant span (for
//   assistant message i, the text render(messages[:i+1]) adds after render(messages[:i],
//   add_generation_prompt true); an error naming the template when that is not a prefix) carry
//   loss; else every token does.
// Labels are HF's: labels[i] = ids[i] where token i carries loss, else -100; labels[0] = -100.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/example_data.h"
#include "data/token_data.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"

namespace traind::engine {

enum class JsonlKind { kText, kPromptCompletion, kConversational };
const char* JsonlKindName(JsonlKind kind);

// The kind of data.train_file's first non-blank line (jsonl files; kText for an empty file or a
// first line that is not JSON: the full read reports it). NOT_FOUND when the file is missing.
Result<JsonlKind> PeekJsonlKind(const DataSpec& spec);

struct InstructionExample {
  std::string text;             // prompt + completion, or the rendered conversation
  std::vector<int32_t> ids;     // untruncated
  std::vector<int32_t> labels;  // one per id; -100: no loss
};

// The examples of data.train_file (prompt-completion or conversational; `limit` >= 0: only the
// first `limit`, read no further than needed), in file order. `init_from`: model.init_from, whose
// folder holds the tokenizer when data.tokenizer names none. *kind (optional) gets the kind.
Result<std::vector<InstructionExample>> ReadInstructionExamples(const DataSpec& spec,
                                                                const std::string& init_from,
                                                                int64_t limit = -1,
                                                                JsonlKind* kind = nullptr);

// A chat prompt for generation: [{"role": "user", "content": user_text}] rendered with the first
// of `folders` that holds a chat template (tokenizer_config.json "chat_template", else
// chat_template.jinja), add_generation_prompt true and that folder's special tokens, as
// apply_chat_template(add_generation_prompt=True) renders it. INVALID_ARGUMENT naming the folders
// when none holds one, or carrying the template's own error.
Result<std::string> RenderChatPrompt(const std::vector<std::string>& folders,
                                     const std::string& user_text);

// The training and validation sets (ExampleSet::OfLabelledRows: each example truncated to
// seq_len + 1 ids, right-padded with the tokenizer's pad id, else its eos, else 0; with
// data.packing, ExampleSet::OfPackedRows: the examples of each set packed best-fit decreasing
// into rows of seq_len positions, packing.h): the last validation_split of the examples held out
// (before packing), as the encoders' examples.
Result<ExampleData> LoadInstructionData(const DataSpec& spec, const std::string& init_from,
                                        const TokenizeProgress& progress = {});

}  // namespace traind::engine
