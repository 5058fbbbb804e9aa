// DeviceArena: budgeted, per-category device allocations with a measured high-water mark.
// Bytes are counted exactly as requested, so the peak is directly comparable with a MemoryPlan.
#include "backend/arena.h"

#include <algorithm>
#include <cassert>

namespace traind::engine {
namespace {

int64_t& CategorySlot(MemoryBytes& b, MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kWeights:
      return b.weights;
    case MemoryCategory::kGradients:
      return b.gradients;
    case MemoryCategory::kOptimizer:
      return b.optimizer;
    case MemoryCategory::kActivations:
      return b.activations;
    case MemoryCategory::kTemporary:
      return b.temporary;
  }
  return b.temporary;
}

}  // namespace

DeviceArena::DeviceArena(Backend* backend, int64_t budget_bytes)
    : backend_(backend), budget_(budget_bytes) {}

DeviceArena::~DeviceArena() {
  for (const Block& b : blocks_) backend_->Free(b.ptr);
}

Result<void*> DeviceArena::Allocate(MemoryCategory category, int64_t bytes,
                                    const std::string& what) {
  if (bytes < 0) return Status::InvalidArgument("arena: negative size for " + what);
  if (budget_ > 0 && used_ + bytes > budget_) {
    return Status::ResourceExhausted(
        "allocating " + what + " needs " + std::to_string(bytes) + " bytes with " +
        std::to_string(used_) + " in use, over the budget of " + std::to_string(budget_) +
        " bytes: lower the micro-batch, enable gradient_checkpointing or raise the budget");
  }
  // Zero-byte requests still get a distinct (tiny) block so Release() stays uniform.
  void* ptr = backend_->Alloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  if (ptr == nullptr) {
    return Status::ResourceExhausted(
        "device " + backend_->name() + " is out of memory allocating " + what + " (" +
        std::to_string(bytes) + " bytes, " + std::to_string(used_) + " in use)");
  }
  backend_->Memset0(ptr, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  blocks_.push_back({ptr, bytes, category});
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  CategorySlot(by_category_, category) += bytes;
  return ptr;
}

void DeviceArena::Release(void* ptr) {
  auto it =
      std::find_if(blocks_.begin(), blocks_.end(), [ptr](const Block& b) { return b.ptr == ptr; });
  assert(it != blocks_.end() && "DeviceArena::Release of a pointer it does not own");
  if (it == blocks_.end()) return;
  used_ -= it->bytes;
  CategorySlot(by_category_, it->category) -= it->bytes;
  backend_->Free(it->ptr);
  blocks_.erase(it);
}

}  // namespace traind::engine
