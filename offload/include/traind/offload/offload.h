// offload/: the two OptimizerStateStore implementations behind the job spec's `offload:` field.
//   offload: cpu   -> MakeHostStore: chunks in host RAM (no files, nothing survives the process)
//   offload: nvme  -> MakeRocksDbStore: chunks in a RocksDB database (integrated BlobDB) in a
//                     directory on a local NVMe drive, crash-consistent per committed step.
// The on-disk format and the RocksDB tuning are specified in offload/README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "traind/engine/optimizer_state_store.h"
#include "traind/engine/status.h"

namespace traind::offload {

// Options for both stores; fields a store does not use are ignored. Validated once by the
// factories (INVALID_ARGUMENT naming the field).
struct StoreOptions {
  // Largest payload of one chunk, bytes. Default 256 MiB. Writes over it are INVALID_ARGUMENT.
  size_t max_chunk_bytes = size_t{256} << 20;
  // Write-behind budget: bytes copied by Write and not yet handed to RocksDB. Write blocks while
  // a new chunk would go over it (a chunk larger than the budget waits for an empty queue).
  // Default 128 MiB. nvme only.
  size_t max_pending_write_bytes = size_t{128} << 20;
  // Read-ahead budget: bytes of prefetched chunks held for Read. Hints over it are dropped.
  // Default 128 MiB. nvme only.
  size_t max_prefetch_bytes = size_t{128} << 20;
  // Worker threads: background readers (read-ahead) and writers (write-behind). nvme only.
  // write_threads 0: the store's own default: 1 for RocksDB (the machines have 2 cores and its
  // flush/compaction threads come on top; a second writer slowed its puts, 401 against 610 MB/s
  // in offload_bench), 2 for the value log (two O_DIRECT writes in flight, one chunk's checksum
  // beside the other's write: 2,700 against 2,378 MB/s, bench/README.md "offload").
  int read_threads = 2;
  int write_threads = 0;

  // ---- RocksDB tuning (nvme only; README.md "Why these options") ----
  // Memtable size, bytes (RocksDB write_buffer_size). Chunks sit here until a flush writes them
  // to blob files. Default 64 MiB.
  size_t write_buffer_bytes = size_t{64} << 20;
  // Memtables (the one being filled + ones being flushed). Default 3: RAM use of RocksDB's write
  // side is at most write_buffer_bytes * max_write_buffers.
  int max_write_buffers = 3;
  // Values of at least this many bytes go to blob files, smaller ones stay in SST files.
  // Default 4 KiB.
  uint64_t min_blob_bytes = 4096;
  // Size at which a new blob file is started. Default 256 MiB.
  uint64_t blob_file_bytes = uint64_t{256} << 20;
  // RocksDB background jobs (flushes + compactions). Default 2.
  int max_background_jobs = 2;
  // Create the directory if it does not exist (its parent must exist). Default true.
  bool create_if_missing = true;
};

// offload: cpu. Never fails for valid options.
Result<std::unique_ptr<engine::OptimizerStateStore>> MakeHostStore(const StoreOptions& options = {});

// offload: nvme. Opens (or creates) the store in `dir`, recovering the last committed step and
// removing what a crash left of an uncommitted one. Errors name `dir`: NOT_FOUND (dir or its parent
// missing), FAILED_PRECONDITION (not a directory, not writable, read-only file system, opened by
// another process), RESOURCE_EXHAUSTED (disk full), DATA_LOSS (damaged files or commit record).
Result<std::unique_ptr<engine::OptimizerStateStore>> MakeRocksDbStore(const std::string& dir,
                                                                      const StoreOptions& options = {});

// offload: nvme, value-log variant (offload/README.md "The value-log store"): chunk payloads in
// preallocated segment files in `dir` written and read with O_DIRECT, two slots per chunk (the
// committed one is never overwritten before the next commit), RocksDB in `dir`/index holding only
// the index and the commit record (written after the segment files are synced). Same contract and
// errors as MakeRocksDbStore. Uses max_chunk_bytes, max_pending_write_bytes, max_prefetch_bytes,
// read_threads, write_threads, create_if_missing, and blob_file_bytes as the segment file size.
Result<std::unique_ptr<engine::OptimizerStateStore>> MakeValueLogStore(const std::string& dir,
                                                                       const StoreOptions& options = {});

// offload: nvme as jobs open it. `kind`: "valuelog" (also ""; the default: the faster of the
// two, bench/README.md "offload") or "rocksdb" (MakeRocksDbStore); anything else is
// INVALID_ARGUMENT. The job runner takes `kind` from the environment variable
// TRAIND_OFFLOAD_STORE. Each store refuses a directory holding the other's layout
// (FAILED_PRECONDITION naming it).
Result<std::unique_ptr<engine::OptimizerStateStore>> MakeNvmeStore(const std::string& dir,
                                                                   const std::string& kind = "",
                                                                   const StoreOptions& options = {});

// A store that forwards every call to `inner` but commits in the caller: CommitInBackground runs
// Commit and then the read-ahead hints before it returns (the interface's default), so nothing
// of a commit overlaps the caller's work. For measuring what committing behind compute hides
// (offload_train_bench's `nvme-sync` mode) and for tests that act between a commit and the next
// step's reads (subclass it and override Commit).
class CommitInCallerStore : public engine::OptimizerStateStore {
 public:
  explicit CommitInCallerStore(std::unique_ptr<engine::OptimizerStateStore> inner)
      : inner_(std::move(inner)) {}
  void Prefetch(const engine::StateKey& key) override { inner_->Prefetch(key); }
  Status Read(const engine::StateKey& key, void* dst, size_t bytes) override {
    return inner_->Read(key, dst, bytes);
  }
  Status Write(const engine::StateKey& key, const void* src, size_t bytes) override {
    return inner_->Write(key, src, bytes);
  }
  Status Commit(int64_t step) override { return inner_->Commit(step); }
  int64_t CommittedStep() const override { return inner_->CommittedStep(); }
  Result<std::vector<engine::StateChunkInfo>> List() const override { return inner_->List(); }
  engine::OptimizerStateStoreStats Stats() const override { return inner_->Stats(); }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::unique_ptr<engine::OptimizerStateStore> inner_;
};

}  // namespace traind::offload
