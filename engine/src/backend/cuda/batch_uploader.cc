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
    TRAIND_RETURN_IF_ERROR(dev::EventCreate(&u->copied_[i]));
    TRAIND_RETURN_IF_ERROR(dev::EventCreate(&u->consumed_[i]));
  }
  return u;
}

BatchUploader::~BatchUploader() {
  if (copy_ != nullptr) (void)dev::StreamSynchronize(copy_);
  for (int i = 0; i < 2; ++i) {
    if (copied_[i] != nullptr) (void)dev::EventDestroy(copied_[i]);
    if (consumed_[i] != nullptr) (void)dev::EventDestroy(consumed_[i]);
    if (slots_[i] != nullptr) (void)dev::FreeHost(slots_[i]);
  }
  if (copy_ != nullptr) (void)dev::StreamDestroy(copy_);
}

Status BatchUploader::CheckSlot(int slot) {
  if (slot == 0 || slot == 1) return Status::Ok();
  return Status::InvalidArgument("BatchUploader: slot " + std::to_string(slot) + " is not 0 or 1");
}

Result<void*> BatchUploader::HostSlot(int slot) {
  TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
  if (copy_pending_[slot]) {  // the host must not overwrite pinned memory a copy still reads
    TRAIND_RETURN_IF_ERROR(dev::EventSynchronize(copied_[slot]));
    copy_pending_[slot] = false;
  }
  return slots_[slot];
}

Status BatchUploader::Upload(int slot, void* dst, size_t bytes) {
  TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
  if (bytes > slot_bytes_) {
    return Status::InvalidArgument("BatchUploader::Upload of " + std::to_string(bytes) +
                                   " bytes, slots hold " + std::to_string(slot_bytes_));
  }
  // Write-after-read on the device buffer: wait for the previous readers of this slot's data.
  if (consumer_marked_[slot]) {
    TRAIND_RETURN_IF_ERROR(dev::StreamWaitEvent(copy_, consumed_[slot]));
    consumer_marked_[slot] = false;
  }
  TRAIND_RETURN_IF_ERROR(
      dev::MemcpyAsync(dst, slots_[slot], bytes, dev::CopyKind::kHostToDevice, copy_));
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(copied_[slot], copy_));
  copy_pending_[slot] = true;
  return dev::StreamWaitEvent(compute_, copied_[slot]);
}

Status BatchUploader::Consumed(int slot) {
  TRAIND_RETURN_IF_ERROR(CheckSlot(slot));
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(consumed_[slot], compute_));
  consumer_marked_[slot] = true;
  return Status::Ok();
}

TRAIND_GPU_END
