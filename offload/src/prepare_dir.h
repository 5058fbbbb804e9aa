// The directory checks both persistent stores run before opening anything in `dir`.
#pragma once

#include <string>

#include "traind/engine/status.h"

namespace traind::offload {

// Missing (NOT_FOUND, or created when create_if_missing and its parent exists), not a directory
// or not writable / read-only file system (FAILED_PRECONDITION, via a probe file: root ignores
// mode bits but not read-only mounts), full (RESOURCE_EXHAUSTED). Messages name `dir`.
Status PrepareDir(const std::string& dir, bool create_if_missing);

}  // namespace traind::offload
