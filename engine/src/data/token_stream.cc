// Token streams (token_stream.h): read-only file mappings and int32-widening views over them.
#include "data/token_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace traind::engine {

Result<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path,
                                                           const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(what + ": " + path + ": no such file");
    return Status::FailedPrecondition(what + ": " + path + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FailedPrecondition(what + ": " + path + ": cannot stat: " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(what + ": " + path + ": is a directory, not a file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  if (st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::FailedPrecondition(what + ": " + path + ": cannot map: " + std::strerror(err));
    }
    f->data_ = static_cast<const unsigned char*>(map);
    f->size_ = static_cast<uint64_t>(st.st_size);
  }
  ::close(fd);  // the mapping keeps the file open
  return std::shared_ptr<const MappedFile>(std::move(f));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
}

TokenStream::TokenStream(std::vector<int32_t> ids) {
  auto v = std::make_shared<const std::vector<int32_t>>(std::move(ids));
  data_ = reinterpret_cast<const unsigned char*>(v->data());
  size_ = static_cast<int64_t>(v->size());
  width_ = 4;
  owner_ = std::move(v);
}

Result<TokenStream> TokenStream::OfFile(std::shared_ptr<const MappedFile> file, uint64_t offset,
                                        int64_t count, int width) {
  if (width != 1 && width != 2 && width != 4) {
    return Status::InvalidArgument("token stream: element width " + std::to_string(width) +
                                   " is not 1, 2 or 4");
  }
  const uint64_t size = file ? file->size() : 0;
  if (count < 0 || offset > size || static_cast<uint64_t>(count) > (size - offset) / width ||
      offset % static_cast<uint64_t>(width) != 0) {
    return Status::InvalidArgument("token stream: " + std::to_string(count) + " elements of " +
                                   std::to_string(width) + " bytes at offset " +
                                   std::to_string(offset) + " do not fit a file of " +
                                   std::to_string(size) + " bytes");
  }
  TokenStream s;
  s.data_ = count > 0 ? file->data() + offset : nullptr;
  s.size_ = count;
  s.width_ = width;
  s.mapped_ = true;
  s.owner_ = std::move(file);
  return s;
}

void TokenStream::CopyWindow(int64_t start, int64_t n, int32_t* out) const {
  if (n <= 0) return;
  const unsigned char* p = data_ + static_cast<size_t>(start) * static_cast<size_t>(width_);
  switch (width_) {
    case 1:
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, sizeof(v));  // little-endian hosts (x86-64, aarch64)
        out[i] = v;
      }
      break;
    default:
      std::memcpy(out, p, static_cast<size_t>(n) * sizeof(int32_t));
      break;
  }
}

TokenStream TokenStream::Slice(int64_t offset, int64_t length) const {
  TokenStream s = *this;
  offset = std::clamp<int64_t>(offset, 0, size_);
  length = std::clamp<int64_t>(length, 0, size_ - offset);
  s.data_ = length > 0 ? data_ + static_cast<size_t>(offset) * static_cast<size_t>(width_)
                       : nullptr;
  s.size_ = length;
  return s;
}

std::vector<int32_t> TokenStream::ToVector() const {
  std::vector<int32_t> v(static_cast<size_t>(size_));
  CopyWindow(0, size_, v.data());
  return v;
}

namespace {

// Max over [0, n) of the elements of `p` read as T, and the first index above `limit`.
template <typename T>
TokenStream::Scan ScanAs(const unsigned char* p, int64_t n, uint64_t limit) {
  TokenStream::Scan s;
  if (n <= 0) return s;
  constexpr int64_t kBlock = 1 << 16;
  uint64_t max = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    T m = 0;
    for (int64_t i = b; i < e; ++i) {  // vectorises: a plain max reduction per block
      T v;
      std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
      m = v > m ? v : m;
    }
    if (static_cast<uint64_t>(m) > limit && s.first_too_large < 0) {
      for (int64_t i = b; i < e; ++i) {
        T v;
        std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
        if (static_cast<uint64_t>(v) > limit) {
          s.first_too_large = i;
          break;
        }
      }
    }
    max = std::max<uint64_t>(max, m);
  }
  s.max_id = static_cast<int64_t>(max);
  return s;
}

}  // namespace

TokenStream::Scan TokenStream::ScanIds() const {
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  switch (width_) {
    case 1: return ScanAs<uint8_t>(data_, size_, limit);
    case 2: return ScanAs<uint16_t>(data_, size_, limit);
    default: return ScanAs<uint32_t>(data_, size_, limit);
  }
}

}  // namespace traind::engine
