// Status names and formatting.
#include "traind/engine/status.h"

namespace traind {

const char* StatusCodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "OK";
    case Status::Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Status::Code::kNotFound: return "NOT_FOUND";
    case Status::Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Status::Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Status::Code::kDataLoss: return "DATA_LOSS";
    case Status::Code::kCancelled: return "CANCELLED";
    case Status::Code::kUnimplemented: return "UNIMPLEMENTED";
    case Status::Code::kUnauthenticated: return "UNAUTHENTICATED";
    case Status::Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Status::Code::kUnavailable: return "UNAVAILABLE";
    case Status::Code::kInternal: return "INTERNAL";
    case Status::Code::kAborted: return "ABORTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace traind
