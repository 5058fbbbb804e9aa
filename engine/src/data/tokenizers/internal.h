// Internal pieces shared by the tokenizer implementations: constructors per kind, added-token
// splitting, post-processor templates, file reading and the fingerprint hash.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "traind/engine/tokenizer.h"

namespace traind::engine::tokenizers {

// 64-bit FNV-1a, chained: Fnv1a(b, Fnv1a(a)) hashes a then b.
uint64_t Fnv1a(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);
std::string Hex16(uint64_t v);

// The whole file, or NOT_FOUND / FAILED_PRECONDITION naming `what` (e.g. "data.tokenizer") and path.
Result<std::string> ReadFileBytes(const std::string& path, const std::string& what);

bool IsDir(const std::string& path);
bool Exists(const std::string& path);

// "data.tokenizer: <path>: <msg>"
Status Malformed(const std::string& path, const std::string& msg);

// Token ids in tokenizer files must lie in [0, kMaxTokenId): the id tables are sized by the
// largest id, so one token claiming id 2000000000 would otherwise ask for tens of GB (published
// vocabularies hold at most ~256K tokens).
inline constexpr int64_t kMaxTokenId = int64_t{1} << 22;
// The id a JSON value holds: an integer in [0, kMaxTokenId); false for anything else.
bool ParseTokenId(const nlohmann::json& v, int32_t* out);

// An HF added token ("added_tokens" in tokenizer.json).
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// Splits text on added tokens (leftmost-longest match, as HF's added vocabulary): pieces of plain
// text (id < 0) and added tokens (id >= 0). Matching is on the raw text.
class AddedVocab {
 public:
  AddedVocab() = default;
  explicit AddedVocab(std::vector<AddedToken> tokens);
  struct Piece {
    std::string_view text;
    int32_t id;  // -1: plain text to pre-tokenize and run through the model
  };
  void Split(std::string_view text, std::vector<Piece>* out) const;
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with this id, or nullptr.
  const AddedToken* ById(int32_t id) const;
  const AddedToken* ByContent(std::string_view content) const;
  // True when some added token contains '\n' (then line starts are not safe split points).
  bool any_contains_newline() const { return any_newline_; }

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::vector<size_t>> by_first_byte_;  // 256 lists of token indices, longest first
  std::unordered_map<int32_t, size_t> by_id_;
  bool any_newline_ = false;
};

// The single-sequence post-processor: ids before and after the sequence (TemplateProcessing,
// BertProcessing, RobertaProcessing; ByteLevel adds nothing).
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;
};
// Parses tokenizer.json's "post_processor" (null allowed). `vocab` resolves token names.
Result<PostProcessor> ParsePostProcessor(const nlohmann::json& pp, const std::string& path,
                                         const std::unordered_map<std::string, int32_t>& vocab);

// Parses "added_tokens"; each id must be < vocab_limit when vocab_limit > 0.
Result<std::vector<AddedToken>> ParseAddedTokens(const nlohmann::json& root,
                                                 const std::string& path);

// Encodes `text` in parallel on `threads` threads, split after single newlines ("X\nY", X and Y
// ASCII non-whitespace), with `encode` called per part. Only for tokenizers whose
// pre-tokens never cross such a point. Parts are at most ~1 MiB (at least 8 per thread), and
// each adds its size to `bytes_done` (when given) as soon as it is encoded.
Result<std::vector<int32_t>> EncodeSplitAtLines(
    std::string_view text, int threads,
    const std::function<Result<std::vector<int32_t>>(std::string_view)>& encode,
    std::atomic<int64_t>* bytes_done = nullptr);
// The same parts handed to `emit` in text order as soon as each and those before it are encoded
// (Tokenizer::EncodeLargeTo); a part's ids are freed once emitted, so at most a few parts wait.
Status EncodeSplitAtLinesTo(
    std::string_view text, int threads,
    const std::function<Result<std::vector<int32_t>>(std::string_view)>& encode,
    std::atomic<int64_t>* bytes_done,
    const std::function<Status(const std::vector<int32_t>&)>& emit);

std::unique_ptr<Tokenizer> MakeByteTokenizer();
Result<std::unique_ptr<Tokenizer>> MakeBpeFromJson(const nlohmann::json& root,
                                                   const std::string& path,
                                                   const std::string& fingerprint);
Result<std::unique_ptr<Tokenizer>> MakeBpeFromVocabMerges(const std::string& vocab_path,
                                                          const std::string& merges_path);
Result<std::unique_ptr<Tokenizer>> MakeWordPieceFromJson(const nlohmann::json& root,
                                                         const std::string& path,
                                                         const std::string& fingerprint);
Result<std::unique_ptr<Tokenizer>> MakeSentencePiece(const std::string& path);

// Checks ids against [0, vocab) and names the first bad one.
Status CheckIds(const std::vector<int32_t>& ids, int64_t vocab);

}  // namespace traind::engine::tokenizers
