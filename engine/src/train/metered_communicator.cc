#include "train/metered_communicator.h"

#include <chrono>

namespace traind::engine {
namespace {

using Clock = std::chrono::steady_clock;

// (W-1)/W x bytes, exact in integers for the sizes a run uses.
int64_t Share(int64_t bytes, int world) {
  return world <= 1 ? 0 : bytes / world * (world - 1) + bytes % world * (world - 1) / world;
}

// Runs `call`, then adds its wall time and `bytes` to `stats`.
template <typename Call>
Status Metered(CommStats* stats, CommOp op, int64_t bytes, Call call) {
  const Clock::time_point start = Clock::now();
  Status s = call();
  stats->seconds += std::chrono::duration<double>(Clock::now() - start).count();
  stats->bytes_sent += bytes;
  stats->bytes_by_op[static_cast<int>(op)] += bytes;
  stats->calls += 1;
  return s;
}

}  // namespace

int64_t CommElementBytes(CommDType type) { return type == CommDType::kF32 ? 4 : 2; }

Status MeteredCommunicator::AllReduceSum(void* data, int64_t count, CommDType type) {
  const int64_t bytes = 2 * Share(count * CommElementBytes(type), world_size());
  return Metered(&stats_, CommOp::kAllReduce, bytes,
                 [&] { return inner_->AllReduceSum(data, count, type); });
}

Status MeteredCommunicator::ReduceScatterSum(const void* in, void* out, int64_t count, CommDType type) {
  const int64_t bytes = Share(count * world_size() * CommElementBytes(type), world_size());
  return Metered(&stats_, CommOp::kReduceScatter, bytes,
                 [&] { return inner_->ReduceScatterSum(in, out, count, type); });
}

Status MeteredCommunicator::ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                                    CommDType type) {
  int64_t others = 0;  // the elements of every range but this rank's
  if (world_size() > 1 && static_cast<int>(counts.size()) == world_size()) {
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) != rank()) others += counts[r];
    }
  }
  return Metered(&stats_, CommOp::kReduceScatter, others * CommElementBytes(type),
                 [&] { return inner_->ReduceScatterSumInPlace(data, counts, type); });
}

Status MeteredCommunicator::AllGather(const void* in, void* out, int64_t count, CommDType type) {
  const int64_t bytes = Share(count * world_size() * CommElementBytes(type), world_size());
  return Metered(&stats_, CommOp::kAllGather, bytes,
                 [&] { return inner_->AllGather(in, out, count, type); });
}

Status MeteredCommunicator::AllGatherInPlace(void* data, const std::vector<int64_t>& counts,
                                             CommDType type) {
  int64_t sent = 0;  // every range but the next rank's
  const int W = world_size();
  if (W > 1 && static_cast<int>(counts.size()) == W) {
    for (int r = 0; r < W; ++r) {
      if (r != (rank() + 1) % W) sent += counts[static_cast<size_t>(r)];
    }
  }
  return Metered(&stats_, CommOp::kAllGather, sent * CommElementBytes(type),
                 [&] { return inner_->AllGatherInPlace(data, counts, type); });
}

Status MeteredCommunicator::Broadcast(void* data, size_t bytes, int root) {
  const int64_t sent = world_size() > 1 && rank() == root ? static_cast<int64_t>(bytes) : 0;
  return Metered(&stats_, CommOp::kBroadcast, sent,
                 [&] { return inner_->Broadcast(data, bytes, root); });
}

Status MeteredCommunicator::Barrier() {
  return Metered(&stats_, CommOp::kAllReduce, 0, [&] { return inner_->Barrier(); });
}

}  // namespace traind::engine
