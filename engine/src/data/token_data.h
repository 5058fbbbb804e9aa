// Token data for training: load a data file into train/validation token streams, and cut the
// training stream into micro-batches with the exact batching semantics of JOBSPEC.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/token_stream.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/status.h"
#include "traind/engine/tokenizer.h"  // TokenizeReport

namespace traind::engine {

// The whole token stream of a data file, split into train and validation parts: two views over
// one storage, normally a read-only mapping (token_stream.h), no copy.
struct TokenData {
  TokenStream train;             // first (1 - validation_split) of the stream
  TokenStream validation;        // last validation_split of the stream
  int64_t vocab_size_needed = 0;  // max token id + 1 (the model's vocab must be at least this)
};

// Reads data.train_file per data.format / token_dtype / tokenizer ("byte": each byte is a token;
// a tokenizer file or folder: its ids, through the token cache of token_cache.h). format jsonl:
// one JSON object per line, data.text_field its text, each document followed by the tokenizer's
// eos (a newline for tokenizers without one, such as byte).
// Memory: the streams are memory-mapped, never copied into RAM: a text file with the byte
// tokenizer is mapped itself (uint8 ids), a tokens file is mapped with its token_dtype, and other
// tokenizers' ids are mapped from the token cache. On a text's cache miss the tokenizer's parts
// are streamed into the cache in order (Tokenizer::EncodeLargeTo) and the cache is mapped; jsonl
// builds its ids in RAM once, caches and maps them; only when no cache can be written do the
// streams own a vector of the ids.
// NOT_FOUND for a missing file, INVALID_ARGUMENT (naming the field) for a file too short for one
// window of seq_len + 1 tokens or a tokens file whose size is not a multiple of the dtype size;
// the tokenizer's errors (data.tokenizer: ...) for a tokenizer that cannot be opened.
// `progress.report` (optional) receives TokenizeReports (tokenizer.h) on the calling thread while a
// text or jsonl file is tokenized with a tokenizer other than byte: one for a cache hit; for a
// miss a first one, one per `interval_seconds` (0: whenever the encoded byte count moved) while
// the worker threads encode, and a last one with done set.
struct TokenizeProgress {
  std::function<void(const TokenizeReport&)> report;
  double interval_seconds = 1.0;
};
Result<TokenData> LoadTokenData(const DataSpec& spec, const TokenizeProgress& progress = {});

// Where the loader is in the stream; saved in checkpoints so a resumed run sees the same batches.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t next_window = 0;  // index into this epoch's window order
};

// Produces micro-batches of (inputs, targets), each (B, T) int32, row-major.
// Window i = tokens[i*T : i*T + T + 1]; windows per epoch = (len - 1) / T. With shuffle, the window
// order of epoch e is a permutation drawn from (seed, e); without, windows in order. A micro-batch
// takes the next B windows in the order, wrapping into the next epoch.
// A background thread prepares the next `prefetch` batches while the caller trains.
class BatchLoader {
 public:
  // `tokens` is shared with the caller (a copy of the view; the storage stays alive while the
  // prefetch thread reads it).
  BatchLoader(TokenStream tokens, int64_t B, int64_t T, bool shuffle, uint64_t seed,
              LoaderPosition start = {}, int prefetch = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Blocks until the next batch is ready; copies it into inputs/targets (B*T each). Returns the
  // seconds spent waiting.
  double Next(int32_t* inputs, int32_t* targets);
  // The position of the next batch Next() will return (what a checkpoint saves).
  LoaderPosition position() const;
  int64_t windows_per_epoch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace traind::engine
