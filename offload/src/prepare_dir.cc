// PrepareDir (prepare_dir.h): shared by the RocksDB store and the value-log store.
#include "prepare_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace traind::offload {

namespace fs = std::filesystem;

Status PrepareDir(const std::string& dir, bool create_if_missing) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT)
      return Status::FailedPrecondition("offload dir " + dir + ": " + std::strerror(errno));
    const fs::path parent = fs::path(dir).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::is_directory(parent, ec))
      return Status::NotFound("offload dir " + dir + ": its parent " + parent.string() +
                              " does not exist (create it, or point offload_dir elsewhere)");
    if (!create_if_missing) return Status::NotFound("offload dir " + dir + " does not exist");
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      const int e = errno;
      if (e == ENOSPC) return Status::ResourceExhausted("offload dir " + dir + ": cannot create it: " + std::strerror(e));
      return Status::FailedPrecondition("offload dir " + dir + ": cannot create it: " + std::strerror(e));
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("offload dir " + dir + " is not a directory");
  }
  // A probe file: the only check that sees read-only mounts and permissions the same way as
  // RocksDB will (root ignores mode bits, not read-only file systems).
  const std::string probe = dir + "/.offload_write_probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOSPC) return Status::ResourceExhausted("offload dir " + dir + " is full: " + std::strerror(e));
    if (e == ENOTDIR) return Status::FailedPrecondition("offload dir " + dir + " is not a directory");
    return Status::FailedPrecondition("offload dir " + dir + " is not writable: " + std::strerror(e) +
                                      (e == EROFS ? " (read-only file system)" : ""));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

Status CheckStoreLayout(const std::string& dir, const std::string& want) {
  std::error_code ec;
  const bool rocksdb = std::filesystem::exists(dir + "/CURRENT", ec);
  const bool valuelog = std::filesystem::exists(dir + "/index/CURRENT", ec);
  const bool other = want == "valuelog" ? rocksdb : valuelog;
  if (!other) return Status::Ok();
  const std::string found = want == "valuelog" ? "the RocksDB store's" : "the value-log store's";
  return Status::FailedPrecondition(
      "offload dir " + dir + " holds " + found + " layout, not the " + want +
      " store this job opens (an earlier traind, or TRAIND_OFFLOAD_STORE, chose the other): "
      "remove the directory (its state is rebuilt from the job's last checkpoint) or point "
      "offload_dir elsewhere");
}

}  // namespace traind::offload
