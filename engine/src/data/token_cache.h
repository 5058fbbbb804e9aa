// The token cache: a data file's token ids, stored once per (file, tokenizer) so a job that
// restarts, resumes or reruns does not tokenize again. On-disk format (little-endian):
//   0  char[8]  "TRDTOKC1"
//   8  uint32   dtype bytes: 2 (uint16 ids, vocab <= 65536) or 4 (uint32)
//  12  uint32   fingerprint length F
//  16  uint64   source file size in bytes
//  24  int64    source file mtime, nanoseconds since the epoch
//  32  uint64   token count N
//  40  char[F]  the tokenizer's fingerprint(), then zero padding to a multiple of 8
//   .. ids      N * dtype bytes
// A cache is used only when every header field matches the data file and tokenizer; its ids are
// then memory-mapped, not copied (token_stream.h), so training holds only the file's pages. A
// cache is replaced by rename, never rewritten in place, so a mapping of the old one stays valid.
// Inspect one with `od -A d -t x1 -N 64 FILE`.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/token_stream.h"
#include "traind/engine/status.h"

namespace traind::engine {

struct TokenCacheKey {
  std::string fingerprint;  // Tokenizer::fingerprint()
  uint64_t source_size = 0;
  int64_t source_mtime_ns = 0;
};

// The key of `source` for this tokenizer fingerprint (NOT_FOUND if the file is missing).
Result<TokenCacheKey> TokenCacheKeyFor(const std::string& source, const std::string& fingerprint);

// Where the cache of `source` lives: $TRAIND_TOKEN_CACHE_DIR, else $XDG_CACHE_HOME/traind/tokens,
// else $HOME/.cache/traind/tokens; "" when none of them is set. The name hashes the source's
// absolute path and the fingerprint.
std::string TokenCachePath(const std::string& source, const std::string& fingerprint);

// The cached ids, mapped (a TokenStream of width 2 or 4 over the file's id area), or nullopt when
// the file is absent, for another key, truncated or malformed (then the caller tokenizes again
// and rewrites it).
std::optional<TokenStream> ReadTokenCache(const std::string& path, const TokenCacheKey& key);

// Writes the cache atomically (a temporary file renamed over `path`), creating its folder; the
// ids are streamed out through a small buffer (no second copy of them in memory).
// Ids must be >= 0; uint16 storage when all are < 65536.
Status WriteTokenCache(const std::string& path, const TokenCacheKey& key,
                       const std::vector<int32_t>& ids);

// A cache written as its ids arrive (a tokenizer's parts, in order), for a width chosen up front:
// Append, then Commit (fills in the count, renames the temporary file over `path`). Destroyed
// without a Commit, or after a failed Append, it removes the temporary file.
class TokenCacheWriter {
 public:
  // `width` 2 (ids < 65536) or 4. FAILED_PRECONDITION when the folder or file cannot be made.
  static Result<std::unique_ptr<TokenCacheWriter>> Create(const std::string& path,
                                                          const TokenCacheKey& key, int width);
  ~TokenCacheWriter();
  TokenCacheWriter(const TokenCacheWriter&) = delete;
  TokenCacheWriter& operator=(const TokenCacheWriter&) = delete;

  // INVALID_ARGUMENT for an id < 0 or too large for the width; RESOURCE_EXHAUSTED for a failed
  // write. After an error the writer accepts nothing more.
  Status Append(const int32_t* ids, size_t n);
  Status Commit();
  int64_t count() const { return count_; }

 private:
  TokenCacheWriter() = default;
  Status Flush();
  std::string path_, tmp_;
  int fd_ = -1;
  int width_ = 2;
  int64_t count_ = 0;
  bool failed_ = false;
  std::string buf_;
};

}  // namespace traind::engine
