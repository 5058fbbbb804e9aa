// Byte-level BPE (GPT-2, LLaMA-3): text -> added-token split -> pre-tokenizer pieces -> bytes ->
// merges in rank order (lowest rank first, leftmost first among equals, as HF's BPE) -> ids.
// Vocabulary strings are converted from GPT-2's byte-to-character alphabet back to raw bytes once
// at load, so encoding and decoding work on bytes.
#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>

#include "data/tokenizers/internal.h"
#include "data/tokenizers/pretokenize.h"
#include "data/tokenizers/unicode.h"
#include "traind/engine/mutex.h"

namespace traind::engine::tokenizers {
namespace {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 upwards.
struct ByteAlphabet {
  std::array<uint32_t, 256> to_char{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteAlphabet() {
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_char[b] = printable ? b : 256 + n++;
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
  // The raw bytes of a byte-level token string; false if a character is outside the alphabet.
  bool ToBytes(std::string_view token, std::string* out) const {
    out->clear();
    size_t p = 0;
    while (p < token.size()) {
      auto it = to_byte.find(unicode::DecodeUtf8(token, &p));
      if (it == to_byte.end()) return false;
      out->push_back(static_cast<char>(it->second));
    }
    return true;
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* a = new ByteAlphabet();
  return *a;
}

enum class PreTok { kGpt2, kLlama3, kNone };

struct BpeConfig {
  PreTok pretok = PreTok::kGpt2;
  bool add_prefix_space = false;
  bool ignore_merges = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeConfig cfg, std::string fingerprint) : cfg_(cfg), fingerprint_(std::move(fingerprint)) {}

  // Loads the vocabulary (token string in the byte alphabet -> id) and merges (pairs of token
  // strings). `where` names the files for errors.
  Status Init(const std::vector<std::pair<std::string, int32_t>>& vocab,
              const std::vector<std::pair<std::string, std::string>>& merges,
              std::vector<AddedToken> added, PostProcessor post, const std::string& vocab_where,
              const std::string& merges_where) {
    const ByteAlphabet& alpha = Alphabet();
    int32_t max_id = -1;
    for (const auto& [tok, id] : vocab) {
      if (id < 0) return Malformed(vocab_where, "token '" + tok + "' has a negative id");
      max_id = std::max(max_id, id);
    }
    for (const AddedToken& a : added) max_id = std::max(max_id, a.id);
    vocab_size_ = static_cast<int64_t>(max_id) + 1;
    id_bytes_.assign(static_cast<size_t>(vocab_size_), std::string());
    std::unordered_map<std::string, int32_t> by_string;  // byte-alphabet string -> id
    by_string.reserve(vocab.size());
    std::string bytes;
    for (const auto& [tok, id] : vocab) {
      by_string.emplace(tok, id);
      if (alpha.ToBytes(tok, &bytes)) {
        id_bytes_[static_cast<size_t>(id)] = bytes;
        by_bytes_.emplace(bytes, id);
      } else {
        id_bytes_[static_cast<size_t>(id)] = tok;  // as HF's ByteLevel decoder: kept as is
      }
    }
    for (int b = 0; b < 256; ++b) {
      auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
      if (it == by_bytes_.end()) {
        std::string ch;
        unicode::AppendUtf8(alpha.to_char[static_cast<size_t>(b)], &ch);
        return Malformed(vocab_where, "the byte-level vocabulary has no token for byte " +
                                          std::to_string(b) + " ('" + ch + "')");
      }
      byte_id_[static_cast<size_t>(b)] = it->second;
    }
    merges_.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto& [a, b] = merges[r];
      auto ia = by_string.find(a), ib = by_string.find(b), iab = by_string.find(a + b);
      if (ia == by_string.end() || ib == by_string.end() || iab == by_string.end()) {
        const std::string missing = ia == by_string.end() ? a : ib == by_string.end() ? b : a + b;
        return Malformed(merges_where, "merge " + std::to_string(r) + " ('" + a + " " + b +
                                           "') needs token '" + missing +
                                           "', which is not in the vocabulary");
      }
      merges_.emplace(Key(ia->second, ib->second),
                      MergeInfo{static_cast<int32_t>(r), iab->second});
    }
    for (AddedToken& a : added) {
      // Added tokens decode through the byte-level decoder too (HF), so map their text.
      std::string raw;
      added_bytes_[a.id] = alpha.ToBytes(a.content, &raw) ? raw : a.content;
    }
    added_ = AddedVocab(std::move(added));
    post_ = std::move(post);
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
      if (const AddedToken* t = added_.ByContent(name)) {
        eos_ = t->id;
        break;
      }
    }
    for (const char* name : {"<|begin_of_text|>", "<s>"}) {
      if (const AddedToken* t = added_.ByContent(name)) {
        bos_ = t->id;
        break;
      }
    }
    return Status::Ok();
  }

  std::string kind() const override { return "bpe"; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::string fingerprint() const override { return fingerprint_; }

  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special_tokens) out.insert(out.end(), post_.prefix.begin(), post_.prefix.end());
    std::vector<AddedVocab::Piece> pieces;
    added_.Split(text, &pieces);
    std::vector<Span> spans;
    std::string prefixed;
    for (const AddedVocab::Piece& piece : pieces) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
        continue;
      }
      std::string_view s = piece.text;
      if (cfg_.add_prefix_space && !s.empty() && s[0] != ' ') {
        prefixed = " ";
        prefixed.append(s);
        s = prefixed;
      }
      spans.clear();
      switch (cfg_.pretok) {
        case PreTok::kGpt2: SplitGpt2(s, &spans); break;
        case PreTok::kLlama3: SplitLlama3(s, &spans); break;
        case PreTok::kNone: spans.emplace_back(0, static_cast<uint32_t>(s.size())); break;
      }
      for (const Span& sp : spans) EncodeWord(s.substr(sp.first, sp.second - sp.first), &out);
    }
    if (add_special_tokens) out.insert(out.end(), post_.suffix.begin(), post_.suffix.end());
    return out;
  }

  // Each token's bytes are the text's own (no normalizer): a piece's tokens start at the piece's
  // offset plus the bytes of the tokens before them (less an added prefix space).
  Result<std::vector<int32_t>> EncodeWithOffsets(std::string_view text,
                                                 std::vector<int64_t>* starts) const override {
    std::vector<int32_t> out;
    starts->clear();
    std::vector<AddedVocab::Piece> pieces;
    added_.Split(text, &pieces);
    std::vector<Span> spans;
    std::string prefixed;
    for (const AddedVocab::Piece& piece : pieces) {
      const int64_t base = static_cast<int64_t>(piece.text.data() - text.data());
      if (piece.id >= 0) {
        out.push_back(piece.id);
        starts->push_back(base);
        continue;
      }
      std::string_view s = piece.text;
      int64_t shift = 0;
      if (cfg_.add_prefix_space && !s.empty() && s[0] != ' ') {
        prefixed = " ";
        prefixed.append(s);
        s = prefixed;
        shift = 1;
      }
      spans.clear();
      switch (cfg_.pretok) {
        case PreTok::kGpt2: SplitGpt2(s, &spans); break;
        case PreTok::kLlama3: SplitLlama3(s, &spans); break;
        case PreTok::kNone: spans.emplace_back(0, static_cast<uint32_t>(s.size())); break;
      }
      for (const Span& sp : spans) {
        const size_t first = out.size();
        EncodeWord(s.substr(sp.first, sp.second - sp.first), &out);
        int64_t at = static_cast<int64_t>(sp.first);
        for (size_t k = first; k < out.size(); ++k) {
          starts->push_back(base + std::max<int64_t>(0, at - shift));
          at += static_cast<int64_t>(id_bytes_[static_cast<size_t>(out[k])].size());
        }
      }
    }
    return out;
  }

  Result<std::vector<int32_t>> EncodeLarge(std::string_view text, int threads,
                                           std::atomic<int64_t>* bytes_done) const override {
    if (cfg_.add_prefix_space || added_.any_contains_newline() || cfg_.pretok == PreTok::kNone) {
      return Tokenizer::EncodeLarge(text, 1, bytes_done);
    }
    return EncodeSplitAtLines(
        text, threads, [this](std::string_view part) { return Encode(part, false); }, bytes_done);
  }
  Status EncodeLargeTo(std::string_view text, int threads, std::atomic<int64_t>* bytes_done,
                       const std::function<Status(const std::vector<int32_t>&)>& emit) const override {
    if (cfg_.add_prefix_space || added_.any_contains_newline() || cfg_.pretok == PreTok::kNone) {
      return Tokenizer::EncodeLargeTo(text, 1, bytes_done, emit);
    }
    return EncodeSplitAtLinesTo(
        text, threads, [this](std::string_view part) { return Encode(part, false); }, bytes_done,
        emit);
  }

  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override {
    TRAIND_RETURN_IF_ERROR(CheckIds(ids, vocab_size_));
    std::string bytes;
    for (int32_t id : ids) {
      if (const AddedToken* a = added_.ById(id)) {
        if (!(skip_special_tokens && a->special)) bytes += added_bytes_.at(id);
        continue;
      }
      bytes += id_bytes_[static_cast<size_t>(id)];
    }
    return unicode::Utf8Lossy(bytes);
  }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t id;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const MergeInfo* FindMerge(int32_t a, int32_t b) const {
    auto it = merges_.find(Key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
    if (word.empty()) return;
    if (word.size() == 1) {
      out->push_back(byte_id_[static_cast<unsigned char>(word[0])]);
      return;
    }
    if (cfg_.ignore_merges) {
      auto it = by_bytes_.find(std::string(word));
      if (it != by_bytes_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    const bool cacheable = word.size() <= kMaxCachedWord;
    Shard* shard = nullptr;
    if (cacheable) {
      shard = &cache_[std::hash<std::string_view>()(word) % kShards];
      MutexLock lock(&shard->mu);
      auto it = shard->map.find(std::string(word));
      if (it != shard->map.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    ids.reserve(word.size());
    for (unsigned char b : word) ids.push_back(byte_id_[b]);
    if (ids.size() <= 48) MergeSmall(&ids);
    else MergeLarge(&ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (cacheable) {
      MutexLock lock(&shard->mu);
      if (shard->map.size() >= kMaxCachePerShard) shard->map.clear();
      shard->map.emplace(std::string(word), std::move(ids));
    }
  }

  // Repeatedly merges the lowest-rank adjacent pair (leftmost among equal ranks).
  void MergeSmall(std::vector<int32_t>* ids) const {
    std::vector<int32_t>& v = *ids;
    for (;;) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
      size_t best = 0;
      for (size_t i = 0; i + 1 < v.size(); ++i) {
        const MergeInfo* m = FindMerge(v[i], v[i + 1]);
        if (m != nullptr && m->rank < best_rank) {
          best_rank = m->rank;
          best_id = m->id;
          best = i;
        }
      }
      if (best_id < 0) return;
      v[best] = best_id;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
  }

  // The same order with a heap over a linked list: O(n log n) for long words (digit runs).
  void MergeLarge(std::vector<int32_t>* ids) const {
    const size_t n = ids->size();
    std::vector<int32_t> id = *ids;
    std::vector<int64_t> prev(n), next(n);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
    }
    struct Cand {
      int32_t rank;
      int64_t pos;
      int32_t left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int64_t pos) {
      if (pos < 0 || next[static_cast<size_t>(pos)] < 0) return;
      const int32_t l = id[static_cast<size_t>(pos)];
      const int32_t r = id[static_cast<size_t>(next[static_cast<size_t>(pos)])];
      if (const MergeInfo* m = FindMerge(l, r)) heap.push({m->rank, pos, l, r});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const auto p = static_cast<size_t>(c.pos);
      if (id[p] != c.left || next[p] < 0 || id[static_cast<size_t>(next[p])] != c.right) continue;
      const auto q = static_cast<size_t>(next[p]);
      id[p] = FindMerge(c.left, c.right)->id;
      id[q] = -1;
      next[p] = next[q];
      if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = c.pos;
      push(prev[p]);
      push(c.pos);
    }
    ids->clear();
    for (int64_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) ids->push_back(id[static_cast<size_t>(i)]);
  }

  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxCachedWord = 64;
  static constexpr size_t kMaxCachePerShard = 1 << 14;
  struct Shard {
    Mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map TRAIND_GUARDED_BY(mu);
  };

  BpeConfig cfg_;
  std::string fingerprint_;
  int64_t vocab_size_ = 0;
  std::vector<std::string> id_bytes_;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> by_bytes_;  // raw bytes -> id
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, MergeInfo> merges_;
  AddedVocab added_;
  std::unordered_map<int32_t, std::string> added_bytes_;
  PostProcessor post_;
  std::optional<int32_t> eos_, bos_;
  mutable std::array<Shard, kShards> cache_;
};

// "a b" -> (a, b); the space separates the two tokens (tokens never contain a raw space).
bool SplitMerge(std::string_view line, std::pair<std::string, std::string>* out) {
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string_view::npos) {
    return false;
  }
  *out = {std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))};
  return true;
}

std::string TypeOf(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                         : std::string("?");
}

Status ParsePreTokenizer(const nlohmann::json& pt, const std::string& path, BpeConfig* cfg) {
  const std::string unsupported_tail =
      " (byte-level BPE needs a ByteLevel pre-tokenizer, alone or after a Split with GPT-2's or "
      "LLaMA-3's pattern; SentencePiece-style BPE: use the folder's tokenizer.model)";
  if (pt.is_null()) {
    return Status::Unimplemented("data.tokenizer: BPE without a pre-tokenizer in " + path +
                                 " is not supported" + unsupported_tail);
  }
  const std::string type = TypeOf(pt);
  if (type == "ByteLevel") {
    cfg->add_prefix_space = pt.value("add_prefix_space", false);
    cfg->pretok = pt.value("use_regex", true) ? PreTok::kGpt2 : PreTok::kNone;
    return Status::Ok();
  }
  if (type == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].is_array() &&
      pt["pretokenizers"].size() == 2 && TypeOf(pt["pretokenizers"][0]) == "Split" &&
      TypeOf(pt["pretokenizers"][1]) == "ByteLevel") {
    const nlohmann::json& split = pt["pretokenizers"][0];
    const nlohmann::json& bl = pt["pretokenizers"][1];
    if (bl.value("use_regex", true) || split.value("invert", false) ||
        split.value("behavior", std::string()) != "Isolated" || !split.contains("pattern") ||
        !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
        !split["pattern"]["Regex"].is_string()) {
      return Status::Unimplemented("data.tokenizer: this Split + ByteLevel pre-tokenizer in " +
                                   path + " is not supported (a Regex pattern, behavior "
                                   "Isolated, invert false, then ByteLevel with use_regex false)");
    }
    const std::string pattern = split["pattern"]["Regex"].get<std::string>();
    if (pattern == kGpt2Pattern) cfg->pretok = PreTok::kGpt2;
    else if (pattern == kLlama3Pattern) cfg->pretok = PreTok::kLlama3;
    else {
      return Status::Unimplemented("data.tokenizer: pre_tokenizer Split pattern " + pattern +
                                   " in " + path + " is not supported (GPT-2's and LLaMA-3's are)");
    }
    cfg->add_prefix_space = bl.value("add_prefix_space", false);
    return Status::Ok();
  }
  return Status::Unimplemented("data.tokenizer: pre_tokenizer type " + type + " in " + path +
                               " is not supported" + unsupported_tail);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeBpeFromJson(const nlohmann::json& root,
                                                   const std::string& path,
                                                   const std::string& fingerprint) {
  const nlohmann::json& model = root["model"];
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    return Status::Unimplemented("data.tokenizer: normalizer type " + TypeOf(root["normalizer"]) +
                                 " in " + path + " is not supported with a byte-level BPE model");
  }
  BpeConfig cfg;
  TRAIND_RETURN_IF_ERROR(
      ParsePreTokenizer(root.contains("pre_tokenizer") ? root["pre_tokenizer"] : nlohmann::json(),
                        path, &cfg));
  if (root.contains("decoder") && !root["decoder"].is_null() &&
      TypeOf(root["decoder"]) != "ByteLevel") {
    return Status::Unimplemented("data.tokenizer: decoder type " + TypeOf(root["decoder"]) +
                                 " in " + path + " is not supported with a byte-level BPE model "
                                 "(ByteLevel)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return Status::Unimplemented("data.tokenizer: BPE dropout in " + path +
                                 " is not supported (set it to null)");
  }
  if (model.value("byte_fallback", false)) {
    return Status::Unimplemented("data.tokenizer: BPE with byte_fallback in " + path +
                                 " is not supported (SentencePiece-style BPE: use tokenizer.model)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return Status::Unimplemented(std::string("data.tokenizer: BPE ") + key + " in " + path +
                                   " is not supported");
    }
  }
  cfg.ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Malformed(path, "model.vocab: expected an object of token: id");
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    int32_t id = 0;
    if (!ParseTokenId(it.value(), &id)) {
      return Malformed(path, "model.vocab['" + it.key() + "']: expected an integer id in [0, " +
                                 std::to_string(kMaxTokenId) + ")");
    }
    vocab.emplace_back(it.key(), id);
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return Malformed(path, "model.merges: expected a list");
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model["merges"].size());
  for (size_t i = 0; i < model["merges"].size(); ++i) {
    const nlohmann::json& m = model["merges"][i];
    std::pair<std::string, std::string> pair;
    if (m.is_string() && SplitMerge(m.get<std::string>(), &pair)) {
      merges.push_back(std::move(pair));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Malformed(path, "model.merges[" + std::to_string(i) +
                                 "]: expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  TRAIND_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(root, path));
  TRAIND_ASSIGN_OR_RETURN(
      PostProcessor post,
      ParsePostProcessor(root.contains("post_processor") ? root["post_processor"] : nlohmann::json(),
                         path, {}));
  auto tok = std::make_unique<BpeTokenizer>(cfg, fingerprint);
  TRAIND_RETURN_IF_ERROR(tok->Init(vocab, merges, std::move(added), std::move(post),
                                   path + " (model.vocab)", path + " (model.merges)"));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<std::unique_ptr<Tokenizer>> MakeBpeFromVocabMerges(const std::string& vocab_path,
                                                          const std::string& merges_path) {
  TRAIND_ASSIGN_OR_RETURN(std::string vocab_text, ReadFileBytes(vocab_path, "data.tokenizer"));
  TRAIND_ASSIGN_OR_RETURN(std::string merges_text, ReadFileBytes(merges_path, "data.tokenizer"));
  nlohmann::json vj;
  try {
    vj = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    return Malformed(vocab_path, std::string("not valid JSON: ") + e.what());
  }
  if (!vj.is_object()) return Malformed(vocab_path, "expected a JSON object of token: id");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vj.size());
  for (auto it = vj.begin(); it != vj.end(); ++it) {
    int32_t id = 0;
    if (!ParseTokenId(it.value(), &id)) {
      return Malformed(vocab_path, "'" + it.key() + "': expected an integer id in [0, " +
                                       std::to_string(kMaxTokenId) + ")");
    }
    vocab.emplace_back(it.key(), id);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0, pos = 0;
  while (pos < merges_text.size()) {
    size_t nl = merges_text.find('\n', pos);
    if (nl == std::string::npos) nl = merges_text.size();
    std::string_view line(merges_text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    std::pair<std::string, std::string> pair;
    if (!SplitMerge(line, &pair)) {
      return Malformed(merges_path, "line " + std::to_string(line_no) +
                                        ": expected two tokens separated by one space, got '" +
                                        std::string(line) + "'");
    }
    merges.push_back(std::move(pair));
  }
  std::vector<AddedToken> added;
  for (const auto& [tok, id] : vocab) {
    if (tok == "<|endoftext|>") added.push_back({tok, id, true, false, false, false});
  }
  const std::string fp = "bpe:" + Hex16(Fnv1a(merges_text, Fnv1a(vocab_text, Fnv1a("vocab+merges"))));
  auto tok = std::make_unique<BpeTokenizer>(BpeConfig{}, fp);
  TRAIND_RETURN_IF_ERROR(
      tok->Init(vocab, merges, std::move(added), PostProcessor{}, vocab_path, merges_path));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace traind::engine::tokenizers
