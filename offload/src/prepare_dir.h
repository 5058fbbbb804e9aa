// The directory checks both persistent stores run before opening anything in `dir`.
#pragma once

#include <string>

#include "traind/engine/status.h"

namespace traind::offload {

// Missing (NOT_FOUND, or created when create_if_missing and its parent exists), not a directory
// or not writable / read-only file system (FAILED_PRECONDITION, via a probe file: root ignores
// mode bits but not read-only mounts), full (RESOURCE_EXHAUSTED). Messages name `dir`.
Status PrepareDir(const std::string& dir, bool create_if_missing);

// The two persistent stores keep different layouts in their directory: the RocksDB store a
// database in `dir` itself, the value-log store its index database in `dir`/index and segment
// files beside it. FAILED_PRECONDITION naming `dir` when `dir` holds the other store's layout
// (`want`: "rocksdb" or "valuelog"), so neither opens, and silently ignores, the other's files.
Status CheckStoreLayout(const std::string& dir, const std::string& want);

}  // namespace traind::offload
