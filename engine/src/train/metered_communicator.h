// MeteredCommunicator: a Communicator that forwards every collective to another and counts what it
// cost this rank: the seconds spent inside the calls and the bytes the collective sends from this
// rank. The trainer calls collectives synchronously (nothing overlaps them yet), so every second
// counted is communication not hidden by compute (traind_comm_seconds_total).
//
// Bytes sent follow the bus-bandwidth convention of nccl-tests for bandwidth-optimal (ring)
// algorithms, at the buffer's element size, for a world of W ranks and a buffer of S bytes:
//   all-reduce      2 (W-1)/W x S        (reduce-scatter then all-gather)
//   reduce-scatter  (W-1)/W x S_in       (S_in = W x count elements)
//   reduce-scatter in place, counts per rank: S - counts[rank] elements' bytes (S = their sum:
//                   the ring sends every range but its own once; equal counts give (W-1)/W x S)
//   all-gather      (W-1)/W x S_out      (S_out = W x count elements)
//   all-gather in place, counts per rank: S - counts[(rank+1) mod W] elements' bytes (the ring
//                   forwards every range but the next rank's)
//   broadcast       S on the root, 0 on the others (one-to-all)
//   barrier         0
// It is what the algorithm must move, not a count of the transport's frames (Gloo widens 16-bit
// buffers to fp32 before it sends them, which sends twice the count given here).
#pragma once

#include <cstdint>
#include <string>

#include "traind/engine/communicator.h"

namespace traind::engine {

// What the bytes went to, by collective (CommStats::bytes_by_op).
enum class CommOp : int { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2, kBroadcast = 3 };
constexpr int kCommOps = 4;

struct CommStats {
  double seconds = 0;      // time inside collectives
  int64_t bytes_sent = 0;  // see the convention above
  int64_t calls = 0;
  int64_t bytes_by_op[kCommOps] = {0, 0, 0, 0};  // bytes_sent by CommOp (they add up to it)
};

class MeteredCommunicator : public Communicator {
 public:
  explicit MeteredCommunicator(Communicator* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return inner_->name(); }

  Status AllReduceSum(void* data, int64_t count, CommDType type) override;
  Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) override;
  Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                 CommDType type) override;
  Status AllGather(const void* in, void* out, int64_t count, CommDType type) override;
  Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts, CommDType type) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;

  // Totals since construction (every call counted, failed ones too: their time was spent).
  const CommStats& stats() const { return stats_; }

 private:
  Communicator* inner_;
  CommStats stats_;
};

// Bytes of one element of `type` (4 or 2).
int64_t CommElementBytes(CommDType type);

}  // namespace traind::engine
