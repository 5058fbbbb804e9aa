// The read side both nvme stores share (the RocksDB store and the value-log store): read-ahead that
// Prefetch queues, the store's reader threads perform and Read takes, and Read's lookup of the
// committed chunk. Only how a chunk is read differs between the stores; that stays in each store.
//
// ReadAhead holds no mutex of its own: it is part of its store's state, guarded by the store's
// mutex, which every member function takes as its first argument (`TRAIND_REQUIRES(mu)`), so
// clang's thread-safety analysis checks each call site holds it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "traind/engine/mutex.h"
#include "traind/engine/optimizer_state_store.h"
#include "traind/engine/status.h"

namespace traind::offload {

// The committed version of `key` (an Entry with a `bytes` field) for a Read of `bytes`:
// NOT_FOUND when there is none, INVALID_ARGUMENT when its size differs. `store` names the store in
// the message ("offload nvme <dir>").
template <typename Entry>
Status FindCommitted(const std::map<engine::StateKey, Entry>& committed, const engine::StateKey& key,
                     size_t bytes, const std::string& store, int64_t step, Entry* out) {
  auto it = committed.find(key);
  if (it == committed.end())
    return Status::NotFound(store + ": no committed chunk " + key.ToString() + " (committed step " +
                            std::to_string(step) + ")");
  if (it->second.bytes != bytes)
    return Status::InvalidArgument(store + ": chunk " + key.ToString() + " holds " +
                                   std::to_string(it->second.bytes) + " bytes, Read asked for " +
                                   std::to_string(bytes));
  *out = it->second;
  return Status::Ok();
}

// Read-ahead of committed chunks: `Entry` says where a chunk is (the store's index entry),
// `Buffer` is what a reader thread reads it into (the store's pooled buffer type).
template <typename Entry, typename Buffer>
class ReadAhead {
 public:
  // One read-ahead, queued, in progress or done. Owned by the map until a Read takes it.
  struct Slot {
    Entry entry;
    uint64_t budget_bytes = 0;  // what it counts against max_prefetch_bytes
    bool started = false;
    bool done = false;
    Status status;
    Buffer data;
  };
  using SlotPtr = std::shared_ptr<Slot>;

  explicit ReadAhead(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Queues a read-ahead of `key`'s committed `entry`, `bytes` of the budget; false when it is
  // already queued or the budget is full.
  bool Queue(Mutex* mu, const engine::StateKey& key, const Entry& entry, uint64_t bytes) TRAIND_REQUIRES(mu) {
    if (slots_.count(key) || bytes_ + bytes > max_bytes_) return false;
    auto slot = std::make_shared<Slot>();
    slot->entry = entry;
    slot->budget_bytes = bytes;
    slots_.emplace(key, std::move(slot));
    bytes_ += bytes;
    queue_.push_back(key);
    work_cv_.NotifyAll();
    return true;
  }

  bool Queued(Mutex* mu, const engine::StateKey& key) const TRAIND_REQUIRES(mu) { return slots_.count(key) > 0; }

  // Read's part: the finished read-ahead of `key`, now the caller's (waiting for one in flight),
  // or null, and the caller reads the chunk itself: none was queued, it had not started (it is
  // dropped and the readers skip it), or a concurrent Read of the same key took it first.
  // Counts a prefetch hit or miss in `stats`.
  SlotPtr Take(Mutex* mu, const engine::StateKey& key, engine::OptimizerStateStoreStats* stats) TRAIND_REQUIRES(mu) {
    SlotPtr slot;
    auto p = slots_.find(key);
    if (p != slots_.end()) {
      if (p->second->started) {
        slot = p->second;
        while (!slot->done) done_cv_.Wait(mu);
        // The map may have changed while waiting: only the Read that removes the slot uses it.
        p = slots_.find(key);
        if (p == slots_.end() || p->second != slot) slot = nullptr;
      }
      if (p != slots_.end()) {
        bytes_ -= p->second->budget_bytes;
        slots_.erase(p);
      }
    }
    if (slot) ++stats->prefetch_hits;
    else ++stats->prefetch_misses;
    return slot;
  }

  // A reader thread's next read-ahead, marked started, and its key; null once Shutdown is called.
  // The thread reads it without the mutex and hands it back with Finish.
  SlotPtr Next(Mutex* mu, engine::StateKey* key) TRAIND_REQUIRES(mu) {
    for (;;) {
      while (!shutdown_ && queue_.empty()) work_cv_.Wait(mu);
      if (shutdown_) return nullptr;
      *key = std::move(queue_.front());
      queue_.pop_front();
      auto it = slots_.find(*key);
      if (it == slots_.end() || it->second->started) continue;  // taken by a Read, or dropped
      it->second->started = true;
      ++in_flight_;
      return it->second;
    }
  }

  void Finish(Mutex* mu, const SlotPtr& slot, Status status, Buffer data) TRAIND_REQUIRES(mu) {
    slot->status = std::move(status);
    slot->data = std::move(data);
    slot->done = true;
    --in_flight_;
    done_cv_.NotifyAll();
  }

  // Commit's part: waits for the reads in flight, then drops every read-ahead (they are of the
  // version about to be replaced).
  void DrainAndClear(Mutex* mu) TRAIND_REQUIRES(mu) {
    while (!shutdown_ && in_flight_ > 0) done_cv_.Wait(mu);
    queue_.clear();
    slots_.clear();
    bytes_ = 0;
  }

  // Wakes the reader threads for good (the store's destructor, before joining them).
  void Shutdown(Mutex* mu) TRAIND_REQUIRES(mu) {
    shutdown_ = true;
    work_cv_.NotifyAll();
    done_cv_.NotifyAll();
  }

 private:
  const uint64_t max_bytes_;
  // All guarded by the store's mutex (the `mu` of every call).
  CondVar work_cv_;  // reader threads: a read-ahead queued, or shutdown
  CondVar done_cv_;  // a read-ahead done, or shutdown
  bool shutdown_ = false;
  std::map<engine::StateKey, SlotPtr> slots_;
  std::deque<engine::StateKey> queue_;
  uint64_t bytes_ = 0;  // budget_bytes of the slots in the map
  int in_flight_ = 0;
};

}  // namespace traind::offload
