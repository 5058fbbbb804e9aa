// Instruction data: see instruction_data.h.
#include "data/instruction_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/token_stream.h"
#include "data/window_order.h"
#include "traind/engine/spec_examples.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace {

using ojson = nlohmann::ordered_json;

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::string> ReadAll(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(what + ": " + path + ": cannot read the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The byte offset of the first invalid UTF-8 sequence, or npos.
size_t FirstBadUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || (n == 2 && c < 0xC2) || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// One parsed line: its kind and the object.
struct Line {
  JsonlKind kind;
  ojson obj;
};

// Parses and checks one non-blank line; `where` is "data.train_file: F line N".
Result<Line> ParseLine(std::string_view line, const DataSpec& spec, const std::string& where) {
  if (size_t bad = FirstBadUtf8(line); bad != std::string_view::npos) {
    return Status::InvalidArgument(where + ": not valid UTF-8 (byte " + std::to_string(bad + 1) +
                                   " of the line)");
  }
  Line out{JsonlKind::kText, {}};
  try {
    out.obj = ojson::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!out.obj.is_object()) return Status::InvalidArgument(where + ": expected a JSON object");
  const ojson& o = out.obj;
  const std::string& mf = spec.messages_field;
  if (o.contains(mf)) {
    out.kind = JsonlKind::kConversational;
    const ojson& msgs = o[mf];
    if (!msgs.is_array()) {
      return Status::InvalidArgument(where + ": " + mf + ": expected a list of messages, got " +
                                     std::string(msgs.type_name()));
    }
    if (msgs.empty()) return Status::InvalidArgument(where + ": " + mf + ": an empty conversation");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::string at = mf + "[" + std::to_string(i) + "]";
      const ojson& m = msgs[i];
      if (!m.is_object()) {
        return Status::InvalidArgument(where + ": " + at + ": expected an object with role and "
                                       "content, got " + std::string(m.type_name()));
      }
      for (const char* key : {"role", "content"}) {
        if (!m.contains(key)) {
          return Status::InvalidArgument(where + ": " + at + ": no '" + key + "'");
        }
        if (!m[key].is_string()) {
          return Status::InvalidArgument(where + ": " + at + "." + key + ": expected a string, got " +
                                         std::string(m[key].type_name()));
        }
      }
    }
    return out;
  }
  const std::string& pf = spec.prompt_field;
  const std::string& cf = spec.completion_field;
  if (o.contains(pf) || o.contains(cf)) {
    out.kind = JsonlKind::kPromptCompletion;
    for (const std::string* f : {&pf, &cf}) {
      if (!o.contains(*f)) {
        return Status::InvalidArgument(where + ": no '" + *f + "' beside '" +
                                       (f == &pf ? cf : pf) + "' (prompt-completion data)");
      }
      if (!o[*f].is_string()) {
        return Status::InvalidArgument(where + ": " + *f + ": expected a string, got " +
                                       std::string(o[*f].type_name()));
      }
    }
    return out;
  }
  if (o.contains(spec.text_field)) {
    if (!o[spec.text_field].is_string()) {
      return Status::InvalidArgument(where + ": " + spec.text_field + ": expected a string, got " +
                                     std::string(o[spec.text_field].type_name()));
    }
    return out;
  }
  return Status::InvalidArgument(
      where + ": no known field: expected " + Quote(spec.text_field) + " (language modelling), " +
      Quote(pf) + " and " + Quote(cf) + " (prompt-completion) or " + Quote(mf) +
      " (conversational)");
}

// Where the tokenizer's files are: data.tokenizer's folder (or its file's); with the byte
// tokenizer (no files) the init_from folder's tokenizer_config.json and chat template.
std::string TokenizerFolder(const DataSpec& spec, const std::string& init_from) {
  if (!spec.tokenizer.empty() && spec.tokenizer != "byte") {
    if (IsDir(spec.tokenizer)) return spec.tokenizer;
    const size_t slash = spec.tokenizer.rfind('/');
    return slash == std::string::npos ? "." : spec.tokenizer.substr(0, slash);
  }
  return init_from;
}

// The tokenizer folder's tokenizer_config.json (an empty object when there is none).
Result<ojson> TokenizerConfig(const std::string& folder) {
  if (folder.empty()) return ojson::object();
  const std::string path = folder + "/tokenizer_config.json";
  if (!IsFile(path)) return ojson::object();
  TRAIND_ASSIGN_OR_RETURN(std::string text, ReadAll(path, "data.tokenizer"));
  try {
    ojson j = ojson::parse(text);
    if (!j.is_object()) {
      return Status::InvalidArgument("data.tokenizer: " + path + ": expected a JSON object");
    }
    return j;
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("data.tokenizer: " + path + ": not valid JSON (" + e.what() + ")");
  }
}

Result<ChatTemplate> LoadTemplate(const DataSpec& spec, const std::string& folder,
                                  const ojson& config) {
  if (spec.chat_template) {
    TRAIND_ASSIGN_OR_RETURN(std::string src, ReadAll(*spec.chat_template, "data.chat_template"));
    Result<ChatTemplate> t = ChatTemplate::Parse(src, *spec.chat_template);
    if (!t.ok()) return Status::InvalidArgument("data.chat_template: " + t.status().message());
    return t;
  }
  const std::string cfg_path = folder + "/tokenizer_config.json";
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const ojson& ct = config["chat_template"];
    std::string src;
    if (ct.is_string()) {
      src = ct.get<std::string>();
    } else if (ct.is_array()) {
      bool found = false;
      for (const ojson& e : ct) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          src = e["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return Status::InvalidArgument("data.chat_template: " + cfg_path +
                                       ": chat_template lists no template named 'default'");
      }
    } else {
      return Status::InvalidArgument("data.chat_template: " + cfg_path +
                                     ": chat_template must be a string or a list of {name, template}");
    }
    Result<ChatTemplate> t = ChatTemplate::Parse(src, cfg_path);
    if (!t.ok()) return Status::InvalidArgument("data.chat_template: " + t.status().message());
    return t;
  }
  const std::string jinja = folder + "/chat_template.jinja";
  if (!folder.empty() && IsFile(jinja)) {
    TRAIND_ASSIGN_OR_RETURN(std::string src, ReadAll(jinja, "data.chat_template"));
    Result<ChatTemplate> t = ChatTemplate::Parse(src, jinja);
    if (!t.ok()) return Status::InvalidArgument("data.chat_template: " + t.status().message());
    return t;
  }
  return Status::InvalidArgument(
      "data.chat_template: conversational data needs a chat template: none given in "
      "data.chat_template, and " +
      (folder.empty() ? std::string("the tokenizer (") + spec.tokenizer +
                            ") has no folder with a tokenizer_config.json or chat_template.jinja"
                      : "neither " + cfg_path + " (\"chat_template\") nor " + jinja + " holds one"));
}

// Everything an example needs, opened once.
struct Context {
  const DataSpec* spec = nullptr;
  std::unique_ptr<Tokenizer> tok;
  std::optional<ChatTemplate> tmpl;
  ojson special;  // the template's special-token variables
};

Result<std::string> Render(const Context& c, const ojson& messages, size_t count, bool gen) {
  ojson vars = c.special;
  ojson msgs = ojson::array();
  for (size_t i = 0; i < count; ++i) msgs.push_back(messages[i]);
  vars["messages"] = std::move(msgs);
  vars["add_generation_prompt"] = gen;
  Result<std::string> r = c.tmpl->Render(vars);
  if (!r.ok()) return Status::InvalidArgument(r.status().message());
  return r;
}

Result<InstructionExample> Conversational(const Context& c, const ojson& messages,
                                          const std::string& where) {
  InstructionExample ex;
  Result<std::string> text = Render(c, messages, messages.size(), false);
  if (!text.ok()) return Status::InvalidArgument(where + ": " + text.status().message());
  ex.text = *text;
  std::vector<int64_t> starts;
  TRAIND_ASSIGN_OR_RETURN(ex.ids, c.tok->EncodeWithOffsets(ex.text, &starts));
  ex.labels.assign(ex.ids.size(), -100);
  if (!c.spec->assistant_only_loss) {
    for (size_t i = 0; i < ex.ids.size(); ++i) ex.labels[i] = ex.ids[i];
  } else {
    std::vector<std::pair<size_t, size_t>> spans;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i]["role"].get<std::string>() != "assistant") continue;
      Result<std::string> before = Render(c, messages, i, true);
      if (!before.ok()) return Status::InvalidArgument(where + ": " + before.status().message());
      Result<std::string> upto = Render(c, messages, i + 1, false);
      if (!upto.ok()) return Status::InvalidArgument(where + ": " + upto.status().message());
      if (upto->compare(0, before->size(), *before) != 0 ||
          ex.text.compare(0, upto->size(), *upto) != 0) {
        return Status::InvalidArgument(
            where + ": " + c.spec->messages_field + "[" + std::to_string(i) +
            "]: data.assistant_only_loss needs a chat template whose rendering of the messages "
            "before an assistant turn (with add_generation_prompt) is a prefix of the rendering "
            "with it, and that of the whole conversation; chat template '" + c.tmpl->name() +
            "' is not");
      }
      spans.emplace_back(before->size(), upto->size());
    }
    for (size_t t = 0; t < ex.ids.size(); ++t) {
      const size_t at = static_cast<size_t>(starts[t]);
      for (const auto& [b, e] : spans) {
        if (at >= b && at < e) {
          ex.labels[t] = ex.ids[t];
          break;
        }
      }
    }
  }
  if (!ex.labels.empty()) ex.labels[0] = -100;
  return ex;
}

Result<InstructionExample> PromptCompletion(const Context& c, const ojson& obj) {
  InstructionExample ex;
  const std::string prompt = obj[c.spec->prompt_field].get<std::string>();
  const std::string completion = obj[c.spec->completion_field].get<std::string>();
  ex.text = prompt + completion;
  TRAIND_ASSIGN_OR_RETURN(ex.ids, c.tok->Encode(ex.text, true));
  ex.ids.push_back(*c.tok->eos_id());
  size_t from = 0;  // the first token with loss
  if (c.spec->completion_only_loss) {
    TRAIND_ASSIGN_OR_RETURN(std::vector<int32_t> p, c.tok->Encode(prompt, true));
    from = std::min(p.size(), ex.ids.size() - 1);
  }
  ex.labels.assign(ex.ids.size(), -100);
  for (size_t i = std::max<size_t>(from, 1); i < ex.ids.size(); ++i) ex.labels[i] = ex.ids[i];
  return ex;
}

Result<Context> OpenContext(const DataSpec& spec, const std::string& init_from, JsonlKind kind) {
  Context c;
  c.spec = &spec;
  TRAIND_ASSIGN_OR_RETURN(c.tok, DefaultTokenizerFactory().Open(spec.tokenizer, init_from));
  if (kind == JsonlKind::kPromptCompletion && !c.tok->eos_id()) {
    return Status::InvalidArgument(
        "data.tokenizer: " + (spec.tokenizer.empty() ? init_from : spec.tokenizer) +
        " has no EOS token, which prompt-completion data ends each example with (use a "
        "tokenizer with one, or conversational data with a chat template)");
  }
  if (kind == JsonlKind::kConversational) {
    const std::string folder = TokenizerFolder(spec, init_from);
    TRAIND_ASSIGN_OR_RETURN(ojson config, TokenizerConfig(folder));
    c.special = ChatTemplateSpecialTokens(config);
    TRAIND_ASSIGN_OR_RETURN(ChatTemplate t, LoadTemplate(spec, folder, config));
    c.tmpl.emplace(std::move(t));
  }
  return c;
}

}  // namespace

const char* JsonlKindName(JsonlKind kind) {
  switch (kind) {
    case JsonlKind::kText: return "language-modelling (text)";
    case JsonlKind::kPromptCompletion: return "prompt-completion";
    case JsonlKind::kConversational: return "conversational";
  }
  return "?";
}

Result<JsonlKind> PeekJsonlKind(const DataSpec& spec) {
  std::ifstream in(spec.train_file, std::ios::binary);
  if (!in) return Status::NotFound("data.train_file: " + spec.train_file + ": cannot read the file");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result<Line> l = ParseLine(line, spec, "");
    return l.ok() ? l->kind : JsonlKind::kText;
  }
  return JsonlKind::kText;
}

Result<std::vector<InstructionExample>> ReadInstructionExamples(const DataSpec& spec,
                                                                const std::string& init_from,
                                                                int64_t limit, JsonlKind* kind_out) {
  TRAIND_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                          MappedFile::Open(spec.train_file, "data.train_file"));
  const std::string_view all = file->bytes();
  std::vector<InstructionExample> out;
  std::optional<JsonlKind> kind;
  size_t first_line = 0;
  std::optional<Context> ctx;
  size_t pos = 0, line_no = 0;
  while (pos < all.size() && (limit < 0 || static_cast<int64_t>(out.size()) < limit)) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view line = all.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = "data.train_file: " + spec.train_file + " line " + std::to_string(line_no);
    TRAIND_ASSIGN_OR_RETURN(Line l, ParseLine(line, spec, where));
    if (!kind) {
      kind = l.kind;
      first_line = line_no;
      if (kind_out != nullptr) *kind_out = *kind;
      if (*kind == JsonlKind::kText) return out;  // the token stream's (token_data.h)
      TRAIND_ASSIGN_OR_RETURN(Context c, OpenContext(spec, init_from, *kind));
      ctx.emplace(std::move(c));
    } else if (l.kind != *kind) {
      return Status::InvalidArgument(where + ": a " + JsonlKindName(l.kind) + " line in a " +
                                     JsonlKindName(*kind) + " file (as line " +
                                     std::to_string(first_line) + "): the whole file must be one kind");
    }
    if (*kind == JsonlKind::kConversational) {
      TRAIND_ASSIGN_OR_RETURN(InstructionExample ex,
                              Conversational(*ctx, l.obj[spec.messages_field], where));
      out.push_back(std::move(ex));
    } else {
      TRAIND_ASSIGN_OR_RETURN(InstructionExample ex, PromptCompletion(*ctx, l.obj));
      out.push_back(std::move(ex));
    }
  }
  if (!kind && kind_out != nullptr) *kind_out = JsonlKind::kText;
  return out;
}

Result<std::string> RenderChatPrompt(const std::vector<std::string>& folders,
                                     const std::string& user_text) {
  std::string searched;
  for (const std::string& folder : folders) {
    if (folder.empty()) continue;
    TRAIND_ASSIGN_OR_RETURN(ojson config, TokenizerConfig(folder));
    const bool in_config = config.contains("chat_template") && !config["chat_template"].is_null();
    if (!in_config && !IsFile(folder + "/chat_template.jinja")) {
      searched += (searched.empty() ? "" : ", ") + folder + "/tokenizer_config.json (\"chat_template\"), " +
                  folder + "/chat_template.jinja";
      continue;
    }
    Result<ChatTemplate> t = LoadTemplate(DataSpec{}, folder, config);
    if (!t.ok()) return Status::InvalidArgument("--chat: " + t.status().message());
    ojson vars = ChatTemplateSpecialTokens(config);
    vars["messages"] = ojson::array({ojson{{"role", "user"}, {"content", user_text}}});
    vars["add_generation_prompt"] = true;
    Result<std::string> text = t->Render(vars);
    if (!text.ok()) return Status::InvalidArgument("--chat: " + text.status().message());
    return text;
  }
  return Status::InvalidArgument("--chat: the model has no chat template (looked in " +
                                 (searched.empty() ? std::string("no folder") : searched) +
                                 "): use --prompt");
}

Result<ExampleData> LoadInstructionData(const DataSpec& spec, const std::string& init_from,
                                        const TokenizeProgress& progress) {
  JsonlKind kind = JsonlKind::kText;
  TRAIND_ASSIGN_OR_RETURN(std::vector<InstructionExample> examples,
                          ReadInstructionExamples(spec, init_from, -1, &kind));
  if (kind == JsonlKind::kText) {
    return Status::InvalidArgument("data.train_file: " + spec.train_file +
                                   ": language-modelling lines are read as a token stream");
  }
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                          DefaultTokenizerFactory().Open(spec.tokenizer, init_from));
  ExampleData out;
  out.pad_id = tok->pad_id() ? *tok->pad_id() : tok->eos_id() ? *tok->eos_id() : 0;
  int64_t max_id = out.pad_id;
  const int64_t n = static_cast<int64_t>(examples.size());
  const int64_t n_train = TrainTokenCount(n, spec.validation_split);
  if (n_train < 1) {
    return Status::InvalidArgument("data.train_file: " + spec.train_file + ": " +
                                   std::to_string(n) + " examples leave no training example "
                                   "(data.validation_split " +
                                   std::to_string(spec.validation_split) + ")");
  }
  int64_t tokens = 0;
  auto make = [&](int64_t begin, int64_t end) {
    std::vector<int32_t> ids, labels, lengths;
    for (int64_t i = begin; i < end; ++i) {
      const InstructionExample& e = examples[static_cast<size_t>(i)];
      ids.insert(ids.end(), e.ids.begin(), e.ids.end());
      labels.insert(labels.end(), e.labels.begin(), e.labels.end());
      lengths.push_back(static_cast<int32_t>(e.ids.size()));
      for (int32_t id : e.ids) max_id = std::max<int64_t>(max_id, id);
      tokens += static_cast<int64_t>(e.ids.size());
    }
    if (spec.packing) {
      return ExampleSet::OfPackedRows(std::move(ids), std::move(labels), std::move(lengths),
                                      spec.seq_len, out.pad_id);
    }
    return ExampleSet::OfLabelledRows(std::move(ids), std::move(labels), std::move(lengths),
                                      spec.seq_len, out.pad_id);
  };
  out.train = make(0, n_train);
  out.validation = make(n_train, n);
  out.vocab_size_needed = max_id + 1;
  if (progress.report) {
    TokenizeReport r;
    r.file = spec.train_file;
    r.tokenizer = tok->fingerprint();
    struct stat st;
    if (::stat(spec.train_file.c_str(), &st) == 0) r.bytes_total = r.bytes_done = st.st_size;
    r.tokens = tokens;
    r.done = true;
    progress.report(r);
  }
  return out;
}

Result<std::vector<SpecExample>> SpecTrainingExamples(const JobSpec& spec, int64_t n) {
  const DataSpec& d = spec.data;
  const std::string init_from = spec.model.init_from.value_or("");
  if (spec.model.config.encoder()) {
    return Status::InvalidArgument("model.arch: " + std::string(ArchName(spec.model.config.arch)) +
                                   ": tokenize --spec shows the causal families' examples");
  }
  const size_t keep = static_cast<size_t>(d.seq_len) + 1;
  std::vector<SpecExample> out;
  if (n <= 0) return out;
  if (d.format == "jsonl") {
    // Only training examples: the last validation_split of the lines is held out.
    TRAIND_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                            MappedFile::Open(d.train_file, "data.train_file"));
    int64_t lines = 0;
    const std::string_view all = file->bytes();
    for (size_t pos = 0; pos < all.size();) {
      size_t nl = all.find('\n', pos);
      if (nl == std::string_view::npos) nl = all.size();
      if (all.substr(pos, nl - pos).find_first_not_of(" \t\r") != std::string_view::npos) ++lines;
      pos = nl + 1;
    }
    const int64_t limit = std::min(n, std::max<int64_t>(TrainTokenCount(lines, d.validation_split), 1));
    JsonlKind kind = JsonlKind::kText;
    TRAIND_ASSIGN_OR_RETURN(std::vector<InstructionExample> ex,
                            ReadInstructionExamples(d, init_from, limit, &kind));
    if (kind != JsonlKind::kText) {
      for (InstructionExample& e : ex) {
        SpecExample s;
        s.text = std::move(e.text);
        s.input_ids = std::move(e.ids);
        s.labels = std::move(e.labels);
        if (s.input_ids.size() > keep) {
          s.input_ids.resize(keep);
          s.labels.resize(keep);
        }
        out.push_back(std::move(s));
      }
      return out;
    }
  }
  // Stream data: the windows in file order.
  TRAIND_ASSIGN_OR_RETURN(TokenData data, LoadTokenData(d));
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                          DefaultTokenizerFactory().Open(d.tokenizer, init_from));
  const int64_t T = d.seq_len;
  const int64_t windows = data.train.size() > 0 ? (data.train.size() - 1) / T : 0;
  for (int64_t w = 0; w < std::min(n, windows); ++w) {
    SpecExample s;
    s.input_ids.resize(keep);
    data.train.CopyWindow(w * T, T + 1, s.input_ids.data());
    s.labels = s.input_ids;
    s.labels[0] = -100;
    Result<std::string> text = tok->Decode(s.input_ids, false);
    if (text.ok()) s.text = *text;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace traind::engine
