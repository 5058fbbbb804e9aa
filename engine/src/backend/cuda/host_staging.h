// PinnedHostStaging: the GPU backends' HostStaging (backend.h). A fixed number of pinned host
// slots and a copy stream of its own. Every copy first waits (on the copy stream) for an event
// recorded on the compute stream when it is issued, so a download reads what the compute work
// issued before it wrote and an upload never overwrites data a queued kernel still reads; the
// compute stream waits for each upload through an event, so work issued afterwards sees it. The
// host waits only in Host(slot), for that slot's last copy. Works on both builds (under simt every
// copy is synchronous, so only the plumbing and the ordering rules are exercised). Not
// thread-safe: one driving thread.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

class PinnedHostStaging final : public HostStaging {
 public:
  // `compute`: the stream whose work the copies are ordered with.
  static Result<std::unique_ptr<PinnedHostStaging>> Create(int slots, size_t slot_bytes,
                                                           cudaStream_t compute);
  ~PinnedHostStaging() override;
  PinnedHostStaging(const PinnedHostStaging&) = delete;
  PinnedHostStaging& operator=(const PinnedHostStaging&) = delete;

  int slots() const override { return static_cast<int>(slots_.size()); }
  size_t slot_bytes() const override { return slot_bytes_; }
  Result<void*> Host(int slot) override;
  Status Download(int slot, size_t offset, const void* src, size_t bytes) override;
  Status Upload(int slot, size_t offset, void* dst, size_t bytes) override;

 private:
  PinnedHostStaging() = default;
  // The copy stream waits for the compute work issued so far.
  Status AfterCompute();
  struct Slot {
    void* host = nullptr;
    cudaEvent_t copied = nullptr;  // recorded on copy_ after the slot's last copy (an upload's:
                                   // compute_ waits for it)
    bool pending = false;          // a copy was issued since the host last waited
  };
  size_t slot_bytes_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t issued_ = nullptr;  // recorded on compute_ when a copy is issued
  std::vector<Slot> slots_;
};

TRAIND_GPU_END
