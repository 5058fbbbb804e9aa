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

#include "data/tokenizers/internal.h"

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
  std::string dir;
  if (const char* d = std::getenv("TRAIND_TOKEN_CACHE_DIR"); d && *d) dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::string(x) + "/traind/tokens";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::string(h) + "/.cache/traind/tokens";
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
  const uint32_t width = max_id < 65536 ? 2 : 4;
  std::string buf;
  buf.append(kMagic, 8);
  Put<uint32_t>(&buf, width);
  Put<uint32_t>(&buf, static_cast<uint32_t>(key.fingerprint.size()));
  Put<uint64_t>(&buf, key.source_size);
  Put<int64_t>(&buf, key.source_mtime_ns);
  Put<uint64_t>(&buf, ids.size());
  buf += key.fingerprint;
  buf.append(Pad8(key.fingerprint.size()) - key.fingerprint.size(), '\0');
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::FailedPrecondition("token cache: cannot create " + tmp + ": " +
                                      std::strerror(errno));
  }
  // Writes `buf` out and empties it; false (errno set) on a failed write.
  auto flush = [&]() -> bool {
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = ENOSPC;
        return false;
      }
      done += static_cast<size_t>(w);
    }
    buf.clear();
    return true;
  };
  constexpr size_t kChunk = size_t{1} << 20;
  buf.reserve(std::max(buf.size(), kChunk) + 8);
  bool ok = true;
  for (size_t i = 0; ok && i < ids.size(); ++i) {
    if (width == 2) Put<uint16_t>(&buf, static_cast<uint16_t>(ids[i]));
    else Put<uint32_t>(&buf, static_cast<uint32_t>(ids[i]));
    if (buf.size() >= kChunk) ok = flush();
  }
  if (ok) ok = flush();
  if (!ok) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Status::ResourceExhausted("token cache: cannot write " + tmp + ": " +
                                     std::strerror(err));
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::FailedPrecondition("token cache: cannot write " + path + ": " +
                                      std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace traind::engine
