// Whole-buffer writes to a pipe or file descriptor, shared by the supervisor (job requests to a
// runner's stdin) and the job runner (events to traind).
#pragma once

#include <errno.h>
#include <unistd.h>

#include <cstddef>
#include <string>

namespace traind::worker {

// Writes all of `buf` to `fd`, retrying short writes and EINTR. False when the descriptor fails or
// is closed (EPIPE with SIGPIPE ignored), after writing only part of it.
inline bool WriteAll(int fd, const std::string& buf) {
  size_t off = 0;
  while (off < buf.size()) {
    const ssize_t n = ::write(fd, buf.data() + off, buf.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace traind::worker
