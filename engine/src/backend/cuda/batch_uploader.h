// BatchUploader: the host-to-device data path of the GPU backend. Two pinned host slots
// (double buffering): the loader fills one while the other's copy is in flight on a dedicated copy
// stream; the compute stream waits for the copy through an event, the host never does except when
// it reuses a slot whose copy has not finished. Works on both builds (under simt every copy is
// synchronous, so only the plumbing is exercised). Not thread-safe: one loader thread.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

class BatchUploader {
 public:
  // `slot_bytes`: the largest upload; `compute`: the stream that consumes the uploads.
  static Result<std::unique_ptr<BatchUploader>> Create(size_t slot_bytes, cudaStream_t compute);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  // The pinned host slot to fill next (slot_bytes long). Blocks until that slot's previous copy
  // has finished.
  Result<void*> NextSlot();
  // Copies the first `bytes` of the slot from the last NextSlot() to device memory `dst` on the
  // copy stream; work issued to the compute stream afterwards sees the data. INVALID_ARGUMENT when
  // bytes > slot_bytes or no slot was taken.
  Status Upload(void* dst, size_t bytes);

 private:
  BatchUploader() = default;
  size_t slot_bytes_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  void* slots_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};  // recorded after each slot's copy
  bool pending_[2] = {false, false};
  int next_ = 0;    // slot NextSlot() hands out next
  int taken_ = -1;  // slot handed out and not yet uploaded
};

TRAIND_GPU_END
