// RocksDB → traind and traind → gRPC status mappings.
#include "status_map.h"

namespace traind::server {

Status FromRocksDb(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  const std::string m = what + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(m);
  if (s.IsNoSpace() || s.IsMemoryLimit()) return Status::ResourceExhausted(m + " (free disk space in the state dir)");
  if (s.IsCorruption()) return Status::DataLoss(m);
  if (s.IsIOError() || s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return Status::Unavailable(m);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(m);
  return Status::Internal(m);
}

grpc::Status ToGrpc(const Status& s) {
  grpc::StatusCode c = grpc::StatusCode::UNKNOWN;
  switch (s.code()) {
    case Status::Code::kOk: return grpc::Status::OK;
    case Status::Code::kInvalidArgument: c = grpc::StatusCode::INVALID_ARGUMENT; break;
    case Status::Code::kNotFound: c = grpc::StatusCode::NOT_FOUND; break;
    case Status::Code::kFailedPrecondition: c = grpc::StatusCode::FAILED_PRECONDITION; break;
    case Status::Code::kResourceExhausted: c = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case Status::Code::kDataLoss: c = grpc::StatusCode::DATA_LOSS; break;
    case Status::Code::kCancelled: c = grpc::StatusCode::CANCELLED; break;
    case Status::Code::kUnimplemented: c = grpc::StatusCode::UNIMPLEMENTED; break;
    case Status::Code::kUnauthenticated: c = grpc::StatusCode::UNAUTHENTICATED; break;
    case Status::Code::kPermissionDenied: c = grpc::StatusCode::PERMISSION_DENIED; break;
    case Status::Code::kUnavailable: c = grpc::StatusCode::UNAVAILABLE; break;
    case Status::Code::kInternal: c = grpc::StatusCode::INTERNAL; break;
    case Status::Code::kAborted: c = grpc::StatusCode::ABORTED; break;
  }
  return grpc::Status(c, s.message());
}

}  // namespace traind::server
