// MeteredCommunicator: every collective reaches the wrapped communicator unchanged, and the bytes
// counted follow the ring-algorithm convention of metered_communicator.h for W = 1, 2, 3, 4.
#include "train/metered_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace traind::engine {
namespace {

// Records the calls; sleeps `delay` in each; fails when told to.
class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "fake"; }
  Status AllReduceSum(void* data, int64_t count, CommDType type) override {
    return Record("allreduce", data, count, type);
  }
  Status ReduceScatterSum(const void* in, void*, int64_t count, CommDType type) override {
    return Record("reducescatter", in, count, type);
  }
  Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                 CommDType type) override {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    return Record("reducescatterv", data, total, type);
  }
  Status AllGather(const void* in, void*, int64_t count, CommDType type) override {
    return Record("allgather", in, count, type);
  }
  Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts, CommDType type) override {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    return Record("allgatherv", data, total, type);
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    return Record("broadcast" + std::to_string(root), data, static_cast<int64_t>(bytes), CommDType::kF32);
  }
  Status Barrier() override { return Record("barrier", nullptr, 0, CommDType::kF32); }

  std::vector<std::string> calls;
  std::vector<const void*> pointers;
  std::vector<int64_t> counts;
  std::chrono::milliseconds delay{0};
  bool fail = false;

 private:
  Status Record(const std::string& what, const void* p, int64_t count, CommDType type) {
    calls.push_back(what + (type == CommDType::kF32 ? "/f32" : "/16"));
    pointers.push_back(p);
    counts.push_back(count);
    std::this_thread::sleep_for(delay);
    return fail ? Status::Unavailable("peer gone") : Status::Ok();
  }
  int rank_, world_;
};

TEST(MeteredCommunicator, ForwardsEveryCallUnchanged) {
  FakeCommunicator inner(1, 3);
  MeteredCommunicator m(&inner);
  EXPECT_EQ(m.rank(), 1);
  EXPECT_EQ(m.world_size(), 3);
  EXPECT_EQ(m.name(), "fake");
  std::vector<float> a(12), b(12);
  ASSERT_TRUE(m.AllReduceSum(a.data(), 12, CommDType::kBF16).ok());
  ASSERT_TRUE(m.ReduceScatterSum(a.data(), b.data(), 4, CommDType::kF32).ok());
  ASSERT_TRUE(m.AllGather(b.data(), a.data(), 4, CommDType::kF16).ok());
  ASSERT_TRUE(m.Broadcast(a.data(), 48, 2).ok());
  ASSERT_TRUE(m.Barrier().ok());
  EXPECT_EQ(inner.calls, (std::vector<std::string>{"allreduce/16", "reducescatter/f32", "allgather/16",
                                                    "broadcast2/f32", "barrier/f32"}));
  EXPECT_EQ(inner.pointers[0], a.data());
  EXPECT_EQ(inner.pointers[1], a.data());
  EXPECT_EQ(inner.pointers[2], b.data());
  EXPECT_EQ(inner.counts, (std::vector<int64_t>{12, 4, 4, 48, 0}));
  EXPECT_EQ(m.stats().calls, 5);
}

TEST(MeteredCommunicator, BytesFollowTheRingConvention) {
  const int64_t n = 1000003;  // not divisible by 2, 3 or 4
  for (int world : {1, 2, 3, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      FakeCommunicator inner(rank, world);
      MeteredCommunicator m(&inner);
      std::vector<float> x(1);
      ASSERT_TRUE(m.AllReduceSum(x.data(), n, CommDType::kF32).ok());
      const int64_t all_reduce = m.stats().bytes_sent;
      // 2 (W-1)/W x 4n bytes, to within one byte of integer rounding.
      EXPECT_NEAR(static_cast<double>(all_reduce), 2.0 * (world - 1) / world * 4.0 * n, 2.0) << world;
      ASSERT_TRUE(m.AllReduceSum(x.data(), n, CommDType::kBF16).ok());
      EXPECT_NEAR(static_cast<double>(m.stats().bytes_sent - all_reduce), 2.0 * (world - 1) / world * 2.0 * n, 2.0);
      const int64_t before_rs = m.stats().bytes_sent;
      // Reduce-scatter and all-gather of `count` per rank: (W-1) x count elements each.
      ASSERT_TRUE(m.ReduceScatterSum(x.data(), x.data(), n, CommDType::kF32).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_rs, static_cast<int64_t>(world - 1) * n * 4);
      // In place with a count per rank (unequal, one empty): every range but this rank's.
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int r = 0; r < world; ++r) {
        counts.push_back(r == 1 ? 0 : 1000 * (r + 1) + 7);
        total += counts.back();
      }
      const int64_t before_rsv = m.stats().bytes_sent;
      ASSERT_TRUE(m.ReduceScatterSumInPlace(x.data(), counts, CommDType::kF32).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_rsv,
                world > 1 ? (total - counts[static_cast<size_t>(rank)]) * 4 : 0)
          << world << " " << rank;
      const int64_t before_rsv16 = m.stats().bytes_sent;
      ASSERT_TRUE(m.ReduceScatterSumInPlace(x.data(), counts, CommDType::kBF16).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_rsv16,
                world > 1 ? (total - counts[static_cast<size_t>(rank)]) * 2 : 0);
      const int64_t rs_bytes = m.stats().bytes_sent - before_rs;
      EXPECT_EQ(m.stats().bytes_by_op[static_cast<int>(CommOp::kReduceScatter)], rs_bytes);
      const int64_t before_ag = m.stats().bytes_sent;
      ASSERT_TRUE(m.AllGather(x.data(), x.data(), n, CommDType::kF16).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_ag, static_cast<int64_t>(world - 1) * n * 2);
      // In place with a count per rank: every range but the next rank's.
      const int64_t before_agv = m.stats().bytes_sent;
      ASSERT_TRUE(m.AllGatherInPlace(x.data(), counts, CommDType::kF32).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_agv,
                world > 1 ? (total - counts[static_cast<size_t>((rank + 1) % world)]) * 4 : 0)
          << world << " " << rank;
      const int64_t before_bc = m.stats().bytes_sent;
      ASSERT_TRUE(m.Broadcast(x.data(), 4096, 0).ok());
      EXPECT_EQ(m.stats().bytes_sent - before_bc, world > 1 && rank == 0 ? 4096 : 0) << world << " " << rank;
      const int64_t before_barrier = m.stats().bytes_sent;
      ASSERT_TRUE(m.Barrier().ok());
      EXPECT_EQ(m.stats().bytes_sent, before_barrier);
      // The bytes by collective add up to the total.
      const CommStats& st = m.stats();
      EXPECT_EQ(st.bytes_by_op[static_cast<int>(CommOp::kAllReduce)], before_rs);
      EXPECT_EQ(st.bytes_by_op[static_cast<int>(CommOp::kAllGather)], before_bc - before_ag);
      EXPECT_EQ(st.bytes_by_op[static_cast<int>(CommOp::kBroadcast)], before_barrier - before_bc);
      int64_t sum = 0;
      for (int64_t b : st.bytes_by_op) sum += b;
      EXPECT_EQ(sum, st.bytes_sent);
    }
  }
}

TEST(MeteredCommunicator, CountsTheTimeInsideCallsAndPassesErrorsThrough) {
  FakeCommunicator inner(0, 2);
  inner.delay = std::chrono::milliseconds(30);
  MeteredCommunicator m(&inner);
  std::vector<float> x(4);
  ASSERT_TRUE(m.AllReduceSum(x.data(), 4, CommDType::kF32).ok());
  ASSERT_TRUE(m.Barrier().ok());
  EXPECT_GE(m.stats().seconds, 0.060);
  EXPECT_LT(m.stats().seconds, 5.0);
  inner.fail = true;
  const Status s = m.AllReduceSum(x.data(), 4, CommDType::kF32);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_EQ(s.message(), "peer gone");
  EXPECT_EQ(m.stats().calls, 3);  // the failed call's time was spent too
  EXPECT_GE(m.stats().seconds, 0.090);
}

}  // namespace
}  // namespace traind::engine
