// OverlappedAllReduce: the bucket plan (whole blocks, contiguous, >= bucket_bytes, backward
// order), that every gradient element is reduced exactly once whatever the plan, that buckets run
// while the caller goes on (the time hidden), that an error stops the rest, that a bucket waits for
// its backend marker, and ZeRO-1's reduce-scatter counts.
#include "train/overlapped_allreduce.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace traind::engine {
namespace {

using Range = OverlappedAllReduce::Range;

// A world of two ranks holding the same gradients: the sum doubles every element.
class DoublingCommunicator : public Communicator {
 public:
  explicit DoublingCommunicator(const float* base) : base_(base) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string name() const override { return "doubling"; }
  Status AllReduceSum(void* data, int64_t count, CommDType type) override {
    EXPECT_EQ(type, CommDType::kF32);
    auto* f = static_cast<float*>(data);
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back({f - base_, f - base_ + count});
      threads.push_back(std::this_thread::get_id());
      if (fail_from >= 0 && static_cast<int64_t>(calls.size()) > fail_from) {
        return Status::Unavailable("rank 1 went away");
      }
    }
    for (int64_t i = 0; i < count; ++i) f[i] *= 2.0f;
    std::this_thread::sleep_for(delay);
    return Status::Ok();
  }
  Status ReduceScatterSum(const void*, void*, int64_t, CommDType) override { return Status::Internal("unused"); }
  // Records the call (its start and counts) and doubles this rank's range only (the others keep
  // what they held: the contract leaves them unspecified).
  Status ReduceScatterSumInPlace(void* data, const std::vector<int64_t>& counts,
                                 CommDType type) override {
    EXPECT_EQ(type, CommDType::kF32);
    EXPECT_EQ(counts.size(), 2u);
    auto* f = static_cast<float*>(data);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back({f - base_, f - base_ + total});
      scatter_counts.push_back(counts);
      threads.push_back(std::this_thread::get_id());
      if (fail_from >= 0 && static_cast<int64_t>(calls.size()) > fail_from) {
        return Status::Unavailable("rank 1 went away");
      }
    }
    for (int64_t i = 0; i < counts[0]; ++i) f[i] *= 2.0f;  // rank 0's range comes first
    std::this_thread::sleep_for(delay);
    return Status::Ok();
  }
  Status AllGather(const void*, void*, int64_t, CommDType) override { return Status::Internal("unused"); }
  Status AllGatherInPlace(void*, const std::vector<int64_t>&, CommDType) override {
    return Status::Internal("unused");
  }
  Status Broadcast(void*, size_t, int) override { return Status::Internal("unused"); }
  Status Barrier() override { return Status::Internal("unused"); }

  std::mutex mu;
  std::vector<Range> calls;
  std::vector<std::vector<int64_t>> scatter_counts;  // ReduceScatterSumInPlace's, per call
  std::vector<std::thread::id> threads;
  std::chrono::milliseconds delay{0};
  int64_t fail_from = -1;  // >= 0: calls after this many fail

 private:
  const float* base_;
};

ParamInfo P(const std::string& name, int64_t offset, int64_t numel) {
  ParamInfo p;
  p.hf_name = name;
  p.offset = offset;
  p.numel = numel;
  p.shape = {numel};
  return p;
}

// A 3-block GPT-2-like layout: embeddings first, the final norm last. 610 elements.
std::vector<ParamInfo> Layout() {
  return {P("transformer.wte.weight", 0, 100),         P("transformer.wpe.weight", 100, 50),
          P("transformer.h.0.attn.c_attn.weight", 150, 100), P("transformer.h.0.mlp.c_fc.weight", 250, 50),
          P("transformer.h.1.attn.c_attn.weight", 300, 150), P("transformer.h.2.attn.c_attn.weight", 450, 100),
          P("transformer.h.2.ln_2.weight", 550, 50),   P("transformer.ln_f.weight", 600, 10)};
}

TEST(BlockOfParam, ReadsTheBlockIndexOfEachFamily) {
  EXPECT_EQ(BlockOfParam("transformer.h.11.mlp.c_proj.weight"), 11);
  EXPECT_EQ(BlockOfParam("model.layers.3.self_attn.q_proj.weight"), 3);
  EXPECT_EQ(BlockOfParam("bert.encoder.layer.23.output.dense.weight"), 23);
  EXPECT_EQ(BlockOfParam("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"), 0);
  EXPECT_EQ(BlockOfParam("transformer.wte.weight"), -1);
  EXPECT_EQ(BlockOfParam("transformer.ln_f.weight"), -1);
  EXPECT_EQ(BlockOfParam("transformer.h.x.weight"), -1);
  EXPECT_EQ(BlockOfParam("model.layers.7"), -1);  // no component after the index
}

TEST(OverlappedAllReduce, PlansWholeBlocksInBackwardOrder) {
  std::vector<float> g(610);
  DoublingCommunicator comm(g.data());
  {
    OverlappedAllReduce one_per_block(&comm, Layout(), 610, 4);
    EXPECT_EQ(one_per_block.buckets(), (std::vector<Range>{{450, 600}, {300, 450}, {150, 300}}));
    EXPECT_EQ(one_per_block.rest(), (std::vector<Range>{{0, 150}, {600, 610}}));
  }
  {
    // 1000 bytes: block 2 (600 bytes) is too small alone and takes block 1 with it.
    OverlappedAllReduce merged(&comm, Layout(), 610, 1000);
    EXPECT_EQ(merged.buckets(), (std::vector<Range>{{300, 600}, {150, 300}}));
  }
  {
    OverlappedAllReduce all(&comm, Layout(), 610, int64_t{1} << 30);
    EXPECT_EQ(all.buckets(), (std::vector<Range>{{150, 600}}));
    EXPECT_EQ(all.rest(), (std::vector<Range>{{0, 150}, {600, 610}}));
  }
  {
    // Block 1 interleaved with a parameter of no block: not one range, left to the rest; the
    // buckets do not grow across it.
    std::vector<ParamInfo> odd = Layout();
    odd[4] = P("transformer.h.1.attn.c_attn.weight", 300, 70);
    odd.push_back(P("transformer.extra.weight", 370, 10));
    odd.push_back(P("transformer.h.1.mlp.weight", 380, 70));
    OverlappedAllReduce split(&comm, odd, 610, int64_t{1} << 30);
    EXPECT_EQ(split.buckets(), (std::vector<Range>{{450, 600}, {150, 300}}));
    EXPECT_EQ(split.rest(), (std::vector<Range>{{0, 150}, {300, 450}, {600, 610}}));
  }
  {
    // No blocks at all (names the parser does not know): everything is the rest, one range.
    OverlappedAllReduce none(&comm, {P("w", 0, 610)}, 610, 4);
    EXPECT_TRUE(none.buckets().empty());
    EXPECT_EQ(none.rest(), (std::vector<Range>{{0, 610}}));
  }
}

TEST(OverlappedAllReduce, ReducesEveryElementOnceWhileTheCallerComputes) {
  std::vector<float> g(610);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i) + 0.5f;
  DoublingCommunicator comm(g.data());
  comm.delay = std::chrono::milliseconds(20);
  OverlappedAllReduce o(&comm, Layout(), 610, 4);
  for (int step = 0; step < 2; ++step) {
    comm.calls.clear();
    o.Arm(g.data());
    for (int64_t layer = 2; layer >= 0; --layer) {
      o.BlockDone(layer);
      std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the block below computes
    }
    double comm_seconds = 0, waited = 0;
    ASSERT_TRUE(o.Finish(&comm_seconds, &waited).ok());
    const double scale = step == 0 ? 2.0 : 4.0;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], static_cast<float>(scale * (static_cast<double>(i) + 0.5))) << "element " << i;
    }
    EXPECT_EQ(comm.calls, (std::vector<Range>{{450, 600}, {300, 450}, {150, 300}, {0, 150}, {600, 610}}));
    for (std::thread::id t : comm.threads) EXPECT_NE(t, std::this_thread::get_id());
    // 5 calls of 20 ms; the 3 buckets ran during the 180 ms of "compute" (at least half of their
    // 60 ms hidden, leaving room for a loaded machine's scheduling), the rest was waited for.
    EXPECT_GE(comm_seconds, 0.100);
    EXPECT_GE(waited, 0.040);
    EXPECT_LT(waited, comm_seconds - 0.030) << "the buckets should have been hidden";
  }
}

// ZeRO-1: the same buckets in the same order, each reduce-scattered with its intersection with
// each rank's range as the counts (zero where a bucket misses a rank); this rank (0) receives its
// whole range reduced once, the other ranks' ranges are left to them.
TEST(OverlappedAllReduce, ReduceScattersTheBucketsOverTheShards) {
  std::vector<float> g(610);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i) + 0.5f;
  DoublingCommunicator comm(g.data());
  const std::vector<Range> shards = {{0, 305}, {305, 610}};  // cut inside block 1's bucket
  EXPECT_EQ(OverlappedAllReduce::ShardCounts({300, 450}, shards), (std::vector<int64_t>{5, 145}));
  EXPECT_EQ(OverlappedAllReduce::ShardCounts({450, 600}, shards), (std::vector<int64_t>{0, 150}));
  EXPECT_EQ(OverlappedAllReduce::ShardCounts({0, 150}, shards), (std::vector<int64_t>{150, 0}));
  OverlappedAllReduce o(&comm, Layout(), 610, 4, shards);
  o.Arm(g.data());
  for (int64_t layer = 2; layer >= 0; --layer) o.BlockDone(layer);
  double comm_seconds = 0, waited = 0;
  ASSERT_TRUE(o.Finish(&comm_seconds, &waited).ok());
  EXPECT_EQ(comm.calls, (std::vector<Range>{{450, 600}, {300, 450}, {150, 300}, {0, 150}, {600, 610}}));
  EXPECT_EQ(comm.scatter_counts, (std::vector<std::vector<int64_t>>{
                                     {0, 150}, {5, 145}, {150, 0}, {150, 0}, {0, 10}}));
  for (size_t i = 0; i < g.size(); ++i) {
    const float want = static_cast<float>(i) + 0.5f;
    ASSERT_EQ(g[i], i < 305 ? 2.0f * want : want) << "element " << i;
  }
  // Without buckets: one piece, the ranges' sizes.
  comm.scatter_counts.clear();
  ASSERT_TRUE(OverlappedAllReduce::ReducePiece(&comm, g.data(), {0, 610}, shards).ok());
  EXPECT_EQ(comm.scatter_counts, (std::vector<std::vector<int64_t>>{{305, 305}}));
}

// An asynchronous backend's markers: RecordMarker notes the marker; WaitMarker blocks until the
// test says the device has reached it (what a CUDA event's synchronize does), and notes the
// waiting thread. NewMarker can be made to fail.
class MarkerBackend : public Backend {
 public:
  std::string name() const override { return "markers"; }
  void* Alloc(size_t) override { return nullptr; }
  void Free(void*) override {}
  void CopyHostToDevice(void*, const void*, size_t) override {}
  void CopyDeviceToHost(void*, const void*, size_t) override {}
  void CopyDeviceToDevice(void*, const void*, size_t) override {}
  void Memset0(void*, size_t) override {}
  void Synchronize() override {}
  Result<int> NewMarker() override {
    if (fail_new) return Status::ResourceExhausted("no events left");
    return next++;
  }
  Status RecordMarker(int marker) override {
    std::lock_guard<std::mutex> lock(mu);
    recorded.push_back(marker);
    return Status::Ok();
  }
  Status WaitMarker(int marker) override {
    std::unique_lock<std::mutex> lock(mu);
    waited.push_back(marker);
    wait_threads.push_back(std::this_thread::get_id());
    cv.wait(lock, [&] { return reached.count(marker) != 0; });
    return Status::Ok();
  }
  void Reach(int marker) {
    {
      std::lock_guard<std::mutex> lock(mu);
      reached.insert(marker);
    }
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> recorded, waited;
  std::vector<std::thread::id> wait_threads;
  std::set<int> reached;
  int next = 10;
  bool fail_new = false;
};

// With markers, a bucket's collective waits until the device has reached the marker recorded
// after the bucket's backward: nothing is reduced before, everything after, on the
// communication thread; the rest (after the step's Synchronize) carries no marker.
TEST(OverlappedAllReduce, ABucketWaitsForItsMarker) {
  std::vector<float> g(610, 1.0f);
  DoublingCommunicator comm(g.data());
  MarkerBackend backend;
  OverlappedAllReduce o(&comm, Layout(), 610, 4);
  ASSERT_TRUE(o.UseMarkers(&backend).ok());  // three buckets: markers 10, 11, 12
  o.Arm(g.data());
  o.BlockDone(2);  // bucket 0, marker 10
  o.BlockDone(1);  // bucket 1, marker 11
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> lock(comm.mu);
    EXPECT_TRUE(comm.calls.empty()) << "a bucket was reduced before its backward finished";
  }
  EXPECT_EQ(g[500], 1.0f);
  backend.Reach(10);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(comm.mu);
      if (!comm.calls.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> lock(comm.mu);
    EXPECT_EQ(comm.calls, (std::vector<Range>{{450, 600}}));  // bucket 1 still waits
  }
  backend.Reach(11);
  backend.Reach(12);
  o.BlockDone(0);  // bucket 2, marker 12 (already reached)
  double comm_seconds = 0, waited = 0;
  ASSERT_TRUE(o.Finish(&comm_seconds, &waited).ok());
  EXPECT_EQ(comm.calls, (std::vector<Range>{{450, 600}, {300, 450}, {150, 300}, {0, 150}, {600, 610}}));
  EXPECT_EQ(backend.recorded, (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(backend.waited, (std::vector<int>{10, 11, 12}));
  for (std::thread::id t : backend.wait_threads) EXPECT_NE(t, std::this_thread::get_id());
  for (float v : g) ASSERT_EQ(v, 2.0f);
  // A backend that cannot make markers: the error, before any step.
  MarkerBackend broken;
  broken.fail_new = true;
  OverlappedAllReduce p(&comm, Layout(), 610, 4);
  EXPECT_EQ(p.UseMarkers(&broken).code(), Status::Code::kResourceExhausted);
}

TEST(OverlappedAllReduce, AnErrorIsReturnedAndTheRestIsNotIssued) {
  std::vector<float> g(610, 1.0f);
  DoublingCommunicator comm(g.data());
  comm.fail_from = 1;  // the second call fails
  OverlappedAllReduce o(&comm, Layout(), 610, 4);
  o.Arm(g.data());
  for (int64_t layer = 2; layer >= 0; --layer) o.BlockDone(layer);
  double comm_seconds = 0, waited = 0;
  const Status s = o.Finish(&comm_seconds, &waited);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable);
  EXPECT_EQ(s.message(), "rank 1 went away");
  EXPECT_EQ(comm.calls.size(), 2u);  // the failed one, nothing after it
  // Unknown layers are ignored.
  o.BlockDone(-1);
  o.BlockDone(7);
}

}  // namespace
}  // namespace traind::engine
