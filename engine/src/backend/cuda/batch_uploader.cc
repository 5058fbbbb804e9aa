// BatchUploader: pinned double buffer + copy stream + events (see batch_uploader.h).
#include "backend/cuda/batch_uploader.h"

#include <string>

#include "backend/cuda/device.h"

TRAIND_GPU_BEGIN

Result<std::unique_ptr<BatchUploader>> BatchUploader::Create(size_t slot_bytes,
                                                             cudaStream_t compute) {
  std::unique_ptr<BatchUploader> u(new BatchUploader());
  u->slot_bytes_ = slot_bytes;
  u->compute_ = compute;
  TRAIND_RETURN_IF_ERROR(dev::StreamCreate(&u->copy_));
  for (int i = 0; i < 2; ++i) {
    TRAIND_RETURN_IF_ERROR(dev::MallocHost(&u->slots_[i], slot_bytes == 0 ? 1 : slot_bytes));
    TRAIND_RETURN_IF_ERROR(dev::EventCreate(&u->done_[i]));
  }
  return u;
}

BatchUploader::~BatchUploader() {
  if (copy_ != nullptr) (void)dev::StreamSynchronize(copy_);
  for (int i = 0; i < 2; ++i) {
    if (done_[i] != nullptr) (void)dev::EventDestroy(done_[i]);
    if (slots_[i] != nullptr) (void)dev::FreeHost(slots_[i]);
  }
  if (copy_ != nullptr) (void)dev::StreamDestroy(copy_);
}

Result<void*> BatchUploader::NextSlot() {
  const int s = next_;
  if (pending_[s]) {
    TRAIND_RETURN_IF_ERROR(dev::EventSynchronize(done_[s]));
    pending_[s] = false;
  }
  taken_ = s;
  next_ = 1 - s;
  return slots_[s];
}

Status BatchUploader::Upload(void* dst, size_t bytes) {
  if (taken_ < 0) return Status::InvalidArgument("BatchUploader::Upload without NextSlot()");
  if (bytes > slot_bytes_)
    return Status::InvalidArgument("BatchUploader::Upload of " + std::to_string(bytes) +
                                   " bytes, slots hold " + std::to_string(slot_bytes_));
  const int s = taken_;
  taken_ = -1;
  TRAIND_RETURN_IF_ERROR(
      dev::MemcpyAsync(dst, slots_[s], bytes, dev::CopyKind::kHostToDevice, copy_));
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(done_[s], copy_));
  pending_[s] = true;
  return dev::StreamWaitEvent(compute_, done_[s]);
}

TRAIND_GPU_END
