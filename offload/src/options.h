// StoreOptions validation (both factories call it once).
#pragma once

#include "traind/engine/status.h"
#include "traind/offload/offload.h"

namespace traind::offload {

// OK, or INVALID_ARGUMENT naming the first bad field, its value and the allowed range.
Status ValidateOptions(const StoreOptions& o);

}  // namespace traind::offload
