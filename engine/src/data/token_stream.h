// Read-only token streams: what training reads its windows from. A stream is a view (offset,
// length) over ids that either live in an owned std::vector<int32_t> (small in-memory streams,
// tests) or in a read-only memory-mapped file region whose elements are little-endian uint8 (the
// byte tokenizer maps the text file itself: its bytes are the ids), uint16 or uint32 (the token
// cache's id area, `format: tokens` files). Reading widens to int32.
//
// Streams are cheap to copy: every copy shares the storage (std::shared_ptr), so the train and
// validation views over one mapping keep it alive, as does a BatchLoader's prefetch thread. The
// mapped pages are file-backed (the page cache), so a 1 GB corpus costs no anonymous memory; the
// kernel pages them in as windows are read and may drop them under memory pressure.
// A mapped file must not be truncated in place while a stream maps it (reading a page past the
// new end raises SIGBUS); replacing it by rename, as the token cache does, is safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "traind/engine/status.h"

namespace traind::engine {

// A whole file mapped read-only (MAP_PRIVATE, PROT_READ); an empty file maps to no pages.
class MappedFile {
 public:
  // `what` prefixes errors, e.g. "data.train_file": NOT_FOUND for a missing file,
  // INVALID_ARGUMENT for a directory, FAILED_PRECONDITION when it cannot be opened or mapped.
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path,
                                                        const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(data_), static_cast<size_t>(size_)};
  }

 private:
  MappedFile() = default;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

class TokenStream {
 public:
  TokenStream() = default;  // empty
  // Owns `ids` (int32 elements).
  explicit TokenStream(std::vector<int32_t> ids);
  // `count` elements of `width` bytes (1, 2 or 4; unsigned, little-endian) at byte `offset` of
  // `file`; INVALID_ARGUMENT when they do not fit in the file or the width is not 1, 2 or 4.
  // The offset must be a multiple of the width.
  static Result<TokenStream> OfFile(std::shared_ptr<const MappedFile> file, uint64_t offset,
                                    int64_t count, int width);

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int width() const { return width_; }        // bytes per stored element
  bool mapped() const { return mapped_; }     // backed by a file mapping (not an owned vector)

  // Element i widened to int32 (uint32 ids above INT32_MAX wrap: LoadTokenData rejects them).
  int32_t operator[](int64_t i) const {
    const unsigned char* p = data_ + static_cast<size_t>(i) * static_cast<size_t>(width_);
    switch (width_) {
      case 1: return *p;
      case 2: return static_cast<int32_t>(p[0] | static_cast<uint32_t>(p[1]) << 8);
      default: {
        int32_t v;
        std::memcpy(&v, p, sizeof(v));
        return v;
      }
    }
  }
  // out[0 .. n) = elements [start, start + n), widened to int32. Requires start + n <= size().
  void CopyWindow(int64_t start, int64_t n, int32_t* out) const;
  // The view [offset, offset + length) of this stream (clamped to it), sharing its storage.
  TokenStream Slice(int64_t offset, int64_t length) const;
  // A copy of the elements as int32 (tests, small streams).
  std::vector<int32_t> ToVector() const;

  // One pass over the elements: the largest id (as unsigned; -1 for an empty stream), and the
  // index of the first element above INT32_MAX (-1 when none).
  struct Scan {
    int64_t max_id = -1;
    int64_t first_too_large = -1;
  };
  Scan ScanIds() const;

 private:
  std::shared_ptr<const void> owner_;  // keeps the bytes alive: a vector or a MappedFile
  const unsigned char* data_ = nullptr;
  int64_t size_ = 0;
  int width_ = 4;
  bool mapped_ = false;
};

}  // namespace traind::engine
