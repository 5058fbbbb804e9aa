// PinnedHostStaging: pinned slots + copy stream + events (see host_staging.h).
#include "backend/cuda/host_staging.h"

#include <string>

#include "backend/cuda/device.h"

TRAIND_GPU_BEGIN

Result<std::unique_ptr<PinnedHostStaging>> PinnedHostStaging::Create(int slots, size_t slot_bytes,
                                                                     cudaStream_t compute) {
  if (slots < 1) return Status::InvalidArgument("MakeHostStaging: " + std::to_string(slots) + " slots");
  std::unique_ptr<PinnedHostStaging> h(new PinnedHostStaging());
  h->slot_bytes_ = slot_bytes;
  h->compute_ = compute;
  TRAIND_RETURN_IF_ERROR(dev::StreamCreate(&h->copy_));
  TRAIND_RETURN_IF_ERROR(dev::EventCreate(&h->issued_));
  h->slots_.resize(static_cast<size_t>(slots));
  for (Slot& s : h->slots_) {
    TRAIND_RETURN_IF_ERROR(dev::MallocHost(&s.host, slot_bytes == 0 ? 1 : slot_bytes));
    TRAIND_RETURN_IF_ERROR(dev::EventCreate(&s.copied));
  }
  return h;
}

PinnedHostStaging::~PinnedHostStaging() {
  if (copy_ != nullptr) (void)dev::StreamSynchronize(copy_);
  for (Slot& s : slots_) {
    if (s.copied != nullptr) (void)dev::EventDestroy(s.copied);
    if (s.host != nullptr) (void)dev::FreeHost(s.host);
  }
  if (issued_ != nullptr) (void)dev::EventDestroy(issued_);
  if (copy_ != nullptr) (void)dev::StreamDestroy(copy_);
}

Result<void*> PinnedHostStaging::Host(int slot) {
  TRAIND_RETURN_IF_ERROR(CheckRange("Host", slot, 0, 0));
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.pending) {
    TRAIND_RETURN_IF_ERROR(dev::EventSynchronize(s.copied));
    s.pending = false;
  }
  return s.host;
}

Status PinnedHostStaging::AfterCompute() {
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(issued_, compute_));
  return dev::StreamWaitEvent(copy_, issued_);
}

Status PinnedHostStaging::Download(int slot, size_t offset, const void* src, size_t bytes) {
  TRAIND_RETURN_IF_ERROR(CheckRange("Download", slot, offset, bytes));
  Slot& s = slots_[static_cast<size_t>(slot)];
  TRAIND_RETURN_IF_ERROR(AfterCompute());
  TRAIND_RETURN_IF_ERROR(dev::MemcpyAsync(static_cast<char*>(s.host) + offset, src, bytes,
                                          dev::CopyKind::kDeviceToHost, copy_));
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(s.copied, copy_));
  s.pending = true;
  return Status::Ok();
}

Status PinnedHostStaging::Upload(int slot, size_t offset, void* dst, size_t bytes) {
  TRAIND_RETURN_IF_ERROR(CheckRange("Upload", slot, offset, bytes));
  Slot& s = slots_[static_cast<size_t>(slot)];
  TRAIND_RETURN_IF_ERROR(AfterCompute());
  TRAIND_RETURN_IF_ERROR(dev::MemcpyAsync(dst, static_cast<const char*>(s.host) + offset, bytes,
                                          dev::CopyKind::kHostToDevice, copy_));
  TRAIND_RETURN_IF_ERROR(dev::EventRecord(s.copied, copy_));
  s.pending = true;
  // The wait takes the event as just recorded (a later record on it does not move it).
  return dev::StreamWaitEvent(compute_, s.copied);
}

TRAIND_GPU_END
