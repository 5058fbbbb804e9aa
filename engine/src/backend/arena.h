// DeviceArena: every byte a job allocates on its device goes through here, by category, so the
// measured high-water mark can be compared with the MemoryPlan. One allocation per buffer, made
// up front; nothing is allocated inside the step loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "traind/engine/plan.h"
#include "traind/engine/status.h"

namespace traind::engine {

enum class MemoryCategory { kWeights, kGradients, kOptimizer, kActivations, kTemporary };

class DeviceArena {
 public:
  // `budget_bytes` = 0: unlimited. The backend must outlive the arena.
  DeviceArena(Backend* backend, int64_t budget_bytes);
  ~DeviceArena();  // frees everything still allocated
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Allocates `bytes` (zeroed) for `category`. RESOURCE_EXHAUSTED naming `what`, the bytes, the
  // budget and the bytes in use when the budget or the device is exceeded.
  Result<void*> Allocate(MemoryCategory category, int64_t bytes, const std::string& what);
  void Release(void* ptr);

  int64_t used_bytes() const { return used_; }
  int64_t peak_bytes() const { return peak_; }
  MemoryBytes used_by_category() const { return by_category_; }
  Backend* backend() const { return backend_; }

 private:
  struct Block {
    void* ptr;
    int64_t bytes;
    MemoryCategory category;
  };
  Backend* backend_;
  int64_t budget_;
  int64_t used_ = 0;
  int64_t peak_ = 0;
  MemoryBytes by_category_;
  std::vector<Block> blocks_;
};

}  // namespace traind::engine
