// Helpers for tests/offload: temporary directories, deterministic chunk contents, tmpfs mounts.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

#include "traind/engine/optimizer_state_store.h"

namespace traind::offload::testing {

// A fresh directory under $TMPDIR (or /tmp), removed (after unmounting anything on it) at scope end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/offload_test_XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }
  // Mounts a tmpfs of `bytes` on this directory. False (errno kept) if mounting is not allowed.
  bool MountTmpfs(size_t bytes) {
    const std::string opts = "size=" + std::to_string(bytes) + ",mode=0755";
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    return mounted_;
  }
  bool RemountReadOnly() {
    return ::mount(nullptr, path_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

inline uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes a test writes for `key` at `step`: different for every (key, step), reproducible.
inline std::vector<char> ChunkData(const engine::StateKey& key, int64_t step, size_t bytes) {
  uint64_t s = std::hash<std::string>{}(key.ToString()) * 31 + static_cast<uint64_t>(step) * 1000003;
  std::vector<char> out(bytes);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t v = SplitMix(s);
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < bytes; ++i) out[i] = static_cast<char>(SplitMix(s));
  return out;
}

}  // namespace traind::offload::testing
