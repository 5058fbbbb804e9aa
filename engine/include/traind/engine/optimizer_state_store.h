// OptimizerStateStore: where an optimizer keeps its state tensors and fp32 master weights when they
// do not live in device memory (job spec `offload: cpu | nvme`). The engine defines this seam; the
// implementations live in offload/ (host RAM, RocksDB on NVMe) and the job runner passes one in
// through RunOptions. No storage library type appears here.
//
// Contract (every implementation passes tests/offload/store_contract_test.cc):
//
// * Data model. A store holds named chunks: byte payloads keyed by StateKey = (parameter group,
//   chunk index, state kind). The kind is any string the optimizer uses ("master", "exp_avg",
//   "exp_avg_sq", "qstate8", ...); payloads are opaque bytes, so fp32, bf16 or 8-bit states with
//   their scales all fit. A chunk's size is fixed by its last committed Write.
//
// * Versions. The store has one committed version (the state after optimizer step
//   CommittedStep(), -1 when nothing was ever committed) and one pending version being built.
//   Write() adds to the pending version; Commit(step) makes everything written since the last
//   commit visible at once, and durably for persistent stores: the data is made durable first and a
//   commit record naming the step is written last, so a crash at any point leaves either the old
//   or the new step, never a mix. Chunks not written since the last commit keep their committed
//   contents. Read() always returns committed data: until Commit returns, reads see the previous
//   committed step, even for keys written since.
//
// * Read-ahead. Prefetch(key) is a hint: the store may start reading the committed chunk in the
//   background (bounded by its read-ahead budget; hints over budget or for unknown keys are
//   dropped). Read(key, dst, bytes) blocks until the data is in dst; it verifies the chunk's
//   checksum and returns DATA_LOSS naming the key and the file (or memory) on a mismatch: never
//   silently wrong bytes.
//
// * Write-behind. Write(key, src, bytes) copies the data (src may be reused when it returns) and
//   queues it for background I/O. The queue is bounded in bytes; Write blocks while it is full, so
//   host memory stays flat however fast the optimizer produces chunks. I/O errors surface on a
//   later Write or at the latest on Commit. After any failed Write or Commit the store keeps
//   serving reads of the last committed step, but Write and Commit return that error until the
//   store is reopened (after the cause, e.g. a full disk, is fixed).
//
// * Streaming checkpoints. List() names the committed chunks and their sizes without reading
//   them, so a checkpoint writer can Read one chunk at a time into one buffer and a restore can
//   Write one chunk at a time and Commit(checkpoint step): never the whole state in RAM.
//
// * Errors. INVALID_ARGUMENT: a malformed key, a size that is not the stored size or over
//   max_chunk_bytes. NOT_FOUND: no committed chunk under the key. RESOURCE_EXHAUSTED: disk or
//   memory full (naming the directory). DATA_LOSS: a checksum mismatch or a damaged file.
//   UNAVAILABLE: other I/O errors. FAILED_PRECONDITION: a directory the store cannot use
//   (read-only, not a directory, held by another process).
//
// * Threads. Prefetch, Read, Write, List, Stats and CommittedStep may be called from any threads
//   at once. Commit must not overlap Read/Write/Prefetch calls of the same store (the optimizer
//   pipeline commits between steps); it waits for all queued writes and read-aheads itself.
//
// * Commit behind compute. CommitInBackground(step, then_prefetch) does what Commit does, on a
//   thread of the store, and returns at once: the optimizer hands the step's flush and fsync to
//   the store and goes on with the next step's forward and backward. AwaitCommit() waits for it and
//   returns its result; until then the caller makes no other call but Stats, Describe and
//   CommittedStep (which names the previous step until the commit is done): Read, Write, Commit
//   and List return FAILED_PRECONDITION, Prefetch hints are dropped. `then_prefetch` are read-ahead
//   hints the store issues itself, in order until its read-ahead budget is full, once the commit
//   succeeded (the next step's first chunks), so that reading them overlaps the caller's work
//   too. Crash consistency is Commit's: the step is there
//   once the commit record is durable, the previous one until then. Time the commit runs behind
//   the caller counts as background_io_seconds; only the time AwaitCommit blocks counts as
//   io_wait_seconds (and commit_seconds). Stores whose commit costs nothing may commit at once in
//   CommitInBackground (the default below).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "traind/engine/status.h"

namespace traind::engine {

// Names one chunk. group: the parameter group ("0", "h.3.attn", ...), 1..255 bytes, no NUL.
// chunk: index within the group, >= 0. kind: the state ("master", "exp_avg", ...), 1..255 bytes,
// no NUL. Keys order by (group, chunk, kind).
struct StateKey {
  std::string group;
  int64_t chunk = 0;
  std::string kind;

  // "h.3.attn/12/exp_avg" (for messages).
  std::string ToString() const { return group + "/" + std::to_string(chunk) + "/" + kind; }
  friend auto operator<=>(const StateKey&, const StateKey&) = default;
  friend bool operator==(const StateKey&, const StateKey&) = default;
};

// One committed chunk as List() reports it.
struct StateChunkInfo {
  StateKey key;
  uint64_t bytes = 0;
};

// Cumulative counters since the store was opened (gauges say so). The METRICS.md names in brackets.
struct OptimizerStateStoreStats {
  uint64_t read_bytes = 0;       // payload bytes returned by Read [traind_offload_read_bytes_total]
  uint64_t written_bytes = 0;    // payload bytes accepted by Write [traind_offload_written_bytes_total]
  // Seconds callers spent blocked on the store: Read waiting for data, Write waiting for queue
  // room, Commit. I/O the pipeline did NOT hide [traind_offload_io_seconds_total].
  double io_wait_seconds = 0;
  double commit_seconds = 0;       // the part of io_wait_seconds spent inside Commit
  double background_io_seconds = 0;  // worker-thread seconds in reads and writes (hidden I/O
                                      // when io_wait_seconds stays small beside it)
  uint64_t store_bytes = 0;      // gauge: bytes the store holds (files on disk; RAM for the host
                                 // store) [traind_offload_store_bytes]
  uint64_t device_written_bytes = 0;  // bytes written to files (WAL, SST, blob, compaction);
                                      // / written_bytes = write amplification. 0 in RAM.
  uint64_t prefetch_hits = 0;     // Reads served by a read-ahead (finished or in flight)
  uint64_t prefetch_misses = 0;   // Reads that had to start their own I/O
  uint64_t prefetch_dropped = 0;  // Prefetch hints dropped (over budget, unknown key)
  uint64_t pending_write_bytes = 0;  // gauge: bytes queued for write-behind now
  uint64_t commits = 0;
};

class OptimizerStateStore {
 public:
  virtual ~OptimizerStateStore() = default;

  // Hint that `key` will be read soon. Never fails; see "Read-ahead" above.
  virtual void Prefetch(const StateKey& key) = 0;

  // Copies the committed chunk `key` (exactly `bytes` long) into dst. Blocks until done.
  virtual Status Read(const StateKey& key, void* dst, size_t bytes) = 0;

  // Adds `bytes` bytes from src as the pending contents of `key`. Copies before returning; may
  // block while the write-behind queue is full. A second Write of a key before Commit replaces
  // the first.
  virtual Status Write(const StateKey& key, const void* src, size_t bytes) = 0;

  // Makes every Write since the last commit visible and durable as optimizer step `step` (>= 0).
  // Returns only after the commit record is durable (persistent stores). On error nothing of the
  // pending version becomes visible.
  virtual Status Commit(int64_t step) = 0;

  // Commit(step) behind the caller; see "Commit behind compute" above. The default commits here
  // and then issues the hints.
  virtual void CommitInBackground(int64_t step, std::vector<StateKey> then_prefetch) {
    background_commit_ = Commit(step);
    if (background_commit_.ok()) {
      for (const StateKey& key : then_prefetch) Prefetch(key);
    }
  }

  // Waits for the commit CommitInBackground started and returns its result (OK when none is
  // pending). Each background commit's result is returned once.
  virtual Status AwaitCommit() {
    Status s = background_commit_;
    background_commit_ = Status::Ok();
    return s;
  }

  // The step of the last successful Commit (also across reopen), -1 for an empty store.
  virtual int64_t CommittedStep() const = 0;

  // The committed chunks, ordered by key, with their sizes (reads no payload).
  virtual Result<std::vector<StateChunkInfo>> List() const = 0;

  virtual OptimizerStateStoreStats Stats() const = 0;

  // "cpu" or "nvme:/path/to/dir" (for logs and messages).
  virtual std::string Describe() const = 0;

 private:
  Status background_commit_;  // the default CommitInBackground's result, until AwaitCommit
};

}  // namespace traind::engine
