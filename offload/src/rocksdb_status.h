// RocksDB's statuses to ours, in one place for offload/ (STYLE.md "Errors").
#pragma once

#include <rocksdb/status.h>

#include <string>

#include "traind/engine/status.h"

namespace traind::offload {

// OK stays OK. NoSpace / memory limit → RESOURCE_EXHAUSTED; Corruption → DATA_LOSS; NotFound →
// NOT_FOUND; "Read-only file system" / "Permission denied" IOErrors → FAILED_PRECONDITION; other
// IOError, Busy, TimedOut, TryAgain → UNAVAILABLE; InvalidArgument → INVALID_ARGUMENT; the rest
// INTERNAL. `what` names the operation and the directory ("committing step 7 in /nvme/offload").
Status FromRocksDb(const rocksdb::Status& s, const std::string& what);

}  // namespace traind::offload
