// The two status mappings of the daemon, each in one place: RocksDB's statuses to ours, and ours
// to gRPC's (STYLE.md "Errors").
#pragma once

#include <grpcpp/support/status.h>
#include <rocksdb/status.h>

#include "traind/engine/status.h"

namespace traind::server {

// OK stays OK; NotFound → NOT_FOUND, NoSpace / memory limit → RESOURCE_EXHAUSTED, Corruption →
// DATA_LOSS, IOError / Busy / TimedOut → UNAVAILABLE, InvalidArgument → INVALID_ARGUMENT, the rest
// INTERNAL. `what` names the operation ("writing job job-000003").
Status FromRocksDb(const rocksdb::Status& s, const std::string& what);

// Our codes to gRPC codes (message kept).
grpc::Status ToGrpc(const Status& s);

}  // namespace traind::server
