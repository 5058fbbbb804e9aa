// WordPiece (BERT): added-token split -> BertNormalizer (clean text, CJK spacing, accent
// stripping, lowercase) -> BertPreTokenizer (whitespace, isolated punctuation) -> greedy
// longest-match-first subwords with the "##" continuation prefix -> post-processor.
#include <unordered_map>

#include "data/tokenizers/internal.h"
#include "data/tokenizers/unicode.h"

namespace traind::engine::tokenizers {
namespace {

struct BertNormalizerOptions {
  bool enabled = false;
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;  // null in the file: follows lowercase
  bool lowercase = true;
};

bool IsChineseChar(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool IsBertPunct(uint32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                       (c >= 123 && c <= 126);
  return unicode::ClassOf(c) == unicode::kPunct;
}

class WordPieceTokenizer final : public Tokenizer {
 public:
  WordPieceTokenizer(BertNormalizerOptions norm, std::unordered_map<std::string, int32_t> vocab,
                     std::string unk, std::string prefix, int64_t max_chars, bool decode_cleanup,
                     std::vector<AddedToken> added, PostProcessor post, std::string fingerprint)
      : norm_(norm),
        vocab_(std::move(vocab)),
        prefix_(std::move(prefix)),
        max_chars_(max_chars),
        cleanup_(decode_cleanup),
        post_(std::move(post)),
        fingerprint_(std::move(fingerprint)) {
    int32_t max_id = -1;
    for (const auto& [tok, id] : vocab_) max_id = std::max(max_id, id);
    for (const AddedToken& a : added) max_id = std::max(max_id, a.id);
    vocab_size_ = static_cast<int64_t>(max_id) + 1;
    id_to_token_.assign(static_cast<size_t>(vocab_size_), std::string());
    for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;
    for (const AddedToken& a : added) id_to_token_[static_cast<size_t>(a.id)] = a.content;
    unk_id_ = vocab_.at(unk);
    added_ = AddedVocab(std::move(added));
    auto find = [&](const char* name) -> std::optional<int32_t> {
      auto it = vocab_.find(name);
      if (it != vocab_.end()) return it->second;
      if (const AddedToken* t = added_.ByContent(name)) return t->id;
      return std::nullopt;
    };
    eos_ = find("[SEP]");
    bos_ = find("[CLS]");
    pad_ = find("[PAD]");
  }

  std::string kind() const override { return "wordpiece"; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> pad_id() const override { return pad_; }
  std::string fingerprint() const override { return fingerprint_; }

  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      bool add_special_tokens) const override {
    std::vector<int32_t> out;
    if (add_special_tokens) out.insert(out.end(), post_.prefix.begin(), post_.prefix.end());
    std::vector<AddedVocab::Piece> pieces;
    added_.Split(text, &pieces);
    for (const AddedVocab::Piece& piece : pieces) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        continue;
      }
      const std::u32string norm = Normalize(piece.text);
      // BertPreTokenizer: split on whitespace (dropped) and punctuation (kept, alone).
      size_t i = 0;
      while (i < norm.size()) {
        const auto c = static_cast<uint32_t>(norm[i]);
        if (unicode::IsWhitespace(c)) {
          ++i;
          continue;
        }
        size_t j = i + 1;
        if (!IsBertPunct(c)) {
          while (j < norm.size() && !unicode::IsWhitespace(static_cast<uint32_t>(norm[j])) &&
                 !IsBertPunct(static_cast<uint32_t>(norm[j]))) {
            ++j;
          }
        }
        EncodeWord(norm.substr(i, j - i), &out);
        i = j;
      }
    }
    if (add_special_tokens) out.insert(out.end(), post_.suffix.begin(), post_.suffix.end());
    return out;
  }

  Result<std::vector<int32_t>> EncodeLarge(std::string_view text, int threads,
                                           std::atomic<int64_t>* bytes_done) const override {
    if (added_.any_contains_newline()) return Tokenizer::EncodeLarge(text, 1, bytes_done);
    return EncodeSplitAtLines(
        text, threads, [this](std::string_view part) { return Encode(part, false); }, bytes_done);
  }
  Status EncodeLargeTo(std::string_view text, int threads, std::atomic<int64_t>* bytes_done,
                       const std::function<Status(const std::vector<int32_t>&)>& emit) const override {
    if (added_.any_contains_newline()) return Tokenizer::EncodeLargeTo(text, 1, bytes_done, emit);
    return EncodeSplitAtLinesTo(
        text, threads, [this](std::string_view part) { return Encode(part, false); }, bytes_done,
        emit);
  }

  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override {
    TRAIND_RETURN_IF_ERROR(CheckIds(ids, vocab_size_));
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      const AddedToken* a = added_.ById(id);
      if (skip_special_tokens && a != nullptr && a->special) continue;
      const std::string& tok = id_to_token_[static_cast<size_t>(id)];
      std::string piece;
      if (!first && !prefix_.empty() && tok.rfind(prefix_, 0) == 0) {
        piece = tok.substr(prefix_.size());
      } else {
        piece = first ? tok : " " + tok;
      }
      first = false;
      out += cleanup_ ? Cleanup(piece) : piece;
    }
    return out;
  }

 private:
  static std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
    size_t p = 0;
    while ((p = s.find(from, p)) != std::string::npos) {
      s.replace(p, from.size(), to);
      p += to.size();
    }
    return s;
  }
  // HF's WordPiece decoder cleanup, applied per token.
  static std::string Cleanup(std::string s) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."},       {" ?", "?"},        {" !", "!"},   {" ,", ","},
        {" ' ", "'"},      {" n't", "n't"},    {" 'm", "'m"}, {" do not", " don't"},
        {" 's", "'s"},     {" 've", "'ve"},    {" 're", "'re"}};
    for (const auto& [from, to] : kRules) s = ReplaceAll(std::move(s), from, to);
    return s;
  }

  std::u32string Normalize(std::string_view text) const {
    std::u32string cps;
    cps.reserve(text.size());
    size_t p = 0;
    while (p < text.size()) cps.push_back(unicode::DecodeUtf8(text, &p));
    if (!norm_.enabled) return cps;
    std::u32string out;
    out.reserve(cps.size());
    for (char32_t ch : cps) {
      const auto c = static_cast<uint32_t>(ch);
      if (norm_.clean_text) {
        if (c == 0 || c == 0xFFFD) continue;
        const bool tab_nl = c == '\t' || c == '\n' || c == '\r';
        if (!tab_nl && unicode::ClassOf(c) == unicode::kControl) continue;
        if (tab_nl || unicode::IsWhitespace(c)) {
          out.push_back(U' ');
          continue;
        }
      }
      if (norm_.handle_chinese_chars && IsChineseChar(c)) {
        out.push_back(U' ');
        out.push_back(ch);
        out.push_back(U' ');
        continue;
      }
      out.push_back(ch);
    }
    if (norm_.strip_accents) {
      std::u32string d = unicode::Nfd(out);
      out.clear();
      for (char32_t ch : d) {
        if (unicode::ClassOf(static_cast<uint32_t>(ch)) != unicode::kMarkNonspacing) out.push_back(ch);
      }
    }
    if (norm_.lowercase) {
      std::string utf8;
      for (char32_t ch : out) unicode::AppendLowercase(static_cast<uint32_t>(ch), &utf8);
      out.clear();
      size_t q = 0;
      while (q < utf8.size()) out.push_back(unicode::DecodeUtf8(utf8, &q));
    }
    return out;
  }

  void EncodeWord(const std::u32string& word, std::vector<int32_t>* out) const {
    if (static_cast<int64_t>(word.size()) > max_chars_) {
      out->push_back(unk_id_);
      return;
    }
    std::string utf8;
    std::vector<size_t> offs{0};
    for (char32_t ch : word) {
      unicode::AppendUtf8(static_cast<uint32_t>(ch), &utf8);
      offs.push_back(utf8.size());
    }
    const size_t before = out->size();
    size_t start = 0;
    std::string candidate;
    while (start < word.size()) {
      size_t end = word.size();
      int32_t found = -1;
      for (; end > start; --end) {
        candidate.clear();
        if (start > 0) candidate = prefix_;
        candidate.append(utf8, offs[start], offs[end] - offs[start]);
        auto it = vocab_.find(candidate);
        if (it != vocab_.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) {
        out->resize(before);
        out->push_back(unk_id_);
        return;
      }
      out->push_back(found);
      start = end;
    }
  }

  BertNormalizerOptions norm_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::string prefix_;
  int64_t max_chars_;
  bool cleanup_;
  PostProcessor post_;
  std::string fingerprint_;
  int64_t vocab_size_ = 0;
  std::vector<std::string> id_to_token_;
  int32_t unk_id_ = 0;
  AddedVocab added_;
  std::optional<int32_t> eos_, bos_, pad_;
};

std::string TypeName(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                         : std::string("?");
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeWordPieceFromJson(const nlohmann::json& root,
                                                         const std::string& path,
                                                         const std::string& fingerprint) {
  const nlohmann::json& model = root["model"];
  BertNormalizerOptions norm;
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const nlohmann::json& n = root["normalizer"];
    if (TypeName(n) != "BertNormalizer") {
      return Status::Unimplemented("data.tokenizer: normalizer type " + TypeName(n) + " in " +
                                   path + " is not supported with a WordPiece model "
                                   "(BertNormalizer or none)");
    }
    norm.enabled = true;
    norm.clean_text = n.value("clean_text", true);
    norm.handle_chinese_chars = n.value("handle_chinese_chars", true);
    norm.lowercase = n.value("lowercase", true);
    norm.strip_accents = n.contains("strip_accents") && n["strip_accents"].is_boolean()
                             ? n["strip_accents"].get<bool>()
                             : norm.lowercase;
  }
  const nlohmann::json pt = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : nlohmann::json();
  if (TypeName(pt) != "BertPreTokenizer") {
    return Status::Unimplemented("data.tokenizer: pre_tokenizer type " +
                                 (pt.is_null() ? std::string("null") : TypeName(pt)) + " in " +
                                 path + " is not supported with a WordPiece model "
                                 "(BertPreTokenizer)");
  }
  bool cleanup = true;
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    if (TypeName(root["decoder"]) != "WordPiece") {
      return Status::Unimplemented("data.tokenizer: decoder type " + TypeName(root["decoder"]) +
                                   " in " + path + " is not supported with a WordPiece model");
    }
    cleanup = root["decoder"].value("cleanup", true);
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Malformed(path, "model.vocab: expected an object of token: id");
  }
  std::unordered_map<std::string, int32_t> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    int32_t id = 0;
    if (!ParseTokenId(it.value(), &id)) {
      return Malformed(path, "model.vocab['" + it.key() + "']: expected an integer id in [0, " +
                                 std::to_string(kMaxTokenId) + ")");
    }
    vocab.emplace(it.key(), id);
  }
  const std::string unk = model.value("unk_token", std::string("[UNK]"));
  if (!vocab.count(unk)) {
    return Malformed(path, "model.unk_token '" + unk + "' is not in model.vocab");
  }
  const std::string prefix = model.value("continuing_subword_prefix", std::string("##"));
  const int64_t max_chars = model.value("max_input_chars_per_word", int64_t{100});
  TRAIND_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(root, path));
  TRAIND_ASSIGN_OR_RETURN(
      PostProcessor post,
      ParsePostProcessor(root.contains("post_processor") ? root["post_processor"] : nlohmann::json(),
                         path, vocab));
  return std::unique_ptr<Tokenizer>(std::make_unique<WordPieceTokenizer>(
      norm, std::move(vocab), unk, prefix, max_chars, cleanup, std::move(added), std::move(post),
      fingerprint));
}

}  // namespace traind::engine::tokenizers
