// Tokenizers: text <-> token ids for training data, `trainctl tokenize` and generation.
// Kinds: "byte" (each UTF-8 byte is its id, vocab 256), "bpe" (Hugging Face tokenizer.json with a
// byte-level BPE model, or GPT-2's vocab.json + merges.txt), "wordpiece" (tokenizer.json with a
// BERT WordPiece model) and "sentencepiece" (a SentencePiece .model). How `data.tokenizer` names
// one: docs/jobspec.md. Implementations: engine/src/data/tokenizers/.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "traind/engine/status.h"

namespace traind::engine {

// A loaded tokenizer. Immutable after construction: Encode and Decode may be called from many
// threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte" | "bpe" | "wordpiece" | "sentencepiece"
  virtual std::string kind() const = 0;
  // Ids are in [0, vocab_size), added and special tokens included.
  virtual int64_t vocab_size() const = 0;
  // The ids of `text` (UTF-8; invalid sequences are encoded as their bytes by byte-level
  // tokenizers and as U+FFFD by the others). add_special_tokens: apply the tokenizer's
  // post-processor (BERT: [CLS] ... [SEP]; SentencePiece: <s> first when the model has one;
  // GPT-2 adds nothing). Special tokens written in the text are matched, never split.
  virtual Result<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens = false) const = 0;
  // Encode(text, false) with, for each id, the byte offset in `text` of the token's first
  // character (`starts`, one per id, nondecreasing): what assistant_only_loss needs to map
  // character spans to tokens, as HF's return_offsets_mapping. byte and bpe give the exact
  // offsets (their tokens are the text's own bytes; an added token starts where its match does);
  // the default (wordpiece, sentencepiece: their normalizers change the text) aligns each token's
  // decoded text with the input from left to right, and a token whose text is not found there
  // starts where the one before it ended.
  virtual Result<std::vector<int32_t>> EncodeWithOffsets(std::string_view text,
                                                         std::vector<int64_t>* starts) const;
  // The text of `ids`. INVALID_ARGUMENT naming the position for an id outside [0, vocab_size).
  // skip_special_tokens: special tokens (eos, [CLS], ...) are left out of the text.
  virtual Result<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special_tokens = false) const = 0;
  // The end-of-text / begin / padding ids where the tokenizer has them.
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int32_t> pad_id() const { return std::nullopt; }
  // A stable hash of everything that affects the ids ("<kind>:<16 hex digits>"): equal
  // fingerprints give equal ids, so token caches can be keyed by it.
  virtual std::string fingerprint() const = 0;

  // Encode(text, false) of a large text with up to `threads` threads; the same ids as Encode.
  // The default runs Encode; tokenizers whose pre-tokens never cross a line start split the text
  // there and encode the parts in parallel. `bytes_done` (optional): increased by each part's
  // size as soon as it is encoded, so another thread can show progress; text.size() in the end.
  virtual Result<std::vector<int32_t>> EncodeLarge(std::string_view text, int threads,
                                                   std::atomic<int64_t>* bytes_done = nullptr) const {
    (void)threads;
    Result<std::vector<int32_t>> ids = Encode(text, false);
    if (bytes_done != nullptr) bytes_done->fetch_add(static_cast<int64_t>(text.size()));
    return ids;
  }
  // EncodeLarge's ids handed out in text order a part at a time, so a caller can write them out
  // without holding them all (the token cache): `emit` gets each part's ids as soon as that part
  // and every one before it are encoded; calls never overlap but may come from any of the
  // threads. An error from `emit` stops the encoding and is returned. The default emits
  // EncodeLarge's whole result once.
  virtual Status EncodeLargeTo(std::string_view text, int threads, std::atomic<int64_t>* bytes_done,
                               const std::function<Status(const std::vector<int32_t>&)>& emit) const {
    Result<std::vector<int32_t>> ids = EncodeLarge(text, threads, bytes_done);
    if (!ids.ok()) return ids.status();
    return emit(*ids);
  }
};

class TokenizerFactory {
 public:
  virtual ~TokenizerFactory() = default;
  // `tokenizer`: data.tokenizer as written in a job spec: "byte", a file (HF tokenizer.json or a
  // SentencePiece .model) or a folder holding tokenizer.json, tokenizer.model, or vocab.json +
  // merges.txt, looked for in that order. `init_from`: model.init_from or ""; when `tokenizer` is
  // empty, the init_from folder's tokenizer files are used (and "byte" without init_from).
  // NOT_FOUND for missing files, INVALID_ARGUMENT for malformed ones (naming the file and where),
  // UNIMPLEMENTED for a model/normalizer/pre-tokenizer type we do not implement. Messages start
  // with "data.tokenizer: ".
  virtual Result<std::unique_ptr<Tokenizer>> Open(const std::string& tokenizer,
                                                  const std::string& init_from) const = 0;
};

// Progress of tokenizing data.train_file into the token cache (data.format jsonl, or text with a
// tokenizer other than byte: byte ids of a text file are its bytes, never cached), reported by the
// data loader (data/token_data.h) and through RunJob's RunCallbacks::on_tokenize. While the data
// loads: a cache hit sends one report (cache_hit and done set, bytes_done 0); a miss sends a first
// report (bytes_done 0), one about every progress interval (1 s) while the worker threads encode,
// and a last one with done set (bytes_done == bytes_total, tokens the ids produced).
struct TokenizeReport {
  std::string file;         // data.train_file as in the spec
  std::string tokenizer;    // the tokenizer's fingerprint ("bpe:0123...")
  int64_t bytes_done = 0;   // source bytes encoded so far (cache misses only)
  int64_t bytes_total = 0;  // the source file's size
  int64_t tokens = 0;       // ids produced (set when done)
  double seconds = 0;       // since tokenization started
  bool cache_hit = false;   // the ids came from the token cache: nothing was tokenized
  bool done = false;
};

// The factory for every kind above.
const TokenizerFactory& DefaultTokenizerFactory();

// Whether `folder` holds tokenizer files the factory would open (tokenizer.json, tokenizer.model,
// or vocab.json + merges.txt). The job spec uses it for init_from's default tokenizer.
bool HasTokenizerFiles(const std::string& folder);

}  // namespace traind::engine
