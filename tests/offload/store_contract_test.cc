// The OptimizerStateStore contract (engine/include/traind/engine/optimizer_state_store.h), run
// against the three stores: MakeHostStore (offload: cpu), MakeRocksDbStore (offload: nvme) and
// MakeValueLogStore (nvme, own segment files + RocksDB index).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "offload_test_util.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

using engine::OptimizerStateStore;
using engine::StateKey;
using testing::ChunkData;
using testing::TempDir;

// Small memtables and blob files so flushes, compactions and blob GC all happen within a test.
StoreOptions SmallOptions() {
  StoreOptions o;
  o.write_buffer_bytes = 4 << 20;
  o.blob_file_bytes = 8 << 20;
  o.max_pending_write_bytes = 2 << 20;
  o.max_prefetch_bytes = 4 << 20;
  return o;
}

struct HostFactory {
  static constexpr bool kPersistent = false;
  Result<std::unique_ptr<OptimizerStateStore>> Open(const StoreOptions& o) { return MakeHostStore(o); }
};
struct RocksDbFactory {
  static constexpr bool kPersistent = true;
  TempDir tmp;
  Result<std::unique_ptr<OptimizerStateStore>> Open(const StoreOptions& o) {
    return MakeRocksDbStore(tmp.Sub("store"), o);
  }
};

template <typename F>
class StoreContractTest : public ::testing::Test {
 protected:
  void SetUp() override { store_ = OpenStore(SmallOptions()); }
  std::unique_ptr<OptimizerStateStore> OpenStore(const StoreOptions& o) {
    auto r = factory_.Open(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  void WriteStep(int64_t step, const std::vector<StateKey>& keys, size_t bytes) {
    for (const auto& k : keys) {
      auto d = ChunkData(k, step, bytes);
      ASSERT_TRUE(store_->Write(k, d.data(), d.size()).ok());
    }
  }
  void ExpectStep(int64_t step, const std::vector<StateKey>& keys, size_t bytes) {
    std::vector<char> got(bytes);
    for (const auto& k : keys) {
      Status st = store_->Read(k, got.data(), bytes);
      ASSERT_TRUE(st.ok()) << k.ToString() << ": " << st.ToString();
      ASSERT_TRUE(got == ChunkData(k, step, bytes)) << k.ToString() << " is not step " << step << "'s data";
    }
  }
  F factory_;
  std::unique_ptr<OptimizerStateStore> store_;
};

struct ValueLogFactory {
  static constexpr bool kPersistent = true;
  TempDir tmp;
  Result<std::unique_ptr<OptimizerStateStore>> Open(const StoreOptions& o) {
    return MakeValueLogStore(tmp.Sub("store"), o);
  }
};

using Factories = ::testing::Types<HostFactory, RocksDbFactory, ValueLogFactory>;
class FactoryNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, HostFactory> ? "cpu" : std::is_same_v<T, RocksDbFactory> ? "nvme" : "valuelog";
  }
};
TYPED_TEST_SUITE(StoreContractTest, Factories, FactoryNames);

std::vector<StateKey> Keys(int groups, int chunks, std::vector<std::string> kinds = {"master", "exp_avg", "exp_avg_sq"}) {
  std::vector<StateKey> keys;
  for (int g = 0; g < groups; ++g)
    for (int c = 0; c < chunks; ++c)
      for (const auto& k : kinds) keys.push_back({"g" + std::to_string(g), c, k});
  return keys;
}

TYPED_TEST(StoreContractTest, EmptyStore) {
  ASSERT_NE(this->store_, nullptr);
  EXPECT_EQ(this->store_->CommittedStep(), -1);
  char buf[8];
  EXPECT_EQ(this->store_->Read({"g0", 0, "master"}, buf, 8).code(), Status::Code::kNotFound);
  auto list = this->store_->List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TYPED_TEST(StoreContractTest, WriteCommitRead) {
  const auto keys = Keys(2, 3);
  this->WriteStep(0, keys, 10000);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  EXPECT_EQ(this->store_->CommittedStep(), 0);
  this->ExpectStep(0, keys, 10000);
  auto list = this->store_->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), keys.size());
  for (const auto& info : *list) EXPECT_EQ(info.bytes, 10000u);
  EXPECT_TRUE(std::is_sorted(list->begin(), list->end(),
                             [](const auto& a, const auto& b) { return a.key < b.key; }));
  const auto s = this->store_->Stats();
  EXPECT_EQ(s.written_bytes, keys.size() * 10000);
  EXPECT_EQ(s.read_bytes, keys.size() * 10000);
  EXPECT_EQ(s.commits, 1u);
  EXPECT_GE(s.store_bytes, keys.size() * 10000);
}

TYPED_TEST(StoreContractTest, UncommittedWritesAreInvisible) {
  const StateKey a{"g0", 0, "master"}, b{"g0", 1, "master"};
  auto a0 = ChunkData(a, 0, 5000);
  ASSERT_TRUE(this->store_->Write(a, a0.data(), a0.size()).ok());
  ASSERT_TRUE(this->store_->Commit(0).ok());
  auto a1 = ChunkData(a, 1, 5000), b1 = ChunkData(b, 1, 5000);
  ASSERT_TRUE(this->store_->Write(a, a1.data(), a1.size()).ok());
  ASSERT_TRUE(this->store_->Write(b, b1.data(), b1.size()).ok());
  std::vector<char> got(5000);
  ASSERT_TRUE(this->store_->Read(a, got.data(), got.size()).ok());
  EXPECT_TRUE(got == a0) << "a read before Commit must see the committed step";
  EXPECT_EQ(this->store_->Read(b, got.data(), got.size()).code(), Status::Code::kNotFound);
  EXPECT_EQ(this->store_->CommittedStep(), 0);
  ASSERT_TRUE(this->store_->Commit(1).ok());
  ASSERT_TRUE(this->store_->Read(a, got.data(), got.size()).ok());
  EXPECT_TRUE(got == a1);
  ASSERT_TRUE(this->store_->Read(b, got.data(), got.size()).ok());
  EXPECT_TRUE(got == b1);
}

TYPED_TEST(StoreContractTest, ChunksNotRewrittenKeepTheirData) {
  const StateKey a{"g0", 0, "master"}, b{"g0", 1, "master"};
  auto a0 = ChunkData(a, 0, 6000), b0 = ChunkData(b, 0, 6000);
  ASSERT_TRUE(this->store_->Write(a, a0.data(), a0.size()).ok());
  ASSERT_TRUE(this->store_->Write(b, b0.data(), b0.size()).ok());
  ASSERT_TRUE(this->store_->Commit(0).ok());
  for (int64_t step = 1; step <= 3; ++step) {
    auto a1 = ChunkData(a, step, 6000);
    ASSERT_TRUE(this->store_->Write(a, a1.data(), a1.size()).ok());
    ASSERT_TRUE(this->store_->Commit(step).ok());
  }
  this->ExpectStep(3, {a}, 6000);
  this->ExpectStep(0, {b}, 6000);
}

TYPED_TEST(StoreContractTest, RejectsBadKeysAndSizes) {
  char buf[16] = {};
  EXPECT_EQ(this->store_->Write({"", 0, "master"}, buf, 16).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(this->store_->Write({"g", -1, "master"}, buf, 16).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(this->store_->Write({"g", 0, ""}, buf, 16).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(this->store_->Write({std::string("a\0b", 3), 0, "m"}, buf, 16).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(this->store_->Write({"g", 0, "m"}, buf, 16).ok());
  ASSERT_TRUE(this->store_->Commit(0).ok());
  Status st = this->store_->Read({"g", 0, "m"}, buf, 8);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("16 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(this->store_->Commit(-1).code(), Status::Code::kInvalidArgument);
  StoreOptions o = SmallOptions();
  o.max_chunk_bytes = 1024;
  this->store_.reset();  // (RocksDB: one open store per directory)
  auto small = this->OpenStore(o);
  ASSERT_NE(small, nullptr);
  std::vector<char> big(2048);
  EXPECT_EQ(small->Write({"g", 0, "m"}, big.data(), big.size()).code(), Status::Code::kInvalidArgument);
}

TYPED_TEST(StoreContractTest, PrefetchThenRead) {
  const auto keys = Keys(1, 16, {"exp_avg"});
  this->WriteStep(0, keys, 64 << 10);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  const double io_before = this->store_->Stats().background_io_seconds;  // writers are drained
  for (const auto& k : keys) this->store_->Prefetch(k);
  this->store_->Prefetch({"nope", 0, "x"});  // unknown key: dropped, no error
  if constexpr (TypeParam::kPersistent) {
    // Let the readers finish one read-ahead (on a loaded machine they may not have started yet
    // when the Reads come, and a Read takes over a read-ahead that has not started).
    for (int i = 0; i < 500 && this->store_->Stats().background_io_seconds == io_before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  this->ExpectStep(0, keys, 64 << 10);
  const auto s = this->store_->Stats();
  EXPECT_EQ(s.read_bytes, keys.size() * (64 << 10));
  if constexpr (TypeParam::kPersistent) {
    EXPECT_GT(s.prefetch_hits, 0u) << "no Read was served by a read-ahead";
    EXPECT_EQ(s.prefetch_hits + s.prefetch_misses, keys.size());
    EXPECT_GE(s.prefetch_dropped, 1u);
    EXPECT_GT(s.background_io_seconds, 0.0);
  }
  // Read-ahead then a commit: the next reads see the new step, not the cached old one.
  for (const auto& k : keys) this->store_->Prefetch(k);
  this->WriteStep(1, keys, 64 << 10);
  ASSERT_TRUE(this->store_->Commit(1).ok());
  this->ExpectStep(1, keys, 64 << 10);
}

// Every key overwritten every step, as an optimizer does: what the store holds must stay bounded.
TYPED_TEST(StoreContractTest, OverwriteEveryStepKeepsStorageBounded) {
  const auto keys = Keys(2, 4, {"master", "exp_avg"});  // 16 chunks of 128 KiB = 2 MiB a step
  const size_t bytes = 128 << 10;
  const uint64_t state = keys.size() * bytes;
  uint64_t peak_late = 0;
  const int steps = 40;
  for (int64_t step = 0; step < steps; ++step) {
    this->WriteStep(step, keys, bytes);
    ASSERT_TRUE(this->store_->Commit(step).ok());
    const uint64_t held = this->store_->Stats().store_bytes;
    if (step >= steps / 2) peak_late = std::max(peak_late, held);
  }
  this->ExpectStep(steps - 1, keys, bytes);
  const auto s = this->store_->Stats();
  std::printf("[ %s ] state %.1f MiB, %d steps written (%.1f MiB), held after the first half at most "
              "%.2f MiB (%.2fx state), now %.2f MiB; device writes %.1f MiB (%.3fx)\n",
              this->store_->Describe().c_str(), state / 1048576.0, steps, s.written_bytes / 1048576.0,
              peak_late / 1048576.0, double(peak_late) / state, s.store_bytes / 1048576.0,
              s.device_written_bytes / 1048576.0, double(s.device_written_bytes) / s.written_bytes);
  if constexpr (TypeParam::kPersistent) {
    // The committed version plus blob files of replaced versions awaiting the compaction that
    // frees them: with this tiny state every step is 2 L0 files and compaction runs every 4
    // (offload/README.md), so a few steps' worth at commit time (measured 3.0x-5.0x on the
    // development machine). 40 steps of writes would be 40x if nothing were freed.
    EXPECT_LE(peak_late, 6 * state + (2 << 20)) << "disk use grows with the number of steps";
    EXPECT_LE(s.device_written_bytes, 1.3 * s.written_bytes) << "write amplification";
  } else {
    EXPECT_LE(peak_late, 2 * state);  // committed + spare buffers of the replaced versions
  }
}

// A chunk written once (a frozen group) while everything else is overwritten for 40 steps: blob GC
// may relocate it, it must come back bit-exact, and storage must still stay bounded.
TYPED_TEST(StoreContractTest, ChunkWrittenOnceSurvivesManyOverwrites) {
  const StateKey frozen{"frozen", 0, "master"};
  const auto keys = Keys(1, 8, {"master"});
  const size_t bytes = 128 << 10;
  auto d = ChunkData(frozen, 0, bytes);
  ASSERT_TRUE(this->store_->Write(frozen, d.data(), d.size()).ok());
  uint64_t peak_late = 0;
  for (int64_t step = 0; step < 40; ++step) {
    this->WriteStep(step, keys, bytes);
    ASSERT_TRUE(this->store_->Commit(step).ok());
    if (step >= 20) peak_late = std::max(peak_late, this->store_->Stats().store_bytes);
  }
  this->ExpectStep(0, {frozen}, bytes);
  this->ExpectStep(39, keys, bytes);
  const uint64_t state = (keys.size() + 1) * bytes;
  EXPECT_LE(peak_late, 6 * state + (2 << 20)) << "disk use grows with the number of steps";
}

// A chunk whose size changes (new slots in the value-log store), three times within one step:
// reads see the committed size and data until the commit, the last size after it and a reopen.
TYPED_TEST(StoreContractTest, ResizedChunks) {
  const StateKey a{"g0", 0, "master"}, b{"g0", 1, "master"};
  this->WriteStep(0, {a, b}, 10000);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  this->WriteStep(1, {a}, 5000);   // smaller
  this->WriteStep(1, {a}, 7000);   // and again, same 4 KiB-rounded size
  this->WriteStep(1, {a}, 30000);  // and larger, all before the commit
  std::vector<char> got(10000);
  ASSERT_TRUE(this->store_->Read(a, got.data(), got.size()).ok()) << "the committed size is still 10000";
  EXPECT_TRUE(got == ChunkData(a, 0, 10000));
  ASSERT_TRUE(this->store_->Commit(1).ok());
  this->ExpectStep(1, {a}, 30000);
  this->ExpectStep(0, {b}, 10000);
  this->WriteStep(2, {b}, 3000);  // committed with step 2 below
  for (int64_t step = 2; step < 6; ++step) {  // the freed slots get reused
    this->WriteStep(step, {a}, step % 2 ? 30000 : 12000);
    ASSERT_TRUE(this->store_->Commit(step).ok());
  }
  if constexpr (TypeParam::kPersistent) {
    this->store_.reset();
    this->store_ = this->OpenStore(SmallOptions());
    ASSERT_NE(this->store_, nullptr);
    EXPECT_EQ(this->store_->CommittedStep(), 5);
  }
  this->ExpectStep(5, {a}, 30000);
  this->ExpectStep(2, {b}, 3000);
}

// Write-behind is bounded: however fast chunks come, no more than the budget (plus the chunk
// being queued) waits in memory.
TYPED_TEST(StoreContractTest, WriteBehindQueueStaysBounded) {
  StoreOptions o = SmallOptions();
  o.max_pending_write_bytes = 1 << 20;
  this->store_.reset();
  this->store_ = this->OpenStore(o);
  ASSERT_NE(this->store_, nullptr);
  const auto keys = Keys(1, 64, {"exp_avg"});
  const size_t bytes = 256 << 10;
  uint64_t peak = 0;
  for (const auto& k : keys) {
    auto d = ChunkData(k, 0, bytes);
    ASSERT_TRUE(this->store_->Write(k, d.data(), d.size()).ok());
    peak = std::max(peak, this->store_->Stats().pending_write_bytes);
  }
  EXPECT_LE(peak, o.max_pending_write_bytes);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  EXPECT_EQ(this->store_->Stats().pending_write_bytes, 0u);
  this->ExpectStep(0, keys, bytes);
}

// write_threads: 0 is each store's own default (1 RocksDB, 2 value log; SmallOptions leaves it at
// 0), any count 1..64 gives the same data (a chunk always goes to the same writer, so the last
// write of a key wins), and a count out of range is refused naming the field.
TYPED_TEST(StoreContractTest, WriterThreadCounts) {
  for (int threads : {1, 3}) {
    StoreOptions o = SmallOptions();
    o.write_threads = threads;
    this->store_.reset();
    this->store_ = this->OpenStore(o);
    ASSERT_NE(this->store_, nullptr) << threads;
    const auto keys = Keys(2, 8);
    this->WriteStep(0, keys, 300 << 10);
    this->WriteStep(1, keys, 300 << 10);  // every key twice before the commit
    ASSERT_TRUE(this->store_->Commit(threads).ok());
    this->ExpectStep(1, keys, 300 << 10);
  }
  for (int threads : {-1, 65}) {
    StoreOptions o = SmallOptions();
    o.write_threads = threads;
    this->store_.reset();
    auto r = this->factory_.Open(o);
    ASSERT_FALSE(r.ok()) << threads;
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("write_threads"), std::string::npos) << r.status().ToString();
  }
}

TYPED_TEST(StoreContractTest, LargeAndManyChunks) {
  // One chunk bigger than a memtable, and 2000 small ones (below min_blob_bytes: SST-resident).
  const StateKey big{"embed", 0, "master"};
  const size_t big_bytes = 12 << 20;
  auto d = ChunkData(big, 0, big_bytes);
  ASSERT_TRUE(this->store_->Write(big, d.data(), d.size()).ok());
  const auto many = Keys(1, 1000, {"exp_avg", "exp_avg_sq"});
  this->WriteStep(0, many, 512);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  this->ExpectStep(0, {big}, big_bytes);
  this->ExpectStep(0, many, 512);
  auto list = this->store_->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), many.size() + 1);
}

TYPED_TEST(StoreContractTest, ConcurrentWritersAndReaders) {
  const size_t bytes = 32 << 10;
  auto keys_of = [](int t) { return Keys(1, 32, {"k" + std::to_string(t)}); };
  auto write_all = [&](int64_t step) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (const auto& k : keys_of(t)) {
          auto d = ChunkData(k, step, bytes);
          EXPECT_TRUE(this->store_->Write(k, d.data(), d.size()).ok());
        }
      });
    for (auto& th : threads) th.join();
  };
  write_all(0);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  write_all(1);  // pending while readers read step 0 concurrently
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&, t] {
      std::vector<char> got(bytes);
      for (const auto& k : keys_of(t)) {
        this->store_->Prefetch(k);
        ASSERT_TRUE(this->store_->Read(k, got.data(), bytes).ok());
        EXPECT_TRUE(got == ChunkData(k, 0, bytes));
      }
    });
  for (auto& th : readers) th.join();
  ASSERT_TRUE(this->store_->Commit(1).ok());
  for (int t = 0; t < 4; ++t) this->ExpectStep(1, keys_of(t), bytes);
}

// Several threads prefetching and reading the same chunks at once (a read-ahead is used by one
// Read only; the others read for themselves).
TYPED_TEST(StoreContractTest, ConcurrentReadsOfTheSameChunk) {
  const auto keys = Keys(1, 4, {"master"});
  const size_t bytes = 48 << 10;
  this->WriteStep(0, keys, bytes);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<char> got(bytes);
      for (int round = 0; round < 25; ++round)
        for (const auto& k : keys) {
          this->store_->Prefetch(k);
          ASSERT_TRUE(this->store_->Read(k, got.data(), bytes).ok());
          ASSERT_TRUE(got == ChunkData(k, 0, bytes));
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(this->store_->Stats().read_bytes, 4u * 25 * keys.size() * bytes);
}

// The checkpoint recipe of the header: stream the committed state out chunk by chunk (one buffer)
// into another store, and back.
TYPED_TEST(StoreContractTest, StreamCheckpointOutAndBack) {
  const auto keys = Keys(3, 5);
  this->WriteStep(7, keys, 20000);
  ASSERT_TRUE(this->store_->Commit(7).ok());
  auto copy = MakeHostStore();
  ASSERT_TRUE(copy.ok());
  auto list = this->store_->List();
  ASSERT_TRUE(list.ok());
  std::vector<char> buf;
  for (const auto& info : *list) {
    buf.resize(info.bytes);
    ASSERT_TRUE(this->store_->Read(info.key, buf.data(), buf.size()).ok());
    ASSERT_TRUE((*copy)->Write(info.key, buf.data(), buf.size()).ok());
  }
  ASSERT_TRUE((*copy)->Commit(this->store_->CommittedStep()).ok());
  EXPECT_EQ((*copy)->CommittedStep(), 7);
  std::vector<char> got(20000);
  for (const auto& k : keys) {
    ASSERT_TRUE((*copy)->Read(k, got.data(), got.size()).ok());
    EXPECT_TRUE(got == ChunkData(k, 7, 20000));
  }
}

TYPED_TEST(StoreContractTest, ReopenKeepsTheCommittedStep) {
  if constexpr (!TypeParam::kPersistent) {
    SUCCEED() << "the cpu store holds nothing across processes by design";
    return;
  } else {
    const auto keys = Keys(2, 2);
    this->WriteStep(3, keys, 9000);
    ASSERT_TRUE(this->store_->Commit(3).ok());
    this->WriteStep(4, keys, 9000);  // never committed
    this->store_.reset();
    this->store_ = this->OpenStore(SmallOptions());
    ASSERT_NE(this->store_, nullptr);
    EXPECT_EQ(this->store_->CommittedStep(), 3);
    this->ExpectStep(3, keys, 9000);
  }
}

// Commit behind compute: CommitInBackground returns at once, reads of the old step are refused
// until AwaitCommit (never a mix of steps), then the new step is there and its first chunks were
// read ahead by the store itself; the time hidden behind the caller is not counted as its wait.
TYPED_TEST(StoreContractTest, CommitInBackgroundThenAwait) {
  const auto keys = Keys(1, 8, {"exp_avg"});
  this->WriteStep(0, keys, 256 << 10);
  ASSERT_TRUE(this->store_->Commit(0).ok());
  this->WriteStep(1, keys, 256 << 10);
  const auto before = this->store_->Stats();
  // The first 4 chunks as the next step's first reads (1 MiB of the 4 MiB read-ahead budget).
  this->store_->CommitInBackground(1, std::vector<StateKey>(keys.begin(), keys.begin() + 4));
  std::vector<char> got(256 << 10);
  if constexpr (TypeParam::kPersistent) {
    // Whether or not the commit is done yet, nothing but Stats/Describe/CommittedStep until
    // AwaitCommit: a Read must not see the old step's data as if it were current, nor a mix.
    const int64_t seen = this->store_->CommittedStep();
    EXPECT_TRUE(seen == 0 || seen == 1) << seen;
    EXPECT_EQ(this->store_->Read(keys[0], got.data(), got.size()).code(),
              Status::Code::kFailedPrecondition);
    auto d = ChunkData(keys[0], 2, 256 << 10);
    EXPECT_EQ(this->store_->Write(keys[0], d.data(), d.size()).code(), Status::Code::kFailedPrecondition);
    EXPECT_EQ(this->store_->Commit(2).code(), Status::Code::kFailedPrecondition);
    EXPECT_EQ(this->store_->List().status().code(), Status::Code::kFailedPrecondition);
  }
  Status st = this->store_->AwaitCommit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(this->store_->AwaitCommit().ok()) << "a second await has nothing to wait for";
  EXPECT_EQ(this->store_->CommittedStep(), 1);
  if constexpr (TypeParam::kPersistent) {
    // The hints were issued after the commit: give the readers a moment to start them (a Read
    // takes over a hint not started yet, which would count as a miss).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  this->ExpectStep(1, keys, 256 << 10);
  const auto after = this->store_->Stats();
  EXPECT_EQ(after.commits, before.commits + 1);
  if constexpr (TypeParam::kPersistent) {
    EXPECT_GE(after.prefetch_hits - before.prefetch_hits, 4u)
        << "the store did not read the next step's first chunks ahead";
    EXPECT_EQ(after.prefetch_dropped, before.prefetch_dropped) << "the hints stop at the budget, uncounted";
    EXPECT_GT(after.background_io_seconds, before.background_io_seconds);
    // The caller waited at most the time AwaitCommit blocked, counted in both figures.
    EXPECT_NEAR(after.io_wait_seconds - before.io_wait_seconds -
                    (after.commit_seconds - before.commit_seconds),
                0.0, 1.0) << "reads only: they are served from memory here";
  }
  // And the store goes on as before: another step, committed both ways.
  this->WriteStep(2, keys, 256 << 10);
  this->store_->CommitInBackground(2, {});
  ASSERT_TRUE(this->store_->AwaitCommit().ok());
  this->ExpectStep(2, keys, 256 << 10);
  this->WriteStep(3, keys, 256 << 10);
  ASSERT_TRUE(this->store_->Commit(3).ok());
  this->ExpectStep(3, keys, 256 << 10);
}

// The store closed while a background commit runs (the job ends or fails between steps): the
// destructor waits for it, and a reopen finds one whole step, the old or the new.
TYPED_TEST(StoreContractTest, ClosingDuringABackgroundCommitLeavesOneWholeStep) {
  if constexpr (!TypeParam::kPersistent) {
    SUCCEED() << "the cpu store's commit cannot fail";
    return;
  } else {
    const auto keys = Keys(2, 2);
    this->WriteStep(5, keys, 9000);
    ASSERT_TRUE(this->store_->Commit(5).ok());
    this->WriteStep(6, keys, 9000);
    this->store_->CommitInBackground(6, keys);
    this->store_.reset();
    this->store_ = this->OpenStore(SmallOptions());
    ASSERT_NE(this->store_, nullptr);
    const int64_t step = this->store_->CommittedStep();
    ASSERT_TRUE(step == 5 || step == 6) << step;
    this->ExpectStep(step, keys, 9000);
  }
}

}  // namespace
}  // namespace traind::offload
