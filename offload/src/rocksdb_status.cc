// The one RocksDB → traind status mapping of offload/.
#include "rocksdb_status.h"

namespace traind::offload {

Status FromRocksDb(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  const std::string m = what + ": " + s.ToString();
  if (s.IsNoSpace() || s.IsMemoryLimit())
    return Status::ResourceExhausted(m + " (free space on that file system, then reopen the store)");
  if (s.IsCorruption()) return Status::DataLoss(m);
  if (s.IsNotFound()) return Status::NotFound(m);
  if (s.IsIOError()) {
    // RocksDB reports errno text; a read-only or forbidden directory is not worth retrying.
    if (m.find("Read-only file system") != std::string::npos ||
        m.find("Permission denied") != std::string::npos)
      return Status::FailedPrecondition(m + " (the directory must be writable)");
    if (m.find("No space left") != std::string::npos)
      return Status::ResourceExhausted(m + " (free space on that file system, then reopen the store)");
    return Status::Unavailable(m);
  }
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return Status::Unavailable(m);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(m);
  return Status::Internal(m);
}

}  // namespace traind::offload
