// Token cache files (format: token_cache.h): header checks, mapped reads, streamed atomic writes.
#include "data/token_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <limits>

#include "data/tokenizers/internal.h"
#include "core/environment.h"

namespace traind::engine {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'D', 'T', 'O', 'K', 'C', '1'};
constexpr size_t kFixedHeader = 40;

size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));  // x86-64/aarch64: little-endian
}
template <typename T>
T Get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

Result<TokenCacheKey> TokenCacheKeyFor(const std::string& source, const std::string& fingerprint) {
  struct stat st;
  if (::stat(source.c_str(), &st) != 0) {
    return Status::NotFound("data.train_file: " + source + ": no such file");
  }
  TokenCacheKey key;
  key.fingerprint = fingerprint;
  key.source_size = static_cast<uint64_t>(st.st_size);
  key.source_mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return key;
}

std::string TokenCachePath(const std::string& source, const std::string& fingerprint) {
  // TRAIND_TOKEN_CACHE_DIR, else XDG_CACHE_HOME's, else HOME's (core/environment.h).
  const std::string dir = ReadEngineEnvironment().token_cache_dir;
  if (dir.empty()) return "";
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(source, ec).lexically_normal().string();
  const std::string name = std::filesystem::path(source).filename().string();
  return dir + "/" + name + "-" + tokenizers::Hex16(tokenizers::Fnv1a(abs)) + "-" +
         tokenizers::Hex16(tokenizers::Fnv1a(fingerprint)) + ".tokens";
}

std::optional<TokenStream> ReadTokenCache(const std::string& path, const TokenCacheKey& key) {
  if (path.empty()) return std::nullopt;
  Result<std::shared_ptr<const MappedFile>> file = MappedFile::Open(path, "token cache");
  if (!file.ok() || (*file)->size() < kFixedHeader) return std::nullopt;
  const size_t size = static_cast<size_t>((*file)->size());
  const unsigned char* p = (*file)->data();
  const uint32_t width = Get<uint32_t>(p + 8);
  const uint32_t fp_len = Get<uint32_t>(p + 12);
  const uint64_t count = Get<uint64_t>(p + 32);
  const size_t data_off = kFixedHeader + Pad8(fp_len);
  const bool header_ok =
      std::memcmp(p, kMagic, 8) == 0 && (width == 2 || width == 4) &&
      fp_len == key.fingerprint.size() && data_off <= size &&
      std::memcmp(p + kFixedHeader, key.fingerprint.data(), fp_len) == 0 &&
      Get<uint64_t>(p + 16) == key.source_size && Get<int64_t>(p + 24) == key.source_mtime_ns &&
      count <= (size - data_off) / width && data_off + count * width == size;
  if (!header_ok) return std::nullopt;
  Result<TokenStream> ids = TokenStream::OfFile(std::move(*file), data_off,
                                                static_cast<int64_t>(count),
                                                static_cast<int>(width));
  if (!ids.ok()) return std::nullopt;
  return std::move(*ids);
}

Status WriteTokenCache(const std::string& path, const TokenCacheKey& key,
                       const std::vector<int32_t>& ids) {
  if (path.empty()) return Status::FailedPrecondition("token cache: no cache folder");
  int32_t max_id = 0;
  for (int32_t id : ids) {
    if (id < 0) return Status::InvalidArgument("token cache: negative id " + std::to_string(id));
    max_id = std::max(max_id, id);
  }
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<TokenCacheWriter> w,
                          TokenCacheWriter::Create(path, key, max_id < 65536 ? 2 : 4));
  TRAIND_RETURN_IF_ERROR(w->Append(ids.data(), ids.size()));
  return w->Commit();
}

Result<std::unique_ptr<TokenCacheWriter>> TokenCacheWriter::Create(const std::string& path,
                                                                   const TokenCacheKey& key,
                                                                   int width) {
  if (path.empty()) return Status::FailedPrecondition("token cache: no cache folder");
  if (width != 2 && width != 4) {
    return Status::InvalidArgument("token cache: width " + std::to_string(width) + " is not 2 or 4");
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::unique_ptr<TokenCacheWriter> w(new TokenCacheWriter());
  w->path_ = path;
  w->tmp_ = path + ".tmp." + std::to_string(::getpid());
  w->width_ = width;
  w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) {
    return Status::FailedPrecondition("token cache: cannot create " + w->tmp_ + ": " +
                                      std::strerror(errno));
  }
  // The header, its count 0 until Commit; a reader never sees the temporary name anyway.
  w->buf_.reserve((size_t{1} << 20) + 8);
  w->buf_.append(kMagic, 8);
  Put<uint32_t>(&w->buf_, static_cast<uint32_t>(width));
  Put<uint32_t>(&w->buf_, static_cast<uint32_t>(key.fingerprint.size()));
  Put<uint64_t>(&w->buf_, key.source_size);
  Put<int64_t>(&w->buf_, key.source_mtime_ns);
  Put<uint64_t>(&w->buf_, 0);
  w->buf_ += key.fingerprint;
  w->buf_.append(Pad8(key.fingerprint.size()) - key.fingerprint.size(), '\0');
  return w;
}

TokenCacheWriter::~TokenCacheWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status TokenCacheWriter::Flush() {
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t w = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      failed_ = true;
      return Status::ResourceExhausted("token cache: cannot write " + tmp_ + ": " +
                                       std::strerror(w == 0 ? ENOSPC : errno));
    }
    done += static_cast<size_t>(w);
  }
  buf_.clear();
  return Status::Ok();
}

Status TokenCacheWriter::Append(const int32_t* ids, size_t n) {
  if (failed_ || fd_ < 0) return Status::FailedPrecondition("token cache: writer already failed");
  const int64_t limit = width_ == 2 ? 65535 : std::numeric_limits<int32_t>::max();
  constexpr size_t kChunk = size_t{1} << 20;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id > limit) {
      failed_ = true;
      return Status::InvalidArgument("token cache: id " + std::to_string(id) + " does not fit " +
                                     std::to_string(width_) + " bytes");
    }
    if (width_ == 2) Put<uint16_t>(&buf_, static_cast<uint16_t>(id));
    else Put<uint32_t>(&buf_, static_cast<uint32_t>(id));
    if (buf_.size() >= kChunk) TRAIND_RETURN_IF_ERROR(Flush());
  }
  count_ += static_cast<int64_t>(n);
  return Status::Ok();
}

Status TokenCacheWriter::Commit() {
  if (failed_ || fd_ < 0) return Status::FailedPrecondition("token cache: writer already failed");
  TRAIND_RETURN_IF_ERROR(Flush());
  const uint64_t count = static_cast<uint64_t>(count_);
  if (::pwrite(fd_, &count, sizeof(count), 32) != static_cast<ssize_t>(sizeof(count))) {
    failed_ = true;
    return Status::ResourceExhausted("token cache: cannot write " + tmp_ + ": " +
                                     std::strerror(errno));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return Status::FailedPrecondition("token cache: cannot write " + path_ + ": " +
                                      std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace traind::engine
