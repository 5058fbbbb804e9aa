// The Backend methods with a default implementation: LinearForward as separate ops, and
// MakeBatchUpload as two plain host slots copied with CopyHostToDevice, which is synchronous on
// the backends that use it (the CPU backend), so Consumed() has nothing to order.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace traind::engine {
namespace {

class HostBatchUpload final : public BatchUpload {
 public:
  HostBatchUpload(Backend* backend, size_t slot_bytes) : backend_(backend) {
    for (auto& s : slots_) s.resize(slot_bytes == 0 ? 1 : slot_bytes);
  }
  Result<void*> HostSlot(int slot) override {
    TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
    return static_cast<void*>(slots_[slot].data());
  }
  Status Upload(int slot, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
    if (bytes > slots_[slot].size()) {
      return Status::InvalidArgument("BatchUpload::Upload of " + std::to_string(bytes) +
                                     " bytes, slots hold " + std::to_string(slots_[slot].size()));
    }
    backend_->CopyHostToDevice(dst, slots_[slot].data(), bytes);
    return Status::Ok();
  }
  Status Consumed(int slot) override { return CheckSlot(slot); }

 private:
  static Status CheckSlot(int slot) {
    if (slot == 0 || slot == 1) return Status::Ok();
    return Status::InvalidArgument("BatchUpload: slot " + std::to_string(slot) + " is not 0 or 1");
  }
  Backend* backend_;
  std::vector<unsigned char> slots_[2];
};

}  // namespace

void Backend::LinearForward(float* pre, float* act, const void* inp, const void* weight,
                            const float* bias, int64_t N, int64_t C, int64_t OC, DType type) {
  Gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, pre, OC, type, DType::kF32);
  if (bias != nullptr) AddBias(pre, bias, N, OC);
  if (act != nullptr) GeluForward(act, pre, N * OC);
}

Result<std::unique_ptr<BatchUpload>> Backend::MakeBatchUpload(size_t slot_bytes) {
  return std::unique_ptr<BatchUpload>(new HostBatchUpload(this, slot_bytes));
}

}  // namespace traind::engine
