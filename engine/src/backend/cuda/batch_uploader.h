// BatchUploader: the GPU backends' BatchUpload (backend.h), the host-to-device data path. Two
// pinned host slots (double buffering) and a dedicated copy stream: the loader fills one slot
// while the other's copy is in flight; the compute stream waits for a copy through an event, the
// host never does except when it refills a slot whose copy has not finished. A copy into device
// memory waits (on the copy stream) for the compute work marked by that slot's last Consumed(),
// so it never overwrites data a queued kernel or graph still reads, yet overlaps the work queued
// after it. Works on both builds (under simt every copy is synchronous, so only the plumbing is
// exercised). Not thread-safe: one loader thread.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

class BatchUploader final : public BatchUpload {
 public:
  // `slot_bytes`: the largest upload; `compute`: the stream that consumes the uploads.
  static Result<std::unique_ptr<BatchUploader>> Create(size_t slot_bytes, cudaStream_t compute);
  ~BatchUploader() override;
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  Result<void*> HostSlot(int slot) override;
  Status Upload(int slot, void* dst, size_t bytes) override;
  Status Consumed(int slot) override;

 private:
  BatchUploader() = default;
  static Status CheckSlot(int slot);
  size_t slot_bytes_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  void* slots_[2] = {nullptr, nullptr};
  cudaEvent_t copied_[2] = {nullptr, nullptr};    // recorded on copy_ after each slot's copy
  cudaEvent_t consumed_[2] = {nullptr, nullptr};  // recorded on compute_ by Consumed()
  bool copy_pending_[2] = {false, false};
  bool consumer_marked_[2] = {false, false};
};

TRAIND_GPU_END
