// DefaultTokenizerFactory: resolves data.tokenizer (byte, a file, a folder, or the init_from
// folder) to a tokenizer, in JOBSPEC.md's order: tokenizer.json, tokenizer.model, vocab.json +
// merges.txt.
#include <sys/stat.h>

#include "data/tokenizers/internal.h"

namespace traind::engine::tokenizers {

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

namespace {
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<std::unique_ptr<Tokenizer>> OpenTokenizerJson(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::string text, ReadFileBytes(path, "data.tokenizer"));
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    // e.what() names the line and column ("... at line 3, column 7: syntax error ...").
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    return Malformed(path, "not valid JSON: " + what);
  }
  if (!root.is_object()) return Malformed(path, "expected a JSON object at the top level");
  if (!root.contains("model") || !root["model"].is_object()) {
    return Malformed(path, "no \"model\" object (is this a Hugging Face tokenizer.json?)");
  }
  const nlohmann::json& model = root["model"];
  std::string type;
  if (model.contains("type") && model["type"].is_string()) {
    type = model["type"].get<std::string>();
  } else if (model.contains("merges")) {
    type = "BPE";  // older files omit the type
  } else {
    return Malformed(path, "model.type: missing");
  }
  const std::string fp_kind = type == "BPE" ? "bpe" : type == "WordPiece" ? "wordpiece" : type;
  const std::string fp = fp_kind + ":" + Hex16(Fnv1a(text, Fnv1a("tokenizer.json")));
  // The readers check the shapes they rely on, but some optional fields are read with
  // json::value(key, default), which throws when the key holds another type (fuzz/: an uncaught
  // type_error terminated the process).
  try {
    if (type == "BPE") return MakeBpeFromJson(root, path, fp);
    if (type == "WordPiece") return MakeWordPieceFromJson(root, path, fp);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    return Malformed(path, "a field has the wrong type: " + what);
  }
  return Status::Unimplemented("data.tokenizer: model type " + type + " in " + path +
                               " is not supported (BPE, WordPiece; SentencePiece models as "
                               "tokenizer.model)");
}

Result<std::unique_ptr<Tokenizer>> OpenFolder(const std::string& dir, const std::string& what) {
  const std::string json = dir + "/tokenizer.json";
  const std::string model = dir + "/tokenizer.model";
  const std::string vocab = dir + "/vocab.json";
  const std::string merges = dir + "/merges.txt";
  if (Exists(json)) return OpenTokenizerJson(json);
  if (Exists(model)) return MakeSentencePiece(model);
  if (Exists(vocab) && Exists(merges)) return MakeBpeFromVocabMerges(vocab, merges);
  if (Exists(vocab)) {
    return Status::NotFound("data.tokenizer: " + dir + " has vocab.json but no merges.txt");
  }
  return Status::NotFound("data.tokenizer: " + what + " " + dir +
                          " has no tokenizer files (tokenizer.json, tokenizer.model, or "
                          "vocab.json + merges.txt)");
}

class DefaultFactory final : public TokenizerFactory {
 public:
  Result<std::unique_ptr<Tokenizer>> Open(const std::string& tokenizer,
                                          const std::string& init_from) const override {
    if (tokenizer == "byte" || (tokenizer.empty() && init_from.empty())) return MakeByteTokenizer();
    if (tokenizer.empty()) {
      if (!IsDir(init_from)) {
        return Status::NotFound("data.tokenizer: model.init_from " + init_from +
                                " is not a folder, so it has no tokenizer files");
      }
      return OpenFolder(init_from, "the model.init_from folder");
    }
    if (IsDir(tokenizer)) return OpenFolder(tokenizer, "folder");
    if (!Exists(tokenizer)) {
      return Status::NotFound("data.tokenizer: " + tokenizer +
                              ": no such file or folder (expected byte, a tokenizer.json or "
                              ".model file, or a folder holding one)");
    }
    if (EndsWith(tokenizer, ".json")) return OpenTokenizerJson(tokenizer);
    if (EndsWith(tokenizer, ".model")) return MakeSentencePiece(tokenizer);
    // Any other name: JSON if it looks like JSON, else a SentencePiece model.
    TRAIND_ASSIGN_OR_RETURN(std::string head, ReadFileBytes(tokenizer, "data.tokenizer"));
    const size_t p = head.find_first_not_of(" \t\r\n");
    if (p != std::string::npos && head[p] == '{') return OpenTokenizerJson(tokenizer);
    return MakeSentencePiece(tokenizer);
  }
};

}  // namespace
}  // namespace traind::engine::tokenizers

namespace traind::engine {

bool HasTokenizerFiles(const std::string& folder) {
  return tokenizers::IsDir(folder) &&
         (tokenizers::Exists(folder + "/tokenizer.json") ||
          tokenizers::Exists(folder + "/tokenizer.model") ||
          (tokenizers::Exists(folder + "/vocab.json") && tokenizers::Exists(folder + "/merges.txt")));
}

const TokenizerFactory& DefaultTokenizerFactory() {
  static const tokenizers::DefaultFactory* f = new tokenizers::DefaultFactory();
  return *f;
}

}  // namespace traind::engine
