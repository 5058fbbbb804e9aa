// offload: cpu. Chunks live in host RAM: a committed map and a pending map swapped in on Commit.
// Writes copy synchronously (a memcpy is the whole "I/O"), so there are no worker threads; buffers
// of replaced versions are reused for the next step's writes of the same size.
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "crc32c.h"
#include "format.h"
#include "traind/engine/mutex.h"
#include "options.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

using engine::OptimizerStateStoreStats;
using engine::StateChunkInfo;
using Clock = std::chrono::steady_clock;

struct Chunk {
  std::vector<char> data;
  uint32_t crc = 0;  // Crc32c(KeyId || data), checked on every Read
};

class HostStore final : public engine::OptimizerStateStore {
 public:
  explicit HostStore(const StoreOptions& o) : options_(o) {}

  void Prefetch(const StateKey&) override {}  // already in RAM

  Status Read(const StateKey& key, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    const auto t0 = Clock::now();
    MutexLock l(&mu_);
    auto it = committed_.find(key);
    if (it == committed_.end())
      return Status::NotFound("offload cpu: no committed chunk " + key.ToString() +
                              " (committed step " + std::to_string(step_) + ")");
    const Chunk& c = it->second;
    if (c.data.size() != bytes)
      return Status::InvalidArgument("offload cpu: chunk " + key.ToString() + " holds " +
                                     std::to_string(c.data.size()) + " bytes, Read asked for " +
                                     std::to_string(bytes));
    const std::string id = KeyId(key);
    std::memcpy(dst, c.data.data(), bytes);
    if (Crc32c(Crc32c(0, id.data(), id.size()), dst, bytes) != c.crc)
      return Status::DataLoss("offload cpu: chunk " + key.ToString() +
                              " in host memory: crc32c mismatch (memory corruption)");
    stats_.read_bytes += bytes;
    stats_.io_wait_seconds += Seconds(t0);
    return Status::Ok();
  }

  Status Write(const StateKey& key, const void* src, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    if (bytes > options_.max_chunk_bytes)
      return Status::InvalidArgument("offload cpu: chunk " + key.ToString() + " is " +
                                     std::to_string(bytes) + " bytes, max_chunk_bytes is " +
                                     std::to_string(options_.max_chunk_bytes));
    const auto t0 = Clock::now();
    const std::string id = KeyId(key);
    const uint32_t crc = Crc32c(Crc32c(0, id.data(), id.size()), src, bytes);
    MutexLock l(&mu_);
    Chunk& c = pending_[key];
    if (c.data.size() != bytes) c.data = TakeBuffer(bytes);
    std::memcpy(c.data.data(), src, bytes);
    c.crc = crc;
    stats_.written_bytes += bytes;
    stats_.io_wait_seconds += Seconds(t0);  // the copy happens in the caller: nothing is hidden
    return Status::Ok();
  }

  Status Commit(int64_t step) override {
    if (step < 0) return Status::InvalidArgument("offload cpu: Commit step must be >= 0, got " + std::to_string(step));
    const auto t0 = Clock::now();
    MutexLock l(&mu_);
    for (auto& [key, chunk] : pending_) {
      auto [it, inserted] = committed_.try_emplace(key);
      if (!inserted) free_.emplace(it->second.data.size(), std::move(it->second.data));
      it->second = std::move(chunk);
    }
    pending_.clear();
    // Keep at most one step's worth of spare buffers.
    uint64_t held = 0;
    for (auto& [k, c] : committed_) held += c.data.size();
    uint64_t spare = 0;
    for (auto it = free_.begin(); it != free_.end();) {
      spare += it->first;
      it = spare > held ? free_.erase(it) : std::next(it);
    }
    step_ = step;
    ++stats_.commits;
    const double s = Seconds(t0);
    stats_.commit_seconds += s;
    stats_.io_wait_seconds += s;
    return Status::Ok();
  }

  int64_t CommittedStep() const override {
    MutexLock l(&mu_);
    return step_;
  }

  Result<std::vector<StateChunkInfo>> List() const override {
    MutexLock l(&mu_);
    std::vector<StateChunkInfo> out;
    out.reserve(committed_.size());
    for (const auto& [k, c] : committed_) out.push_back({k, c.data.size()});
    return out;
  }

  OptimizerStateStoreStats Stats() const override {
    MutexLock l(&mu_);
    OptimizerStateStoreStats s = stats_;
    s.store_bytes = 0;
    for (const auto& [k, c] : committed_) s.store_bytes += c.data.size();
    for (const auto& [k, c] : pending_) s.store_bytes += c.data.size();
    for (const auto& [n, b] : free_) s.store_bytes += n;
    return s;
  }

  std::string Describe() const override { return "cpu"; }

 private:
  static double Seconds(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::vector<char> TakeBuffer(size_t bytes) TRAIND_REQUIRES(mu_) {
    auto it = free_.find(bytes);
    if (it == free_.end()) return std::vector<char>(bytes);
    std::vector<char> b = std::move(it->second);
    free_.erase(it);
    return b;
  }

  const StoreOptions options_;
  mutable Mutex mu_;
  std::map<StateKey, Chunk> committed_ TRAIND_GUARDED_BY(mu_);
  std::map<StateKey, Chunk> pending_ TRAIND_GUARDED_BY(mu_);
  std::multimap<size_t, std::vector<char>> free_ TRAIND_GUARDED_BY(mu_);  // buffers of replaced versions
  int64_t step_ TRAIND_GUARDED_BY(mu_) = -1;
  OptimizerStateStoreStats stats_ TRAIND_GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<engine::OptimizerStateStore>> MakeHostStore(const StoreOptions& options) {
  TRAIND_RETURN_IF_ERROR(ValidateOptions(options));
  return std::unique_ptr<engine::OptimizerStateStore>(new HostStore(options));
}

}  // namespace traind::offload
