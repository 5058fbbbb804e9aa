// Chat templates: an interpreter for the Jinja subset that Hugging Face chat templates use (the
// `chat_template` of a model's tokenizer_config.json), rendering as transformers'
// apply_chat_template does (Jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the loopcontrols extension, HF's tojson, raise_exception and strftime_now).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +); statements if/elif/else,
// for (with an `if` filter, for-else, loop.*, break/continue), set (names, tuples, ns.attr, block
// set), macro (positional, keyword and default arguments) and call/caller, filter blocks,
// generation/endgeneration (rendered as plain text, as transformers' AssistantTracker does); the
// operators of Jinja expressions, slicing, literals, the filters and tests of the tables in
// chat_template_builtins.cc and the str/dict methods that templates call; globals
// raise_exception, strftime_now, namespace, range, dict. Values render as Python does (True,
// None, 1.0, ['a']). Anything else fails at Parse (a statement, filter or test) or at Render (a
// method), naming the construct and the template line. Case changes (upper, lower, title,
// capitalize) touch ASCII letters only.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "traind/engine/status.h"

namespace traind::engine {

namespace chat_template_internal {
struct Program;
}

class ChatTemplate {
 public:
  // Parses a Jinja chat template. `name` (a model id or file name) appears in every error. A
  // syntax error or an unsupported statement, filter or test is InvalidArgument naming the
  // template line and the construct ("chat template 'x' line 7: filter 'wordcount' is not
  // supported").
  static Result<ChatTemplate> Parse(std::string_view source, std::string name);

  // Renders with `vars`, a JSON object whose members are the template's variables: `messages` (an
  // array of {role, content, ...}), `add_generation_prompt`, and the tokenizer_config.json's
  // special tokens (bos_token, eos_token, ...), tools, ... JSON null is Python's None. A template
  // that calls raise_exception(msg) fails with InvalidArgument carrying msg; any other runtime
  // error (an undefined variable used strictly, a type error) is InvalidArgument naming the line.
  // Thread-safe: a parsed template may be rendered from several threads at once.
  // Python dicts keep their insertion order (tojson shows it): pass an ordered_json (parsed with
  // nlohmann::ordered_json::parse); the nlohmann::json overload sees objects with sorted keys.
  Result<std::string> Render(const nlohmann::ordered_json& vars) const;
  Result<std::string> Render(const nlohmann::json& vars) const;

  const std::string& name() const { return name_; }

 private:
  ChatTemplate(std::shared_ptr<const chat_template_internal::Program> program, std::string name)
      : program_(std::move(program)), name_(std::move(name)) {}

  std::shared_ptr<const chat_template_internal::Program> program_;
  std::string name_;
};

// The special tokens of a tokenizer_config.json as chat template variables, as transformers'
// special_tokens_map passes them: bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
// mask_token (a string, or an AddedToken object's "content") and additional_special_tokens (a
// list of them); absent and null ones are left out.
nlohmann::ordered_json ChatTemplateSpecialTokens(const nlohmann::ordered_json& tokenizer_config);

}  // namespace traind::engine
