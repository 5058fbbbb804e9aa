// Communicator: the collectives a data-parallel run needs, over flat buffers, between the ranks of
// one run (one rank per process). The engine defines it; implementations live beside the engine
// (Gloo on the CPU backend, NCCL on CUDA) and reach RunJob through RunOptions::communicator.
// A world of one needs none: RunJob without a communicator trains alone.
//
// Contract for every implementation:
// - Every rank calls the same collectives in the same order with the same sizes and types.
// - Buffers are device memory of the job's backend (host memory on the CPU backend).
// - 16-bit buffers are reduced with fp32 accumulation.
// - A collective that cannot complete within the implementation's timeout (a peer died or hangs)
//   returns DEADLINE_EXCEEDED or UNAVAILABLE naming the peer, on every surviving rank.
// - Calls come from one thread at a time (the trainer's, or during a step's backward its
//   communication thread: OverlappedAllReduce), never concurrently; implementations need not be
//   thread-safe, but must not depend on per-thread state set up by another thread (NCCL: the
//   current CUDA device is per thread, so each call sets it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "traind/engine/status.h"

namespace traind::engine {

enum class CommDType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo", "nccl", ...: for messages and metrics.
  virtual std::string name() const = 0;

  // data[0..count) = the element-wise sum over all ranks (in place).
  virtual Status AllReduceSum(void* data, int64_t count, CommDType type) = 0;
  // Rank r receives in `out` (count elements) the sum over all ranks of in[r*count, (r+1)*count).
  virtual Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) = 0;
  // In place, a count per rank (ZeRO-1's gradient reduce-scatter; ranges may differ in size):
  // `data` holds C = counts[0] + ... + counts[W-1] elements, rank r's range the counts[r] elements
  // after those of ranks 0..r-1. On return rank r's range holds the element-wise sum over all
  // ranks of that range; the other ranges of `data` hold unspecified values (partial sums).
  // `counts`: world_size() entries >= 0 (zero allowed), the same on every rank. Bandwidth-optimal
  // implementations send C - counts[rank] elements from each rank (a ring, or one reduce per
  // root). INVALID_ARGUMENT for a wrong number of counts or a negative one.
  virtual Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                         CommDType type) = 0;
  // In place, a count per rank (ZeRO-1's weight gather): `data` holds C elements laid out as in
  // ReduceScatterSumInPlace; rank r's range holds its own values on rank r. On return every range
  // holds its owner's values on every rank (bytes copied, no arithmetic). Bandwidth-optimal
  // implementations send C - counts[(rank+1) mod W] elements from each rank (a ring, or one
  // broadcast per root). INVALID_ARGUMENT for a wrong number of counts or a negative one.
  virtual Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts,
                                  CommDType type) = 0;
  // out[r*count, (r+1)*count) = rank r's `in` (count elements), on every rank.
  virtual Status AllGather(const void* in, void* out, int64_t count, CommDType type) = 0;
  // data (bytes) = root's data, on every rank.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
};

}  // namespace traind::engine
