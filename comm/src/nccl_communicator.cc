// NcclCommunicator: see traind/comm/nccl_communicator.h. The rendezvous is comm's shared one
// (rendezvous.h); what is here is NCCL's and CUDA's calls.
#include "traind/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nccl_api.h"
#include "nccl_cast.h"
#include "nccl_unique_id.h"
#include "rank_ranges.h"
#include "rendezvous.h"

namespace traind::comm {
namespace {

using engine::CommDType;
using Clock = std::chrono::steady_clock;

constexpr char kUniqueIdKey[] = "nccl/unique_id";

// The loaded NCCL: every path that reaches a call went through LoadNccl() first
// (OpenNcclCommunicator, ShareNcclUniqueId).
const NcclApi& Nccl() { return **LoadNccl(); }

size_t ElementSize(CommDType t) { return t == CommDType::kF32 ? 4 : 2; }

std::string CudaError(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Device (or managed) memory goes to NCCL as it is; host memory is staged through the device.
bool IsDeviceMemory(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not a CUDA pointer: clear the sticky-free error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// A device buffer that only grows (the same sizes recur every step: allocated once).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t Reserve(size_t bytes) {
    if (bytes <= capacity_) return cudaSuccess;
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e == cudaSuccess) capacity_ = bytes;
    return e;
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

class NcclCommunicator : public engine::Communicator {
 public:
  NcclCommunicator(Rendezvous rv, ncclComm_t comm, cudaStream_t stream, int rank, int world,
                   int device, std::chrono::milliseconds timeout)
      : rv_(std::move(rv)), comm_(comm), stream_(stream), rank_(rank), world_(world),
        device_(device), timeout_(timeout) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // Finalize flushes outstanding work (every rank does it); bounded, then abort.
      ncclResult_t r = Nccl().CommFinalize(comm_);
      const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        Nccl().CommGetAsyncError(comm_, &r);
      }
      if (r == ncclSuccess) {
        Nccl().CommDestroy(comm_);
      } else {
        Nccl().CommAbort(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }

  Status AllReduceSum(void* data, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(count) * ElementSize(type);
    const char* what = "all-reduce";
    TRAIND_RETURN_IF_ERROR(Begin(what, bytes));
    void* d = nullptr;
    TRAIND_RETURN_IF_ERROR(Stage(what, bytes, data, bytes, &stage_in_, /*copy_in=*/true, &d));
    if (type == CommDType::kF32) {
      TRAIND_RETURN_IF_ERROR(
          Issue(what, bytes, Nccl().AllReduce(d, d, static_cast<size_t>(count), ncclFloat, ncclSum,
                                           comm_, stream_)));
    } else {
      const bool bf16 = type == CommDType::kBF16;
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, scratch_.Reserve(static_cast<size_t>(count) * 4)));
      float* f = static_cast<float*>(scratch_.get());
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, WidenToF32(d, f, count, bf16, stream_)));
      TRAIND_RETURN_IF_ERROR(
          Issue(what, bytes, Nccl().AllReduce(f, f, static_cast<size_t>(count), ncclFloat, ncclSum,
                                           comm_, stream_)));
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, NarrowFromF32(f, d, count, bf16, stream_)));
    }
    return Finish(what, bytes, data, d, bytes);
  }

  Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const int64_t total = count * world_;
    const size_t in_bytes = static_cast<size_t>(total) * ElementSize(type);
    const size_t out_bytes = static_cast<size_t>(count) * ElementSize(type);
    const char* what = "reduce-scatter";
    TRAIND_RETURN_IF_ERROR(Begin(what, in_bytes));
    void* din = nullptr;
    void* dout = nullptr;
    TRAIND_RETURN_IF_ERROR(
        Stage(what, in_bytes, const_cast<void*>(in), in_bytes, &stage_in_, true, &din));
    TRAIND_RETURN_IF_ERROR(Stage(what, in_bytes, out, out_bytes, &stage_out_, false, &dout));
    if (type == CommDType::kF32) {
      TRAIND_RETURN_IF_ERROR(
          Issue(what, in_bytes, Nccl().ReduceScatter(din, dout, static_cast<size_t>(count), ncclFloat,
                                                  ncclSum, comm_, stream_)));
    } else {
      // scratch: [0, total) the widened input, [total, total + count) this rank's fp32 sums.
      const bool bf16 = type == CommDType::kBF16;
      TRAIND_RETURN_IF_ERROR(
          Cuda(what, in_bytes, scratch_.Reserve(static_cast<size_t>(total + count) * 4)));
      float* f = static_cast<float*>(scratch_.get());
      TRAIND_RETURN_IF_ERROR(Cuda(what, in_bytes, WidenToF32(din, f, total, bf16, stream_)));
      TRAIND_RETURN_IF_ERROR(
          Issue(what, in_bytes, Nccl().ReduceScatter(f, f + total, static_cast<size_t>(count),
                                                  ncclFloat, ncclSum, comm_, stream_)));
      TRAIND_RETURN_IF_ERROR(
          Cuda(what, in_bytes, NarrowFromF32(f + total, dout, count, bf16, stream_)));
    }
    return Finish(what, in_bytes, out, dout, out_bytes);
  }

  // One ncclReduce per rank with a non-empty range (root r, in place on its range) inside one
  // ncclGroupStart / ncclGroupEnd: NCCL runs them together, and each rank sends every range but
  // its own once (what a reduce-scatter sends; ncclReduceScatter itself wants equal counts, so
  // unequal ranges would need a padded copy). 16-bit: widened whole into the fp32 scratch,
  // reduced there, this rank's range rounded back.
  Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                 CommDType type) override {
    TRAIND_ASSIGN_OR_RETURN(const RankRanges ranges,
                            CheckedRankRanges("reduce-scatter", counts, world_));
    const int64_t total = ranges.total;
    const std::vector<int64_t>& offset = ranges.offset;
    if (total == 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(total) * ElementSize(type);
    const char* what = "reduce-scatter";
    TRAIND_RETURN_IF_ERROR(Begin(what, bytes));
    void* d = nullptr;
    TRAIND_RETURN_IF_ERROR(Stage(what, bytes, data, bytes, &stage_in_, /*copy_in=*/true, &d));
    float* f = static_cast<float*>(d);
    const bool bf16 = type == CommDType::kBF16;
    if (type != CommDType::kF32) {
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, scratch_.Reserve(static_cast<size_t>(total) * 4)));
      f = static_cast<float*>(scratch_.get());
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, WidenToF32(d, f, total, bf16, stream_)));
    }
    TRAIND_RETURN_IF_ERROR(Issue(what, bytes, Nccl().GroupStart()));
    for (int r = 0; r < world_; ++r) {
      const size_t n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
      if (n == 0) continue;
      float* range = f + offset[static_cast<size_t>(r)];
      const ncclResult_t rr = Nccl().Reduce(range, range, n, ncclFloat, ncclSum, r, comm_, stream_);
      if (rr != ncclSuccess && rr != ncclInProgress) {
        (void)Nccl().GroupEnd();
        return NcclFailed(what, bytes, rr);
      }
    }
    TRAIND_RETURN_IF_ERROR(Issue(what, bytes, Nccl().GroupEnd()));
    const int64_t mine = counts[static_cast<size_t>(rank_)];
    const int64_t at = offset[static_cast<size_t>(rank_)];
    if (type != CommDType::kF32 && mine > 0) {
      unsigned char* dst = static_cast<unsigned char*>(d) + static_cast<size_t>(at) * 2;
      TRAIND_RETURN_IF_ERROR(Cuda(what, bytes, NarrowFromF32(f + at, dst, mine, bf16, stream_)));
    }
    return Finish(what, bytes, data, d, bytes);
  }

  // One in-place ncclBroadcast per non-empty range, rooted at its owner, in one group: NCCL's
  // broadcast is a pipelined ring, so each rank sends every range but the next rank's once.
  Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts, CommDType type) override {
    TRAIND_ASSIGN_OR_RETURN(const RankRanges ranges,
                            CheckedRankRanges("all-gather", counts, world_));
    const size_t unit = ElementSize(type);
    const size_t total = static_cast<size_t>(ranges.total) * unit;  // bytes
    if (total == 0) return Status::Ok();
    const char* what = "all-gather";
    TRAIND_RETURN_IF_ERROR(Begin(what, total));
    void* d = nullptr;
    TRAIND_RETURN_IF_ERROR(Stage(what, total, data, total, &stage_in_, /*copy_in=*/true, &d));
    TRAIND_RETURN_IF_ERROR(Issue(what, total, Nccl().GroupStart()));
    for (int r = 0; r < world_; ++r) {
      const size_t n = static_cast<size_t>(counts[static_cast<size_t>(r)]) * unit;
      if (n == 0) continue;
      void* range = static_cast<unsigned char*>(d) +
                    static_cast<size_t>(ranges.offset[static_cast<size_t>(r)]) * unit;
      const ncclResult_t rr = Nccl().Broadcast(range, range, n, ncclUint8, r, comm_, stream_);
      if (rr != ncclSuccess && rr != ncclInProgress) {
        (void)Nccl().GroupEnd();
        return NcclFailed(what, total, rr);
      }
    }
    TRAIND_RETURN_IF_ERROR(Issue(what, total, Nccl().GroupEnd()));
    return Finish(what, total, data, d, total);
  }

  Status AllGather(const void* in, void* out, int64_t count, CommDType type) override {
    if (count <= 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(count) * ElementSize(type);
    const size_t out_bytes = bytes * static_cast<size_t>(world_);
    const char* what = "all-gather";
    TRAIND_RETURN_IF_ERROR(Begin(what, bytes));
    void* din = nullptr;
    void* dout = nullptr;
    TRAIND_RETURN_IF_ERROR(
        Stage(what, bytes, const_cast<void*>(in), bytes, &stage_in_, true, &din));
    TRAIND_RETURN_IF_ERROR(Stage(what, bytes, out, out_bytes, &stage_out_, false, &dout));
    TRAIND_RETURN_IF_ERROR(
        Issue(what, bytes, Nccl().AllGather(din, dout, bytes, ncclUint8, comm_, stream_)));
    return Finish(what, bytes, out, dout, out_bytes);
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_) {
      return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " outside world " +
                                     std::to_string(world_));
    }
    if (bytes == 0) return Status::Ok();
    const char* what = "broadcast";
    TRAIND_RETURN_IF_ERROR(Begin(what, bytes));
    void* d = nullptr;
    TRAIND_RETURN_IF_ERROR(Stage(what, bytes, data, bytes, &stage_in_, true, &d));
    TRAIND_RETURN_IF_ERROR(
        Issue(what, bytes, Nccl().Broadcast(d, d, bytes, ncclUint8, root, comm_, stream_)));
    return Finish(what, bytes, data, d, bytes);
  }

  Status Barrier() override {
    const char* what = "barrier";
    TRAIND_RETURN_IF_ERROR(Begin(what, 0));
    TRAIND_RETURN_IF_ERROR(Cuda(what, 0, scratch_.Reserve(4)));
    float* f = static_cast<float*>(scratch_.get());
    TRAIND_RETURN_IF_ERROR(Cuda(what, 0, cudaMemsetAsync(f, 0, 4, stream_)));
    TRAIND_RETURN_IF_ERROR(Issue(what, 0, Nccl().AllReduce(f, f, 1, ncclFloat, ncclSum, comm_, stream_)));
    return Finish(what, 0, nullptr, nullptr, 0);
  }

 private:
  std::string Where(const char* what, size_t bytes) const {
    return "nccl " + std::string(what) + " of " + std::to_string(bytes) + " bytes on rank " +
           std::to_string(rank_) + " of " + std::to_string(world_) + " (cuda:" +
           std::to_string(device_) + ")";
  }

  // A communicator that failed once (aborted) refuses every later call; the collective's deadline;
  // the device, set on every call: the caller may be the trainer's thread or the gradient
  // buckets' communication thread (OverlappedAllReduce), and the current device is per thread.
  Status Begin(const char* what, size_t bytes) {
    if (broken_) {
      return Status::Unavailable(Where(what, bytes) + ": the communicator failed earlier (" +
                                 broken_message_ + ")");
    }
    deadline_ = Clock::now() + timeout_;
    return Cuda(what, bytes, cudaSetDevice(device_));
  }

  // `host_or_device` as a device pointer: itself when it is device memory, else `stage` (grown to
  // `bytes`), filled from it when copy_in.
  Status Stage(const char* what, size_t op_bytes, void* host_or_device, size_t bytes,
               DeviceBuffer* stage, bool copy_in, void** device) {
    if (IsDeviceMemory(host_or_device)) {
      *device = host_or_device;
      return Status::Ok();
    }
    TRAIND_RETURN_IF_ERROR(Cuda(what, op_bytes, stage->Reserve(bytes)));
    *device = stage->get();
    if (!copy_in) return Status::Ok();
    return Cuda(what, op_bytes, cudaMemcpyAsync(*device, host_or_device, bytes,
                                                cudaMemcpyHostToDevice, stream_));
  }

  // A CUDA call's error (a staging / scratch allocation, a copy, the cast kernels): this rank's
  // collective cannot finish, so the communicator is aborted (the peers then fail too).
  Status Cuda(const char* what, size_t bytes, cudaError_t e) {
    if (e == cudaSuccess) return Status::Ok();
    return Fail(Where(what, bytes) + " failed: " + CudaError(e),
                e == cudaErrorMemoryAllocation ? Status::Code::kResourceExhausted
                                               : Status::Code::kInternal);
  }

  // An NCCL call's result: ncclInProgress (non-blocking communicator) means it is still being
  // enqueued: polled through ncclCommGetAsyncError until done, failed or the deadline.
  Status Issue(const char* what, size_t bytes, ncclResult_t r) {
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline_) return TimedOut(what, bytes);
      std::this_thread::yield();
      Nccl().CommGetAsyncError(comm_, &r);
    }
    if (r == ncclSuccess) return Status::Ok();
    return NcclFailed(what, bytes, r);
  }

  // Waits for the stream (polling it and NCCL's async error, within the deadline), then copies a
  // staged result back to host memory.
  Status Finish(const char* what, size_t bytes, void* out, void* device_out, size_t out_bytes) {
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return Cuda(what, bytes, e);
      ncclResult_t async = ncclSuccess;
      Nccl().CommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return NcclFailed(what, bytes, async);
      if (Clock::now() >= deadline_) return TimedOut(what, bytes);
      if (spins < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (out == nullptr || out == device_out) return Status::Ok();
    // The collective is done: this copy cannot wait on a peer.
    TRAIND_RETURN_IF_ERROR(
        Cuda(what, bytes, cudaMemcpyAsync(out, device_out, out_bytes, cudaMemcpyDeviceToHost, stream_)));
    return Cuda(what, bytes, cudaStreamSynchronize(stream_));
  }

  Status NcclFailed(const char* what, size_t bytes, ncclResult_t r) {
    const char* last = Nccl().GetLastError(comm_);
    const bool peer = r == ncclRemoteError || r == ncclSystemError;
    return Fail(Where(what, bytes) + " failed" +
                    (peer ? std::string(" (a peer went away)") : std::string()) + ": " +
                    Nccl().GetErrorString(r) + (last != nullptr && *last ? std::string(" (") + last + ")" : ""),
                peer ? Status::Code::kUnavailable : Status::Code::kInternal);
  }

  Status TimedOut(const char* what, size_t bytes) {
    return Fail(Where(what, bytes) + " timed out after " + Seconds(timeout_) +
                    " s (TRAIND_DIST_COLLECTIVE_TIMEOUT_S): a peer died or hangs",
                Status::Code::kUnavailable);
  }

  // Aborts the communicator (the other ranks' collectives then fail too) and remembers why.
  Status Fail(const std::string& message, Status::Code code) {
    if (comm_ != nullptr) {
      Nccl().CommAbort(comm_);
      comm_ = nullptr;
    }
    broken_ = true;
    broken_message_ = message;
    return Status(code, message);
  }

  Rendezvous rv_;  // rank 0 keeps the store up while the communicator lives
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int world_;
  int device_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
  DeviceBuffer scratch_;    // fp32: widened 16-bit buffers; the barrier's float
  DeviceBuffer stage_in_;   // host inputs (and in-place buffers) staged on the device
  DeviceBuffer stage_out_;  // host outputs
  bool broken_ = false;
  std::string broken_message_;
};

}  // namespace

Result<std::string> ShareNcclUniqueId(Rendezvous& rv, int rank) {
  if (rank == 0) {
    TRAIND_RETURN_IF_ERROR(LoadNccl().status());
    ncclUniqueId id;
    const ncclResult_t r = Nccl().GetUniqueId(&id);
    if (r != ncclSuccess) {
      const char* last = Nccl().GetLastError(nullptr);
      return Status::Internal("nccl: " + rv.me + ": ncclGetUniqueId failed: " +
                              Nccl().GetErrorString(r) + (last != nullptr && *last ? std::string(" (") + last + ")" : ""));
    }
    std::string bytes(id.internal, sizeof(id.internal));
    TRAIND_RETURN_IF_ERROR(rv.store->Set(kUniqueIdKey, bytes));
    return bytes;
  }
  TRAIND_ASSIGN_OR_RETURN(std::string bytes,
                          WaitForKey(rv, kUniqueIdKey, "rank 0 (NCCL's unique id)"));
  if (bytes.size() != sizeof(ncclUniqueId::internal)) {
    return Status::InvalidArgument("nccl: " + rv.me + ": rank 0 published a unique id of " +
                                   std::to_string(bytes.size()) + " bytes, this NCCL expects " +
                                   std::to_string(sizeof(ncclUniqueId::internal)) +
                                   " (different NCCL versions on the ranks?)");
  }
  return bytes;
}

Result<std::unique_ptr<engine::Communicator>> OpenNcclCommunicator(const DistributedOptions& o,
                                                                   int cuda_device) {
  const std::string dev = "cuda:" + std::to_string(cuda_device);
  const std::string me = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
  // The device first: without one no rank should wait in the rendezvous.
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::FailedPrecondition("nccl: " + me + ": " + dev +
                                      " is not usable, no CUDA device on this machine (" +
                                      CudaError(e) + ")");
  }
  if (cuda_device < 0 || cuda_device >= count) {
    return Status::FailedPrecondition("nccl: " + me + ": " + dev + " does not exist (" +
                                      std::to_string(count) + " CUDA device(s))");
  }
  if (const cudaError_t e = cudaSetDevice(cuda_device); e != cudaSuccess) {
    return Status::FailedPrecondition("nccl: " + me + ": cudaSetDevice(" +
                                      std::to_string(cuda_device) + "): " + CudaError(e));
  }
  // NCCL itself before anyone waits: a rank that cannot load it says so at once.
  TRAIND_RETURN_IF_ERROR(LoadNccl().status());
  TRAIND_ASSIGN_OR_RETURN(Rendezvous rv, JoinRendezvous(o));
  TRAIND_ASSIGN_OR_RETURN(std::string id_bytes, ShareNcclUniqueId(rv, o.rank));
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));

  // Non-blocking initialisation, polled so that a peer lost after the rendezvous is a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = Nccl().CommInitRankConfig(&comm, o.world_size, id, o.rank, &config);
  const Clock::time_point deadline = Clock::now() + o.rendezvous_timeout;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline) {
      Nccl().CommAbort(comm);
      return Status::Unavailable("nccl: " + me + " (" + dev + "): ncclCommInitRank timed out " +
                                      "after " + Seconds(o.rendezvous_timeout) +
                                      " s (TRAIND_DIST_TIMEOUT_S): a peer died or hangs after "
                                      "the rendezvous at " + rv.where);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Nccl().CommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    const char* last = Nccl().GetLastError(comm);
    const std::string message = "nccl: " + me + " (" + dev + "): ncclCommInitRank failed: " +
                                Nccl().GetErrorString(r) +
                                (last != nullptr && *last ? std::string(" (") + last + ")" : "");
    if (comm != nullptr) Nccl().CommAbort(comm);
    return r == ncclRemoteError || r == ncclSystemError ? Status::Unavailable(message)
                                                        : Status::Internal(message);
  }
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    Nccl().CommAbort(comm);
    return Status::Internal("nccl: " + me + " (" + dev + "): cudaStreamCreate: " + CudaError(e));
  }
  auto out = std::make_unique<NcclCommunicator>(std::move(rv), comm, stream, o.rank, o.world_size,
                                                cuda_device, o.collective_timeout);
  TRAIND_RETURN_IF_ERROR(out->Barrier());
  return std::unique_ptr<engine::Communicator>(std::move(out));
}

}  // namespace traind::comm
