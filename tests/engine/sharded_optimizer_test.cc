// ZeRO-1's ShardedOptimizer with threads of one process as ranks (an in-process communicator):
// the ranges (contiguous; on 8-bit blocks; whole tensors for Adafactor), W ranks stepping their
// shards end bit-identical to one unsharded optimizer for every training.optim, their gathered
// state is the unsharded optimizer's file, a full file loads into the shards and continues the
// same run, and the errors (a bad tensor, a world too large for the buffer).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/arena.h"
#include "optim/offloaded_optimizer.h"
#include "optim/optimizer.h"
#include "optim/quant8.h"
#include "optim/sharded_optimizer.h"
#include "optim_test_util.h"
#include "rss_test_util.h"
#include "traind/engine/optimizer_state_store.h"

namespace traind::engine {
namespace {

// The ranks of one process: each collective deposits its buffer, waits for every rank, reads
// the others', and waits again before anyone may reuse a buffer.
class ThreadWorld {
 public:
  explicit ThreadWorld(int world) : world_(world), slots_(static_cast<size_t>(world)) {}
  int world() const { return world_; }
  void Deposit(int rank, const void* p) { slots_[static_cast<size_t>(rank)] = p; }
  const void* Slot(int rank) const { return slots_[static_cast<size_t>(rank)]; }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  const int world_;
  std::vector<const void*> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

class ThreadComm final : public Communicator {
 public:
  ThreadComm(ThreadWorld* world, int rank) : w_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return w_->world(); }
  std::string name() const override { return "threads"; }
  Status AllReduceSum(void* data, int64_t count, CommDType type) override {
    if (type != CommDType::kF32) return Status::Internal("fp32 only");
    std::vector<float> sum(static_cast<size_t>(count), 0.0f);
    w_->Deposit(rank_, data);
    w_->Wait();
    for (int r = 0; r < w_->world(); ++r) {
      const auto* f = static_cast<const float*>(w_->Slot(r));
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += f[i];
    }
    w_->Wait();
    std::memcpy(data, sum.data(), sum.size() * 4);
    return Status::Ok();
  }
  Status ReduceScatterSum(const void*, void*, int64_t, CommDType) override {
    return Status::Internal("unused");
  }
  Status ReduceScatterSumInPlace(void*, const std::vector<int64_t>&, CommDType) override {
    return Status::Internal("unused");
  }
  // Each rank copies every other rank's range from that rank's buffer.
  Status AllGatherInPlace(void* data, const std::vector<int64_t>& counts,
                          CommDType type) override {
    if (type != CommDType::kF32) return Status::Internal("fp32 only");
    w_->Deposit(rank_, data);
    w_->Wait();
    int64_t at = 0;
    for (int r = 0; r < w_->world(); ++r) {
      const int64_t n = counts[static_cast<size_t>(r)];
      if (r != rank_) {
        std::memcpy(static_cast<float*>(data) + at, static_cast<const float*>(w_->Slot(r)) + at,
                    static_cast<size_t>(n) * 4);
      }
      at += n;
    }
    w_->Wait();
    return Status::Ok();
  }
  Status AllGather(const void* in, void* out, int64_t count, CommDType type) override {
    if (type != CommDType::kF32) return Status::Internal("fp32 lanes only");
    w_->Deposit(rank_, in);
    w_->Wait();
    for (int r = 0; r < w_->world(); ++r) {
      std::memcpy(static_cast<char*>(out) + static_cast<size_t>(r) * static_cast<size_t>(count) * 4,
                  w_->Slot(r), static_cast<size_t>(count) * 4);
    }
    w_->Wait();
    return Status::Ok();
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    w_->Deposit(rank_, data);
    w_->Wait();
    if (rank_ != root) std::memcpy(data, w_->Slot(root), bytes);
    w_->Wait();
    return Status::Ok();
  }
  Status Barrier() override {
    w_->Wait();
    return Status::Ok();
  }

 private:
  ThreadWorld* w_;
  int rank_;
};

// Shapes with 8-bit tensors (>= 4096 elements: 5120 and 6144, not block multiples of the cuts)
// between fp32 ones, vectors and matrices.
std::vector<ParamInfo> Layout(int64_t* n) {
  return testing::MakeParams({{64, 80}, {100}, {96, 64}, {50}, {8, 30}, {300}}, n);
}

TrainingSpec Optim(const std::string& name) {
  TrainingSpec t;
  t.optim = name;
  t.weight_decay = 0.1;
  if (name == "sgd") t.optim_args.momentum = 0.9;
  if (name == "adafactor") t.optim_args.beta1 = 0.9;  // every state kind
  return t;
}

TEST(ZeroOneShards, ContiguousOnBlocksForEightBitWholeTensorsForAdafactor) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  int cuts_in_8bit = 0;  // the 8-bit rule was exercised
  for (const char* optim : {"adamw", "sgd", "adamw_8bit", "adafactor"}) {
    for (int world : {2, 3, 4}) {
      const auto ranges = ZeroOneShards(Optim(optim), params, n, world);
      ASSERT_EQ(ranges.size(), static_cast<size_t>(world));
      EXPECT_EQ(ranges.front().first, 0);
      EXPECT_EQ(ranges.back().second, n);
      for (int r = 0; r < world; ++r) {
        const auto [b, e] = ranges[static_cast<size_t>(r)];
        EXPECT_LT(b, e) << optim << " world " << world << " rank " << r;
        if (r > 0) {
          EXPECT_EQ(b, ranges[static_cast<size_t>(r) - 1].second);
        }
        if (std::string(optim) == "adamw" || std::string(optim) == "sgd") {
          EXPECT_EQ(b, n * r / world);
        }
        for (const ParamInfo& p : params) {
          if (b <= p.offset || b >= p.offset + p.numel) continue;  // the cut is inside p
          if (std::string(optim) == "adafactor") {
            ADD_FAILURE() << "adafactor cut inside " << p.hf_name;
          }
          if (std::string(optim) == "adamw_8bit" && p.numel >= 4096) {
            EXPECT_EQ((b - p.offset) % kQuant8Block, 0) << p.hf_name << " world " << world;
            ++cuts_in_8bit;
          }
        }
      }
    }
  }
  EXPECT_GT(cuts_in_8bit, 0);
}

// training.offload's store contract in its simplest form (the engine's tests do not link
// offload/): committed and pending maps, swapped on Commit.
class MapStore final : public OptimizerStateStore {
 public:
  void Prefetch(const StateKey&) override {}
  Status Read(const StateKey& key, void* dst, size_t bytes) override {
    if (corrupt_) return Status::DataLoss("map store: chunk " + key.ToString() + " is damaged");
    auto it = committed_.find(key);
    if (it == committed_.end() || it->second.size() != bytes) {
      return Status::NotFound("map store: no chunk " + key.ToString() + " of that size");
    }
    std::memcpy(dst, it->second.data(), bytes);
    return Status::Ok();
  }
  Status Write(const StateKey& key, const void* src, size_t bytes) override {
    const char* p = static_cast<const char*>(src);
    pending_[key].assign(p, p + bytes);
    return Status::Ok();
  }
  Status Commit(int64_t step) override {
    for (auto& [key, data] : pending_) committed_[key] = std::move(data);
    pending_.clear();
    step_ = step;
    return Status::Ok();
  }
  int64_t CommittedStep() const override { return step_; }
  Result<std::vector<StateChunkInfo>> List() const override {
    std::vector<StateChunkInfo> out;
    for (const auto& [key, data] : committed_) out.push_back({key, data.size()});
    return out;
  }
  OptimizerStateStoreStats Stats() const override {
    OptimizerStateStoreStats s;
    for (const auto& [key, data] : committed_) s.store_bytes += data.size();
    return s;
  }
  std::string Describe() const override { return "map"; }
  // Every Read from now on fails with DATA_LOSS (a store damaged on disk).
  void Corrupt() { corrupt_ = true; }

 private:
  bool corrupt_ = false;
  std::map<StateKey, std::string> committed_, pending_;
  int64_t step_ = -1;
};

// W ranks (threads) run `steps` steps of their shards from the same parameters and gradients;
// returns every rank's parameters and rank 0's gathered state file. `load`: a state file each
// rank loads first (its slice). `offload`: each rank's shard in its own MapStore (store_bytes:
// what each holds at the end). arena_peak: the most each rank's arena held (the optimizer's only).
struct WorldResult {
  std::vector<std::vector<float>> params;
  SafetensorsFile state;
  Status status;
  std::vector<int64_t> store_bytes;
  std::vector<int64_t> shard_state_bytes;
  std::vector<int64_t> arena_peak;
};
WorldResult RunWorld(const TrainingSpec& t, int world, const std::vector<ParamInfo>& params,
                     int64_t n, const std::vector<float>& init,
                     const std::vector<std::vector<float>>& grads, const SafetensorsFile* load,
                     bool offload = false, const std::string& load_path = "") {
  WorldResult out;
  out.params.assign(static_cast<size_t>(world), init);
  out.store_bytes.assign(static_cast<size_t>(world), 0);
  out.shard_state_bytes.assign(static_cast<size_t>(world), 0);
  out.arena_peak.assign(static_cast<size_t>(world), 0);
  std::vector<Status> status(static_cast<size_t>(world));
  ThreadWorld w(world);
  std::atomic<bool> load_failed{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(&w, r);
      std::unique_ptr<Backend> backend = MakeCpuBackend(1);
      DeviceArena arena(backend.get(), 0);
      MapStore store;
      auto opt = ShardedOptimizer::Create(t, params, n, &comm, &arena, offload ? &store : nullptr);
      struct Measure {  // what the rank's store and arena held once the rank is done
        MapStore* store;
        int64_t* bytes;
        const DeviceArena* arena;
        int64_t* peak;
        ~Measure() {
          *bytes = static_cast<int64_t>(store->Stats().store_bytes);
          *peak = arena->peak_bytes();
        }
      } measure{&store, &out.store_bytes[static_cast<size_t>(r)], &arena,
                &out.arena_peak[static_cast<size_t>(r)]};
      if (opt.ok()) out.shard_state_bytes[static_cast<size_t>(r)] = (*opt)->shard_state_bytes();
      Status& st = status[static_cast<size_t>(r)];
      if (!opt.ok()) {
        st = opt.status();
        return;  // every rank fails alike at Create (no collective there)
      }
      if (load != nullptr || !load_path.empty()) {  // every rank learns whether one failed
        // before any collective. A path: the file read by ranges (ReadState), else LoadState.
        st = load_path.empty() ? (*opt)->LoadState(*load) : (*opt)->ReadState(load_path);
        if (!st.ok()) load_failed = true;
        w.Wait();
        if (load_failed) return;
      }
      std::vector<float>& p = out.params[static_cast<size_t>(r)];
      for (size_t s = 0; s < grads.size() && st.ok(); ++s) {
        (*opt)->Step(p.data(), grads[s].data(), 1e-2 * (1.0 + static_cast<double>(s)), 0.5f);
        st = (*opt)->GatherParams(p.data());
      }
      if (!st.ok()) return;
      if (r == 0) {
        out.state = (*opt)->SaveState();
        st = (*opt)->status();
      } else {
        st = (*opt)->ContributeState();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const Status& s : status) {
    if (!s.ok() && out.status.ok()) out.status = s;
  }
  return out;
}

// One unsharded optimizer over the same steps (after loading `load`, if given).
std::vector<float> RunAlone(const TrainingSpec& t, const std::vector<ParamInfo>& params, int64_t n,
                            const std::vector<float>& init,
                            const std::vector<std::vector<float>>& grads,
                            const SafetensorsFile* load, SafetensorsFile* state) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  auto opt = MakeOptimizer(t, params, n, &arena);
  EXPECT_TRUE(opt.ok()) << opt.status().ToString();
  if (load != nullptr) {
    EXPECT_TRUE((*opt)->LoadState(*load).ok());
  }
  std::vector<float> p = init;
  for (size_t s = 0; s < grads.size(); ++s) {
    (*opt)->Step(p.data(), grads[s].data(), 1e-2 * (1.0 + static_cast<double>(s)), 0.5f);
  }
  *state = (*opt)->SaveState();
  return p;
}

void ExpectSameFile(const SafetensorsFile& a, const SafetensorsFile& b, const std::string& what) {
  EXPECT_EQ(a.metadata, b.metadata) << what;
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (const auto& [name, t] : a.tensors) {
    ASSERT_EQ(b.tensors.count(name), 1u) << what << ": " << name;
    const HostTensor& u = b.tensors.at(name);
    EXPECT_EQ(t.dtype, u.dtype) << what << ": " << name;
    EXPECT_EQ(t.shape, u.shape) << what << ": " << name;
    EXPECT_TRUE(t.data == u.data) << what << ": " << name;
  }
}

// The unsharded optimizer's state after `alone` loads into `world` shards (offloaded or not) and
// continues for the steps of `more` exactly as the unsharded optimizer does: from the state in
// memory (LoadState), and from its file on disk, each rank reading only its slices (ReadState),
// which leaves no file beside it.
void ExpectContinues(const TrainingSpec& t, int world, const std::vector<ParamInfo>& params,
                     int64_t n, const std::vector<float>& alone,
                     const std::vector<std::vector<float>>& more, const SafetensorsFile& alone_state,
                     bool offload, const std::string& what) {
  SafetensorsFile alone_more_state;
  const std::vector<float> alone_more =
      RunAlone(t, params, n, alone, more, &alone_state, &alone_more_state);
  WorldResult cont = RunWorld(t, world, params, n, alone, more, &alone_state, offload);
  ASSERT_TRUE(cont.status.ok()) << what << ": " << cont.status.ToString();
  EXPECT_TRUE(cont.params[0] == alone_more) << what << ": continued";
  ExpectSameFile(alone_more_state, cont.state, what + ": continued state");
  const std::string dir = testing::MakeTempDir("zero1_read_state");
  const std::string file = dir + "/optimizer.safetensors";
  ASSERT_TRUE(WriteSafetensors(file, alone_state).ok());
  WorldResult read = RunWorld(t, world, params, n, alone, more, nullptr, offload, file);
  ASSERT_TRUE(read.status.ok()) << what << ": " << read.status.ToString();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(read.params[static_cast<size_t>(r)] == alone_more) << what << ": read, rank " << r;
  }
  ExpectSameFile(alone_more_state, read.state, what + ": continued state after ReadState");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()), 1)
      << what << ": ReadState left a file beside the state";
}

TEST(ShardedOptimizer, ShardsStepSaveAndLoadAsOneOptimizer) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  std::vector<std::vector<float>> grads, more;
  for (uint32_t s = 0; s < 3; ++s) grads.push_back(testing::RandomVector(n, 10 + s, 1.0f));
  for (uint32_t s = 0; s < 2; ++s) more.push_back(testing::RandomVector(n, 20 + s, 1.0f));
  for (const char* optim : {"adamw", "sgd", "adamw_8bit", "adafactor"}) {
    const TrainingSpec t = Optim(optim);
    SafetensorsFile alone_state;
    const std::vector<float> alone = RunAlone(t, params, n, init, grads, nullptr, &alone_state);
    for (int world : {2, 3}) {
      const std::string what = std::string(optim) + " world " + std::to_string(world);
      WorldResult res = RunWorld(t, world, params, n, init, grads, nullptr);
      ASSERT_TRUE(res.status.ok()) << what << ": " << res.status.ToString();
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(res.params[static_cast<size_t>(r)] == alone) << what << " rank " << r;
      }
      ExpectSameFile(alone_state, res.state, what + ": gathered state");
      // The unsharded file loads into the shards and continues as the unsharded optimizer does.
      ExpectContinues(t, world, params, n, alone, more, alone_state, /*offload=*/false, what);
    }
  }
}

// training.offload: each rank's inner optimizer is the offloaded one over its slices, its state in
// the rank's own store. The same bits as one in-memory optimizer, the same gathered file, the
// same continuation from a full file; each store holds its shard only; the device window is the
// planned one (ZeroOneOffloadPlanBytes). 8-bit AdamW: the cuts leave slices of its 8-bit tensors
// smaller than min_8bit_size (world 2: 1536 of the 6144-element tensor; world 3: 512 of the
// 5120-element one), which the size rule would turn fp32: the groups keep their tensor's 8-bit
// codes, so the file (U8 codes, absmax blocks) and the weights are the unsharded optimizer's.
TEST(ShardedOptimizer, OffloadedShardsStepSaveAndLoadAsOneOptimizer) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  std::vector<std::vector<float>> grads, more;
  for (uint32_t s = 0; s < 3; ++s) grads.push_back(testing::RandomVector(n, 10 + s, 1.0f));
  for (uint32_t s = 0; s < 2; ++s) more.push_back(testing::RandomVector(n, 20 + s, 1.0f));
  int small_8bit_slices = 0;  // slices of 8-bit tensors under min_8bit_size that were checked
  for (const char* optim : {"adamw", "sgd", "adafactor", "adamw_8bit"}) {
    TrainingSpec t = Optim(optim);
    t.offload = "cpu";
    SafetensorsFile alone_state;
    const std::vector<float> alone = RunAlone(t, params, n, init, grads, nullptr, &alone_state);
    for (int world : {2, 3}) {
      const std::string what = std::string(optim) + " offloaded, world " + std::to_string(world);
      WorldResult res = RunWorld(t, world, params, n, init, grads, nullptr, true);
      ASSERT_TRUE(res.status.ok()) << what << ": " << res.status.ToString();
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(res.params[static_cast<size_t>(r)] == alone) << what << " rank " << r;
        const int64_t shard = res.shard_state_bytes[static_cast<size_t>(r)];
        const int64_t held = res.store_bytes[static_cast<size_t>(r)];
        EXPECT_GT(shard, 0) << what;
        if (std::string(optim) == "adamw") {
          EXPECT_EQ(held, shard) << what << " rank " << r;  // raw m and v of the shard
        } else if (std::string(optim) == "adamw_8bit") {
          // The payloads: codes, absmax blocks and fp32 moments with their names; the two code
          // tables (2 KiB of the shard's plan) are the window's, not stored.
          EXPECT_GE(held, shard - 2 * 256 * 4) << what << " rank " << r;
          EXPECT_LE(held, shard - 2 * 256 * 4 + 4096) << what << " rank " << r;
        } else {  // the groups' payloads: the shard's tensors and their names and metadata
          EXPECT_GE(held, shard) << what << " rank " << r;
          EXPECT_LE(held, shard + 4096) << what << " rank " << r;
        }
      }
      // The device holds one window at a time, never more than planned for the largest rank.
      const int64_t window = ZeroOneOffloadPlanBytes(t, params, n, world).window;
      EXPECT_EQ(*std::max_element(res.arena_peak.begin(), res.arena_peak.end()), window) << what;
      EXPECT_LE(window, ZeroOneOffloadPlanBytes(t, params, n, world).state) << what;
      if (std::string(optim) == "adamw_8bit") {
        const auto ranges = ZeroOneShards(t, params, n, world);
        for (const ParamInfo& p : params) {
          if (p.numel < 4096) continue;  // an fp32-moment tensor
          for (const auto& [b, e] : ranges) {
            const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
            if (lo < hi && hi - lo < 4096) {
              ++small_8bit_slices;
              std::printf("[zero1] %s: %s (%lld elements) has a slice of %lld\n", what.c_str(),
                          p.hf_name.c_str(), static_cast<long long>(p.numel),
                          static_cast<long long>(hi - lo));
            }
          }
        }
        EXPECT_EQ(res.state.tensors.at("p0.exp_avg").dtype, "U8") << what;
        EXPECT_EQ(res.state.tensors.at("p2.exp_avg_sq").dtype, "U8") << what;
      }
      ExpectSameFile(alone_state, res.state, what + ": gathered state");
      ExpectContinues(t, world, params, n, alone, more, alone_state, /*offload=*/true, what);
    }
  }
  EXPECT_GE(small_8bit_slices, 2);  // world 2 and world 3 each cut one
}

// 8-bit AdamW offloaded with ZeRO-1 over many groups (a model of 24 8-bit matrices between fp32
// vectors: each rank's store holds several groups, the window one of them): the cuts fall inside
// 8-bit matrices, the groups holding those slices keep them 8-bit, the weights and the gathered
// state are the unsharded optimizer's, and the device peak is the planned window exactly.
TEST(ShardedOptimizer, OffloadedEightBitShardsOverManyGroups) {
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 24; ++i) {
    shapes.push_back({48 + 8 * (i % 5), 160});  // 7680 to 12800 elements: 8-bit
    shapes.push_back({160});                     // fp32 moments
  }
  int64_t n = 0;
  const std::vector<ParamInfo> params = testing::MakeParams(shapes, &n);
  const std::vector<float> init = testing::RandomVector(n, 3, 0.5f);
  std::vector<std::vector<float>> grads;
  for (uint32_t s = 0; s < 3; ++s) grads.push_back(testing::RandomVector(n, 30 + s, 1.0f));
  TrainingSpec t = Optim("adamw_8bit");
  t.offload = "cpu";
  SafetensorsFile alone_state;
  const std::vector<float> alone = RunAlone(t, params, n, init, grads, nullptr, &alone_state);
  for (int world : {2, 3, 5}) {
    const std::string what = "adamw_8bit offloaded, many groups, world " + std::to_string(world);
    int small = 0;  // slices of an 8-bit tensor under min_8bit_size
    for (const ParamInfo& p : params) {
      for (const auto& [b, e] : ZeroOneShards(t, params, n, world)) {
        const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
        if (p.numel >= 4096 && lo < hi && hi - lo < 4096) ++small;
      }
    }
    WorldResult res = RunWorld(t, world, params, n, init, grads, nullptr, true);
    ASSERT_TRUE(res.status.ok()) << what << ": " << res.status.ToString();
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(res.params[static_cast<size_t>(r)] == alone) << what << " rank " << r;
    }
    ExpectSameFile(alone_state, res.state, what + ": gathered state");
    const ZeroOneOffloadBytes plan = ZeroOneOffloadPlanBytes(t, params, n, world);
    const int64_t peak = *std::max_element(res.arena_peak.begin(), res.arena_peak.end());
    std::printf("[zero1] %s: %d small 8-bit slices; window %lld bytes planned, %lld peak; "
                "largest shard %lld\n",
                what.c_str(), small, static_cast<long long>(plan.window),
                static_cast<long long>(peak), static_cast<long long>(plan.state));
    EXPECT_GT(small, 0) << what;
    EXPECT_EQ(peak, plan.window) << what;
    EXPECT_LT(plan.window * 2, plan.state) << what << ": several groups per rank";
  }
  // A lone slice of 2816 elements of an 8-bit tensor (ZeRO-1 world 2's cut of a 4096-element
  // matrix): its window is 8-bit (2 bytes and an absmax per block, plus the code tables), planned
  // and allocated alike, not the size rule's fp32 (8 bytes per element).
  int64_t m = 0;
  const std::vector<ParamInfo> slice = testing::MakeParams({{2816}}, &m);
  const int64_t eight = 2 * 2816 + 2 * 4 * Quant8Blocks(2816) + 2 * 256 * 4;
  EXPECT_EQ(OffloadedOptimizerDeviceBytes(t, slice, m, {}, {true}), eight);
  EXPECT_EQ(OffloadedOptimizerDeviceBytes(t, slice, m), 8 * 2816);  // the size rule
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  MapStore store;
  auto opt = MakeOffloadedOptimizer(t, slice, m, &arena, &store, {}, {true});
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  std::vector<float> p = testing::RandomVector(m, 5, 0.5f);
  const std::vector<float> g = testing::RandomVector(m, 6, 1.0f);
  (*opt)->Step(p.data(), g.data(), 1e-2, 1.0f);
  ASSERT_TRUE((*opt)->status().ok()) << (*opt)->status().ToString();
  EXPECT_EQ(arena.peak_bytes(), eight);
  const SafetensorsFile state = (*opt)->SaveState();
  ASSERT_EQ(state.tensors.count("p0.exp_avg"), 1u);
  EXPECT_EQ(state.tensors.at("p0.exp_avg").dtype, "U8");
  // A choice per parameter, for 8-bit AdamW only.
  EXPECT_EQ(MakeOffloadedOptimizer(t, slice, m, &arena, &store, {}, {true, false}).status().code(),
            Status::Code::kInternal);
  EXPECT_EQ(MakeOffloadedOptimizer(Optim("sgd"), slice, m, &arena, &store, {}, {true})
                .status()
                .code(),
            Status::Code::kInternal);
}

// ZeRO-1 resume with training.offload from a 128 MiB AdamW state file: rank 0 of 2 (ReadState
// needs no collective) reads only its slices by ranges into a shard file the offloaded optimizer
// streams into its store, so the peak RSS grows by what its (in-memory) store keeps, its 64 MiB
// shard, and a bounded rest (the 4 MiB piece buffer, one store value); LoadState of the file read
// whole (the old resume) also holds the whole file and the rank's slices of it.
TEST(ShardedOptimizer, OffloadedReadStateRssGrowthIsTheStoreAndABoundedRest) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = testing::MakeParams({{4096, 4096}, {4096}}, &n);
  TrainingSpec t = Optim("adamw");
  const std::string dir = testing::MakeTempDir("zero1_read_rss");
  const std::string file = dir + "/optimizer.safetensors";
  {
    std::unique_ptr<Backend> backend = MakeCpuBackend(0);
    DeviceArena arena(backend.get(), 0);
    auto opt = MakeOptimizer(t, params, n, &arena);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    std::vector<float> p = testing::RandomVector(n, 1, 0.5f);
    const std::vector<float> g = testing::RandomVector(n, 2, 1.0f);
    (*opt)->Step(p.data(), g.data(), 1e-2, 1.0f);
    ASSERT_TRUE((*opt)->WriteState(file).ok());
  }
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(file));
  ASSERT_GT(file_bytes, int64_t{120} << 20);
  t.offload = "cpu";
  int64_t growth[2] = {0, 0}, stored[2] = {0, 0};
  for (int old_path = 0; old_path < 2; ++old_path) {
    ThreadWorld w(2);
    ThreadComm comm(&w, 0);
    std::unique_ptr<Backend> backend = MakeCpuBackend(0);
    DeviceArena arena(backend.get(), 0);
    MapStore store;
    auto opt = ShardedOptimizer::Create(t, params, n, &comm, &arena, &store);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    const int64_t before = testing::StartPeakRss();
    Status s;
    if (old_path == 0) {
      s = (*opt)->ReadState(file);
    } else {
      Result<SafetensorsFile> whole = ReadSafetensors(file);
      s = whole.ok() ? (*opt)->LoadState(*whole) : whole.status();
    }
    growth[old_path] = testing::ProcStatusBytes("VmHWM") - before;
    ASSERT_TRUE(s.ok()) << s.ToString();
    stored[old_path] = static_cast<int64_t>(store.Stats().store_bytes);
    EXPECT_EQ(stored[old_path], (*opt)->shard_state_bytes());
    EXPECT_EQ((*opt)->step(), 1);
  }
  EXPECT_EQ(stored[0], stored[1]);
  std::printf("zero1 offloaded resume, rank 0 of 2, %.1f MiB file: RSS growth ReadState %.1f MiB, "
              "whole-file LoadState %.1f MiB (store holds %.1f MiB)\n",
              static_cast<double>(file_bytes) / 1048576.0,
              static_cast<double>(growth[0]) / 1048576.0,
              static_cast<double>(growth[1]) / 1048576.0,
              static_cast<double>(stored[0]) / 1048576.0);
  EXPECT_LT(growth[0], stored[0] + (int64_t{24} << 20));
  EXPECT_GT(growth[1], stored[1] + file_bytes * 3 / 4)
      << "the reference path no longer reads the file whole: the bound above proves less";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()), 1);
}

// ZeRO-1 checkpoint with training.offload of a 128 MiB AdamW state (two threads as the ranks, each
// with its 64 MiB shard in its own store): rank 0 WriteState while rank 1 ContributeState. The
// shards cross as a stream (each rank's store read a chunk at a time, 4 MiB frames), so the
// process's peak RSS grows by a bounded rest (< 40 MiB: frames, chunk buffers), not by the
// state; the gather it replaced held each rank's packed shard and the whole state on every rank.
// The file is the unsharded in-memory AdamW's, byte for byte. Reference for the measurement:
// SaveState collects the gathered file in memory, so its growth is at least the file.
TEST(ShardedOptimizer, OffloadedWriteStateStreamsTheShardsInBoundedMemory) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = testing::MakeParams({{4096, 4096}, {4096}}, &n);
  TrainingSpec t = Optim("adamw");
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  const std::vector<float> g = testing::RandomVector(n, 2, 1.0f);
  const std::string dir = testing::MakeTempDir("zero1_write_rss");
  const std::string alone_file = dir + "/alone.safetensors", file = dir + "/optimizer.safetensors";
  {
    std::unique_ptr<Backend> backend = MakeCpuBackend(0);
    DeviceArena arena(backend.get(), 0);
    auto opt = MakeOptimizer(t, params, n, &arena);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    std::vector<float> p = init;
    (*opt)->Step(p.data(), g.data(), 1e-2, 1.0f);
    ASSERT_TRUE((*opt)->WriteState(alone_file).ok());
  }
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(alone_file));
  ASSERT_GT(file_bytes, int64_t{120} << 20);
  t.offload = "cpu";
  ThreadWorld w(2);
  struct Rank {
    Rank(ThreadWorld* w, int r) : comm(w, r), backend(MakeCpuBackend(0)), arena(backend.get(), 0) {}
    ThreadComm comm;
    std::unique_ptr<Backend> backend;
    DeviceArena arena;
    MapStore store;
    std::unique_ptr<ShardedOptimizer> opt;
    std::vector<float> p;
  };
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Rank>(&w, r));
    Rank& k = *ranks.back();
    auto opt = ShardedOptimizer::Create(t, params, n, &k.comm, &k.arena, &k.store);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    k.opt = std::move(*opt);
    k.p = init;
    k.opt->Step(k.p.data(), g.data(), 1e-2, 1.0f);  // the rank's range only: no collective
    ASSERT_TRUE(k.opt->status().ok());
  }
  int64_t growth[2] = {0, 0};
  for (int collect = 0; collect < 2; ++collect) {
    Status s[2];
    SafetensorsFile collected;
    const int64_t before = testing::StartPeakRss();
    std::thread other([&] { s[1] = ranks[1]->opt->ContributeState(); });
    if (collect == 0) {
      s[0] = ranks[0]->opt->WriteState(file);
    } else {
      collected = ranks[0]->opt->SaveState();
      s[0] = ranks[0]->opt->status();
    }
    other.join();
    growth[collect] = testing::ProcStatusBytes("VmHWM") - before;
    ASSERT_TRUE(s[0].ok()) << s[0].ToString();
    ASSERT_TRUE(s[1].ok()) << s[1].ToString();
    if (collect == 1) {
      EXPECT_EQ(collected.tensors.size(), 4u);
    }
  }
  EXPECT_TRUE(testing::ReadFile(file) == testing::ReadFile(alone_file))
      << "the gathered file differs from the unsharded optimizer's";
  std::printf("zero1 offloaded checkpoint, world 2, %.1f MiB state: RSS growth WriteState (streamed) %.1f MiB, "
              "SaveState (collected whole) %.1f MiB\n",
              static_cast<double>(file_bytes) / 1048576.0, static_cast<double>(growth[0]) / 1048576.0,
              static_cast<double>(growth[1]) / 1048576.0);
  EXPECT_LT(growth[0], int64_t{40} << 20);
  EXPECT_GT(growth[1], file_bytes * 3 / 4)
      << "the reference path no longer holds the file: the bound above proves less";
}

// A rank whose shard cannot be read (its store lost a chunk) fails the checkpoint on the writer
// with that rank named; neither rank waits forever, and the writer leaves no file behind.
TEST(ShardedOptimizer, AShardThatCannotBeReadFailsTheCheckpointNamingItsRank) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  TrainingSpec t = Optim("adamw");
  t.offload = "cpu";
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  const std::vector<float> g = testing::RandomVector(n, 2, 1.0f);
  ThreadWorld w(2);
  ThreadComm c0(&w, 0), c1(&w, 1);
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  MapStore st0, st1;
  auto o0 = ShardedOptimizer::Create(t, params, n, &c0, &arena, &st0);
  auto o1 = ShardedOptimizer::Create(t, params, n, &c1, &arena, &st1);
  ASSERT_TRUE(o0.ok() && o1.ok());
  std::vector<float> p0 = init, p1 = init;
  (*o0)->Step(p0.data(), g.data(), 1e-2, 1.0f);
  (*o1)->Step(p1.data(), g.data(), 1e-2, 1.0f);
  st1.Corrupt();
  const std::string dir = testing::MakeTempDir("zero1_write_fail");
  Status s1;
  std::thread other([&] { s1 = (*o1)->ContributeState(); });
  const Status s0 = (*o0)->WriteState(dir + "/optimizer.safetensors");
  other.join();
  EXPECT_EQ(s1.code(), Status::Code::kDataLoss) << s1.ToString();
  EXPECT_EQ(s0.code(), Status::Code::kDataLoss) << s0.ToString();
  EXPECT_NE(s0.message().find("rank 1"), std::string::npos) << s0.ToString();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()), 0);
}

// ThreadComm whose `break_at`-th broadcast (counted per rank: the ranks are in step) fails as a
// collective timeout, after which every call fails at once as a broken Gloo communicator's do.
class BreakingComm final : public Communicator {
 public:
  BreakingComm(ThreadComm* inner, int break_at) : in_(inner), break_at_(break_at) {}
  int rank() const override { return in_->rank(); }
  int world_size() const override { return in_->world_size(); }
  std::string name() const override { return "breaking"; }
  Status AllReduceSum(void* d, int64_t n, CommDType t) override {
    return broken_ ? Earlier() : in_->AllReduceSum(d, n, t);
  }
  Status ReduceScatterSum(const void* i, void* o, int64_t n, CommDType t) override {
    return broken_ ? Earlier() : in_->ReduceScatterSum(i, o, n, t);
  }
  Status ReduceScatterSumInPlace(void* d, const std::vector<int64_t>& c, CommDType t) override {
    return broken_ ? Earlier() : in_->ReduceScatterSumInPlace(d, c, t);
  }
  Status AllGatherInPlace(void* d, const std::vector<int64_t>& c, CommDType t) override {
    return broken_ ? Earlier() : in_->AllGatherInPlace(d, c, t);
  }
  Status AllGather(const void* i, void* o, int64_t n, CommDType t) override {
    return broken_ ? Earlier() : in_->AllGather(i, o, n, t);
  }
  Status Broadcast(void* d, size_t bytes, int root) override {
    if (broken_) return Earlier();
    if (++broadcasts_ == break_at_) {
      broken_ = true;
      return Status::Unavailable("broadcast on rank " + std::to_string(rank()) +
                                 " failed (timed out after 2 s: a peer died or hangs)");
    }
    return in_->Broadcast(d, bytes, root);
  }
  Status Barrier() override { return broken_ ? Earlier() : in_->Barrier(); }

 private:
  static Status Earlier() { return Status::Unavailable("the communicator failed earlier"); }
  ThreadComm* in_;
  int break_at_;
  int broadcasts_ = 0;
  bool broken_ = false;
};

// A collective that times out in the middle of the checkpoint's gather: both ranks return that
// error (its words, not the "failed earlier" of the calls a broken communicator refuses
// afterwards), nobody waits, and the writer leaves no file.
TEST(ShardedOptimizer, ACheckpointGatherThatTimesOutReportsTheTimeout) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  const TrainingSpec t = Optim("adamw");
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  const std::vector<float> g = testing::RandomVector(n, 2, 1.0f);
  for (int break_at : {1, 2}) {
    ThreadWorld w(2);
    ThreadComm c0(&w, 0), c1(&w, 1);
    BreakingComm b0(&c0, break_at), b1(&c1, break_at);
    std::unique_ptr<Backend> backend = MakeCpuBackend(1);
    DeviceArena arena(backend.get(), 0);
    auto o0 = ShardedOptimizer::Create(t, params, n, &b0, &arena);
    auto o1 = ShardedOptimizer::Create(t, params, n, &b1, &arena);
    ASSERT_TRUE(o0.ok() && o1.ok());
    std::vector<float> p0 = init, p1 = init;
    (*o0)->Step(p0.data(), g.data(), 1e-2, 1.0f);
    (*o1)->Step(p1.data(), g.data(), 1e-2, 1.0f);
    const std::string dir = testing::MakeTempDir("zero1_gather_timeout");
    Status s1;
    std::thread other([&] { s1 = (*o1)->ContributeState(); });
    const Status s0 = (*o0)->WriteState(dir + "/optimizer.safetensors");
    other.join();
    for (const Status& s : {s0, s1}) {
      EXPECT_NE(s.message().find("timed out after 2 s"), std::string::npos)
          << "break at broadcast " << break_at << ": " << s.ToString();
    }
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                            std::filesystem::directory_iterator()), 0);
  }
}

TEST(ShardedOptimizer, BadStateTensorIsNamedAndTooLargeAWorldIsRefused) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = Layout(&n);
  const std::vector<float> init = testing::RandomVector(n, 1, 0.5f);
  const std::vector<std::vector<float>> grads = {testing::RandomVector(n, 2, 1.0f)};
  SafetensorsFile state;
  RunAlone(Optim("adamw"), params, n, init, grads, nullptr, &state);
  state.tensors["p2.exp_avg"].shape = {64, 96};  // transposed: the wrong shape
  WorldResult res = RunWorld(Optim("adamw"), 2, params, n, init, grads, &state);
  EXPECT_EQ(res.status.code(), Status::Code::kDataLoss);
  EXPECT_NE(res.status.message().find("p2.exp_avg"), std::string::npos) << res.status.ToString();
  // The same from the file (ReadState), in memory and offloaded; nothing left beside it.
  const std::string dir = testing::MakeTempDir("zero1_bad_state");
  const std::string file = dir + "/optimizer.safetensors";
  ASSERT_TRUE(WriteSafetensors(file, state).ok());
  for (bool offload : {false, true}) {
    TrainingSpec t = Optim("adamw");
    if (offload) t.offload = "cpu";
    res = RunWorld(t, 2, params, n, init, grads, nullptr, offload, file);
    EXPECT_EQ(res.status.code(), Status::Code::kDataLoss) << offload;
    EXPECT_NE(res.status.message().find("p2.exp_avg"), std::string::npos) << res.status.ToString();
  }
  state.tensors.erase("p2.exp_avg");
  res = RunWorld(Optim("adamw"), 2, params, n, init, grads, &state);
  EXPECT_EQ(res.status.code(), Status::Code::kDataLoss);
  EXPECT_NE(res.status.message().find("missing tensor p2.exp_avg"), std::string::npos)
      << res.status.ToString();
  ASSERT_TRUE(WriteSafetensors(file, state).ok());
  for (bool offload : {false, true}) {
    TrainingSpec t = Optim("adamw");
    if (offload) t.offload = "cpu";
    res = RunWorld(t, 2, params, n, init, grads, nullptr, offload, file);
    EXPECT_EQ(res.status.code(), Status::Code::kDataLoss) << offload;
    EXPECT_NE(res.status.message().find("p2.exp_avg"), std::string::npos) << res.status.ToString();
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()), 1);

  // Adafactor with more ranks than tensors leaves a rank nothing.
  int64_t small = 0;
  const std::vector<ParamInfo> two = testing::MakeParams({{4, 4}, {4}}, &small);
  res = RunWorld(Optim("adafactor"), 3, two, small, std::vector<float>(20, 1.0f), {}, nullptr);
  EXPECT_EQ(res.status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(res.status.message().find("distributed.zero_stage: 1 leaves rank"), std::string::npos)
      << res.status.ToString();
}

}  // namespace
}  // namespace traind::engine
