// offload: nvme. Chunks as versioned records in RocksDB with integrated BlobDB (README.md has the
// format and the reasons for each option). Write-behind and read-ahead run on small worker pools;
// per-step data goes in without WAL and is made durable by a flush before the (synced, WAL-logged)
// commit record names its epoch.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/statistics.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "format.h"
#include "read_ahead.h"
#include "traind/engine/mutex.h"
#include "options.h"
#include "prepare_dir.h"
#include "rocksdb_status.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

namespace fs = std::filesystem;
using engine::OptimizerStateStoreStats;
using engine::StateChunkInfo;
using Clock = std::chrono::steady_clock;

// Decodes a varint64 (RocksDB's encoding); false at the end of the input.
bool GetVarint64(std::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift <= 63 && !in->empty(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Which file holds the record `record_key`, for DATA_LOSS messages: the SST files that may hold
// the key are searched with SstFileReader, which shows a blob reference as RocksDB's BlobIndex
// (type 1, varint64 file number, offset, size); our inline values start with "TOD1" instead.
// Slow (opens SST files); only used on the error path.
std::string LocateRecord(rocksdb::DB* db, const std::string& dir, const std::string& record_key) {
  std::vector<rocksdb::LiveFileMetaData> files;
  db->GetLiveFilesMetaData(&files);
  for (const auto& f : files) {
    if (record_key < f.smallestkey || record_key > f.largestkey) continue;
    const std::string sst = f.db_path + "/" + f.relative_filename;
    rocksdb::SstFileReader reader{rocksdb::Options()};
    if (!reader.Open(sst).ok()) continue;
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
    it->Seek(record_key);
    if (!it->Valid() || it->key().ToStringView() != record_key) continue;
    std::string_view v = it->value().ToStringView();
    if (!v.empty() && v.front() == 1) {
      v.remove_prefix(1);
      uint64_t number = 0, offset = 0, size = 0;
      if (GetVarint64(&v, &number) && GetVarint64(&v, &offset) && GetVarint64(&v, &size)) {
        char name[32];
        std::snprintf(name, sizeof(name), "/%06llu.blob", static_cast<unsigned long long>(number));
        return "blob file " + dir + name + " at offset " + std::to_string(offset) + " (" +
               std::to_string(size) + " bytes; referenced from " + sst + ")";
      }
    }
    return "SST file " + sst;
  }
  return "an unknown file of " + dir;
}

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Reused byte buffers (std::string: RocksDB's PinnableSlice can fill one in place). Fresh
// multi-MiB allocations cost a page fault per 4 KiB on first touch (most of the CPU time of a
// read or write in a profile); buffers of the previous chunk of the same size cost none. At most
// `cap_bytes` of capacity is kept.
class BufferPool {
 public:
  explicit BufferPool(size_t cap_bytes) : cap_(cap_bytes) {}
  std::unique_ptr<std::string> Get(size_t bytes) {
    {
      MutexLock l(&mu_);
      for (size_t i = free_.size(); i-- > 0;) {
        if (free_[i]->capacity() >= bytes && free_[i]->capacity() <= 2 * bytes + 4096) {
          auto b = std::move(free_[i]);
          free_[i] = std::move(free_.back());
          free_.pop_back();
          held_ -= b->capacity();
          b->resize(bytes);
          return b;
        }
      }
    }
    auto b = std::make_unique<std::string>();
    b->resize(bytes);
    return b;
  }
  void Put(std::unique_ptr<std::string> b) {
    if (!b) return;
    MutexLock l(&mu_);
    while (!free_.empty() && held_ + b->capacity() > cap_) {  // keep the newest
      held_ -= free_.front()->capacity();
      free_.erase(free_.begin());
    }
    if (b->capacity() > cap_) return;
    held_ += b->capacity();
    free_.push_back(std::move(b));
  }

 private:
  Mutex mu_;
  const size_t cap_;
  std::vector<std::unique_ptr<std::string>> free_ TRAIND_GUARDED_BY(mu_);
  size_t held_ TRAIND_GUARDED_BY(mu_) = 0;
};

// Where a chunk version lives: its epoch (the commit counter it was written for) and size.
struct Version {
  uint64_t epoch = 0;
  uint64_t bytes = 0;
};

struct WriteTask {
  StateKey key;
  uint64_t epoch = 0;
  std::unique_ptr<std::string> buf;  // kValueHeaderBytes + payload: the record value, ready to Put
  size_t bytes = 0;             // payload bytes
};

// Read-ahead reads the whole record (header + payload) into a pooled string, checked.
using RecordReadAhead = ReadAhead<Version, std::unique_ptr<std::string>>;

rocksdb::Options MakeRocksOptions(const StoreOptions& o) {
  rocksdb::Options r;
  r.create_if_missing = true;
  r.paranoid_checks = true;
  r.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  r.keep_log_file_num = 2;
  r.max_background_jobs = o.max_background_jobs;
  // Memtables: chunks are copied in once and written out once by a flush.
  r.write_buffer_size = o.write_buffer_bytes;
  r.max_write_buffer_number = o.max_write_buffers;
  r.min_write_buffer_number_to_merge = 1;
  // Float data does not compress; the SST side holds only small index records and blob references.
  r.compression = rocksdb::kNoCompression;
  r.bottommost_compression = rocksdb::kNoCompression;
  // Integrated BlobDB: large values go to blob files, written sequentially at flush and never
  // rewritten by compaction (only blob GC relocates still-live blobs of the oldest files).
  r.enable_blob_files = true;
  r.min_blob_size = o.min_blob_bytes;
  r.blob_file_size = o.blob_file_bytes;
  r.blob_compression_type = rocksdb::kNoCompression;
  r.enable_blob_garbage_collection = true;
  // GC relocates the live blobs of the oldest 10% of blob files when compaction meets them.
  // When every chunk is rewritten every step, replaced blob files are freed without any
  // relocation, and relocation is pure write amplification (offload_bench, 512 MiB state, 4 steps:
  // GC off 1.000, cutoff 0.25 1.375, cutoff 0.1 1.125); GC stays on, at 0.1, for chunks that are
  // rewritten rarely (frozen groups), whose old blob files it would otherwise keep forever.
  r.blob_garbage_collection_age_cutoff = 0.1;
  r.blob_garbage_collection_force_threshold = 0.5;
  r.blob_compaction_readahead_size = 2 << 20;
  // Compactions of the (small) SST side are what drop references to replaced blobs and so free
  // blob files. Each one also relocates the live blobs of the oldest 10% of blob files, which in
  // this workload are the committed step's chunks that the running step is about to replace:
  // pure write amplification. So compactions are kept rarer (L0 trigger 4; with cutoff 0.25,
  // trigger 2 relocated 44% of the state per step in offload_bench; 8 let disk use reach 6x the
  // state in the contract test), and the previous
  // step's blob files, 100% garbage once its tombstones are flushed, are freed by the targeted
  // compactions that force_threshold 0.5 schedules.
  r.level0_file_num_compaction_trigger = 4;
  r.bytes_per_sync = 1 << 20;  // smooth write-back instead of one big sync per flush
  r.statistics = rocksdb::CreateDBStatistics();
  // Whatever is in the memtables at close is an uncommitted step (Commit flushes): garbage that
  // the next open deletes. Not flushing it saves the writes, and after a write error it keeps
  // RocksDB from retrying writers that already failed.
  r.avoid_flush_during_shutdown = true;
  return r;
}

class RocksDbStore final : public engine::OptimizerStateStore {
 public:
  RocksDbStore(std::string dir, const StoreOptions& o, std::unique_ptr<rocksdb::DB> db,
               std::shared_ptr<rocksdb::Statistics> statistics)
      : dir_(std::move(dir)),
        options_(o),
        db_(std::move(db)),
        statistics_(std::move(statistics)),
        pool_(o.max_pending_write_bytes + o.max_prefetch_bytes + 2 * o.max_chunk_bytes),
        write_queues_(o.write_threads),
        read_ahead_(o.max_prefetch_bytes) {}

  ~RocksDbStore() override {
    if (commit_thread_.joinable()) commit_thread_.join();  // its result is nobody's any more
    {
      MutexLock l(&mu_);
      shutdown_ = true;
      work_cv_.NotifyAll();
      state_cv_.NotifyAll();
      read_ahead_.Shutdown(&mu_);
    }
    for (auto& t : threads_) t.join();
    // Close flushes what is in the memtables (uncommitted data too: it is garbage a reopen removes).
    db_->Close();
  }

  // Reads the commit record and the index, removes what an interrupted step left behind.
  Status Recover() {
    MutexLock l(&mu_);  // no other thread yet; taken so the analysis can check the fields
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kCommitKey, &v);
    if (s.ok()) {
      if (!DecodeCommit(v, &committed_epoch_, &step_))
        return Status::DataLoss("offload nvme " + dir_ + ": the commit record is damaged");
    } else if (!s.IsNotFound()) {
      return FromRocksDb(s, "reading the commit record in " + dir_);
    }
    next_epoch_ = committed_epoch_ + 1;
    rocksdb::WriteBatch cleanup;
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    const std::string upper = "j";
    rocksdb::Slice upper_slice(upper);
    ro.iterate_upper_bound = &upper_slice;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    for (it->Seek("i"); it->Valid(); it->Next()) {
      StateKey key;
      uint64_t epoch = 0, bytes = 0;
      uint32_t crc = 0;
      if (!ParseRecordKey(it->key().ToStringView(), &key, &epoch) ||
          !DecodeIndexValue(it->value().ToStringView(), &bytes, &crc))
        return Status::DataLoss("offload nvme " + dir_ + ": a damaged index record");
      if (epoch > committed_epoch_) {  // written for a step that never committed
        cleanup.Delete(DataKey(key, epoch));
        cleanup.Delete(IndexKey(key, epoch));
        continue;
      }
      auto [pos, inserted] = committed_.try_emplace(key, Version{epoch, bytes});
      if (!inserted) {  // an older version whose deletion a crash interrupted
        cleanup.Delete(DataKey(key, pos->second.epoch));
        cleanup.Delete(IndexKey(key, pos->second.epoch));
        pos->second = Version{epoch, bytes};
      }
    }
    TRAIND_RETURN_IF_ERROR(FromRocksDb(it->status(), "reading the index of " + dir_));
    if (cleanup.Count() > 0) {
      rocksdb::WriteOptions wo;
      wo.disableWAL = true;
      TRAIND_RETURN_IF_ERROR(FromRocksDb(db_->Write(wo, &cleanup), "cleaning up " + dir_));
      TRAIND_RETURN_IF_ERROR(FromRocksDb(db_->Flush(rocksdb::FlushOptions()), "cleaning up " + dir_));
    }
    return Status::Ok();
  }

  void Start() {
    for (int i = 0; i < options_.write_threads; ++i) threads_.emplace_back([this, i] { WriterLoop(i); });
    for (int i = 0; i < options_.read_threads; ++i) threads_.emplace_back([this] { ReaderLoop(); });
  }

  void Prefetch(const StateKey& key) override {
    if (!ValidateKey(key).ok()) return;
    MutexLock l(&mu_);
    if (committing_) {  // the committed version is about to change
      ++stats_.prefetch_dropped;
      return;
    }
    if (!PrefetchLocked(key) && !read_ahead_.Queued(&mu_, key)) ++stats_.prefetch_dropped;
  }

  // Queues a read-ahead of the committed `key`; false when it is unknown, already queued or over
  // the budget.
  bool PrefetchLocked(const StateKey& key) TRAIND_REQUIRES(mu_) {
    auto it = committed_.find(key);
    return it != committed_.end() && read_ahead_.Queue(&mu_, key, it->second, it->second.bytes);
  }

  Status Read(const StateKey& key, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    const auto t0 = Clock::now();
    Version version;
    RecordReadAhead::SlotPtr slot;
    {
      MutexLock l(&mu_);
      TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("Read"));
      TRAIND_RETURN_IF_ERROR(FindCommitted(committed_, key, bytes, "offload nvme " + dir_, step_, &version));
      slot = read_ahead_.Take(&mu_, key, &stats_);
    }
    Status st;
    if (slot) {
      st = slot->status;
      if (st.ok()) std::memcpy(dst, slot->data->data() + kValueHeaderBytes, bytes);
      pool_.Put(std::move(slot->data));
    } else {
      auto record = pool_.Get(kValueHeaderBytes + version.bytes);
      st = ReadVersion(key, version, record.get());
      if (st.ok()) std::memcpy(dst, record->data() + kValueHeaderBytes, bytes);
      pool_.Put(std::move(record));
    }
    MutexLock l(&mu_);
    stats_.io_wait_seconds += Since(t0);
    if (st.ok()) stats_.read_bytes += bytes;
    return st;
  }

  Status Write(const StateKey& key, const void* src, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    if (bytes > options_.max_chunk_bytes)
      return Status::InvalidArgument("offload nvme " + dir_ + ": chunk " + key.ToString() + " is " +
                                     std::to_string(bytes) + " bytes, max_chunk_bytes is " +
                                     std::to_string(options_.max_chunk_bytes));
    WriteTask task;
    task.key = key;
    task.bytes = bytes;
    task.buf = pool_.Get(kValueHeaderBytes + bytes);
    std::memcpy(task.buf->data() + kValueHeaderBytes, src, bytes);
    const size_t queue = std::hash<std::string>{}(KeyId(key)) % static_cast<size_t>(options_.write_threads);
    const auto t0 = Clock::now();
    MutexLock l(&mu_);
    TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("Write"));
    TRAIND_RETURN_IF_ERROR(CheckFailedLocked());
    bool waited = false;
    while (!shutdown_ && pending_write_bytes_ > 0 &&
           pending_write_bytes_ + bytes > options_.max_pending_write_bytes) {
      waited = true;
      state_cv_.Wait(&mu_);
    }
    if (waited) stats_.io_wait_seconds += Since(t0);
    TRAIND_RETURN_IF_ERROR(CheckFailedLocked());
    if (Status room = CheckFreeSpaceLocked(bytes, "writing chunk " + key.ToString()); !room.ok()) {
      failed_ = room;
      return room;
    }
    task.epoch = next_epoch_;
    pending_[key] = Version{next_epoch_, bytes};
    pending_write_bytes_ += bytes;
    stats_.written_bytes += bytes;
    write_queues_[queue].push_back(std::move(task));
    work_cv_.NotifyAll();
    return Status::Ok();
  }

  Status Commit(int64_t step) override {
    {
      MutexLock l(&mu_);
      TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("Commit"));
    }
    return CommitNow(step, /*background=*/false);
  }

  // Commit on commit_thread_, then the read-ahead hints; AwaitCommit joins it. A second call
  // before AwaitCommit waits for the first commit (its result stays for AwaitCommit).
  void CommitInBackground(int64_t step, std::vector<StateKey> then_prefetch) override {
    if (commit_thread_.joinable()) commit_thread_.join();
    MutexLock l(&mu_);
    if (committing_ && !background_status_.ok()) return;  // the earlier failure is reported first
    committing_ = true;
    commit_thread_ = std::thread(&RocksDbStore::BackgroundCommit, this, step, std::move(then_prefetch));
  }

  Status AwaitCommit() override {
    const auto t0 = Clock::now();
    if (commit_thread_.joinable()) commit_thread_.join();
    MutexLock l(&mu_);
    if (!committing_) return Status::Ok();
    AccountCommitLocked(t0);
    committing_ = false;
    Status st = background_status_;
    background_status_ = Status::Ok();
    return st;
  }

 private:
  void BackgroundCommit(int64_t step, std::vector<StateKey> keys) {
    Status st = CommitNow(step, /*background=*/true);
    MutexLock l(&mu_);
    if (st.ok()) {  // in order, until the read-ahead budget is full (the rest are not hints yet)
      for (const StateKey& key : keys) {
        if (!ValidateKey(key).ok() || !PrefetchLocked(key)) break;
      }
    }
    if (background_status_.ok()) background_status_ = st;
  }

  // Commit's work; `background`: on commit_thread_ (its time is hidden, not the caller's wait).
  Status CommitNow(int64_t step, bool background) {
    if (step < 0)
      return Status::InvalidArgument("offload nvme " + dir_ + ": Commit step must be >= 0, got " +
                                     std::to_string(step));
    const auto t0 = Clock::now();
    uint64_t epoch = 0;
    {
      MutexLock l(&mu_);
      // Drain write-behind and read-ahead; cached read-aheads are of the version about to go.
      while (!shutdown_ && pending_write_bytes_ > 0) state_cv_.Wait(&mu_);
      read_ahead_.DrainAndClear(&mu_);
      Status failed = CheckFailedLocked();
      if (failed.ok()) {
        failed = CheckFreeSpaceLocked(0, "committing step " + std::to_string(step));
        if (!failed.ok()) failed_ = failed;
      }
      if (!failed.ok()) {
        AccountCommitLocked(t0, background);
        return failed;
      }
      epoch = next_epoch_;
    }
    const std::string what = "committing step " + std::to_string(step) + " in " + dir_;
    // 1. The step's data (written without WAL) becomes durable in SST and blob files.
    rocksdb::FlushOptions fo;
    fo.wait = true;
    Status st = FromRocksDb(db_->Flush(fo), what + " (flushing the step's data)");
    // 2. Then the commit record, synced: the step exists only once this is on disk.
    if (st.ok()) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      st = FromRocksDb(db_->Put(wo, kCommitKey, EncodeCommit(epoch, step)), what + " (commit record)");
    }
    rocksdb::WriteBatch old_versions;
    {
      MutexLock l(&mu_);
      if (!st.ok()) {
        if (failed_.ok()) failed_ = st;
        AccountCommitLocked(t0, background);
        return st;
      }
      for (auto& [key, version] : pending_) {
        auto [pos, inserted] = committed_.try_emplace(key, version);
        if (!inserted) {
          old_versions.Delete(DataKey(key, pos->second.epoch));
          old_versions.Delete(IndexKey(key, pos->second.epoch));
          pos->second = version;
        }
      }
      pending_.clear();
      committed_epoch_ = epoch;
      next_epoch_ = epoch + 1;
      step_ = step;
      ++stats_.commits;
    }
    // 3. The previous versions go (no WAL: a reopen repeats the deletion if a crash loses it).
    // A background flush of the tombstones lets compaction free the old blob files now rather
    // than a step later: disk use stays near two versions of the state.
    if (old_versions.Count() > 0) {
      rocksdb::WriteOptions wo;
      wo.disableWAL = true;
      Status del = FromRocksDb(db_->Write(wo, &old_versions), "deleting old versions in " + dir_);
      if (del.ok()) {
        rocksdb::FlushOptions async;
        async.wait = false;
        del = FromRocksDb(db_->Flush(async), "flushing deletions in " + dir_);
      }
      MutexLock l(&mu_);
      if (!del.ok() && failed_.ok()) failed_ = del;  // step `step` is committed; later calls fail
    }
    MutexLock l(&mu_);
    AccountCommitLocked(t0, background);
    return Status::Ok();
  }

 public:
  int64_t CommittedStep() const override {
    MutexLock l(&mu_);
    return step_;
  }

  Result<std::vector<StateChunkInfo>> List() const override {
    MutexLock l(&mu_);
    TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("List"));
    std::vector<StateChunkInfo> out;
    out.reserve(committed_.size());
    for (const auto& [k, v] : committed_) out.push_back({k, v.bytes});
    return out;
  }

  OptimizerStateStoreStats Stats() const override {
    OptimizerStateStoreStats s;
    {
      MutexLock l(&mu_);
      s = stats_;
      s.pending_write_bytes = pending_write_bytes_;
    }
    s.device_written_bytes = statistics_->getTickerCount(rocksdb::FLUSH_WRITE_BYTES) +
                             statistics_->getTickerCount(rocksdb::COMPACT_WRITE_BYTES) +
                             statistics_->getTickerCount(rocksdb::WAL_FILE_BYTES);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.is_regular_file(ec)) s.store_bytes += e.file_size(ec);
    return s;
  }

  std::string Describe() const override { return "nvme:" + dir_; }

 private:
  Status CheckNotCommittingLocked(const char* call) const TRAIND_REQUIRES(mu_) {
    if (!committing_) return Status::Ok();
    return Status::FailedPrecondition("offload nvme " + dir_ + ": " + call +
                                      " while a background commit is in flight (AwaitCommit first)");
  }

  Status CheckFailedLocked() TRAIND_REQUIRES(mu_) {
    if (failed_.ok() && !write_error_.ok()) failed_ = write_error_;
    if (failed_.ok()) return Status::Ok();
    return Status(failed_.code(), failed_.message() + " [the store stopped accepting writes; reopen it]");
  }

  // RESOURCE_EXHAUSTED when the file system of dir_ has no room for what the next flushes will
  // write (memtables + queued writes + `more` + 8 MiB for SST, MANIFEST and blob file headers).
  // Checked before RocksDB runs out: Debian's librocksdb 7.8 is built with assertions, and one
  // of them (WritableFileWriter "sync_without_flush_called_") aborted the process after an
  // ENOSPC once in about ten loaded test runs. Another process filling the disk can still get
  // there first; RocksDB's NoSpace then maps to RESOURCE_EXHAUSTED too.
  Status CheckFreeSpaceLocked(size_t more, const std::string& what) TRAIND_REQUIRES(mu_) {
    struct statvfs vfs;
    if (::statvfs(dir_.c_str(), &vfs) != 0) return Status::Ok();  // unknown: let RocksDB tell
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    uint64_t memtables = 0;
    db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &memtables);
    const uint64_t need = memtables + pending_write_bytes_ + more + (uint64_t{8} << 20);
    if (avail >= need) return Status::Ok();
    char sizes[96];
    std::snprintf(sizes, sizeof(sizes), "%.2f MiB free, the step needs at least %.2f MiB more",
                  avail / 1048576.0, need / 1048576.0);
    return Status::ResourceExhausted("offload nvme " + dir_ + ": " + what + ": the file system has " +
                                     sizes + " (free space there, then reopen the store; the last "
                                     "committed step is intact)");
  }

  // The caller's wait (Commit, AwaitCommit), or a background commit's hidden time.
  void AccountCommitLocked(Clock::time_point t0, bool background = false) TRAIND_REQUIRES(mu_) {
    const double s = Since(t0);
    if (background) {
      stats_.background_io_seconds += s;
      return;
    }
    stats_.commit_seconds += s;
    stats_.io_wait_seconds += s;
  }

  // Reads the record of one committed version into *record (header + payload) and checks it.
  Status ReadVersion(const StateKey& key, const Version& version, std::string* record) {
    const auto t0 = Clock::now();
    rocksdb::ReadOptions ro;
    // Our CRC32C covers every payload (hardware instructions); RocksDB's blob checksum is a
    // software CRC in Debian's build and would cost more than the read itself. SST blocks (the
    // index records, small values) keep theirs: they are read with paranoid_checks anyway.
    ro.verify_checksums = false;
    ro.fill_cache = false;
    rocksdb::PinnableSlice value(record);
    const std::string what = "offload nvme " + dir_ + ": chunk " + key.ToString() + " (epoch " +
                             std::to_string(version.epoch) + ")";
    rocksdb::Status s = db_->Get(ro, db_->DefaultColumnFamily(), DataKey(key, version.epoch), &value);
    Status st;
    if (s.IsNotFound())
      st = Status::DataLoss(what + ": its record is missing from the database (index says it exists)");
    else
      st = FromRocksDb(s, what);
    if (st.ok()) {
      st = CheckValue(KeyId(key), value.ToStringView(), version.bytes, what);
      if (st.ok() && value.IsPinned()) record->assign(value.data(), value.size());  // not in *record yet
    }
    if (st.code() == Status::Code::kDataLoss)
      st = Status::DataLoss(st.message() + " [record in " +
                            LocateRecord(db_.get(), dir_, DataKey(key, version.epoch)) + "]");
    MutexLock l(&mu_);
    stats_.background_io_seconds += Since(t0);
    return st;
  }

  void WriterLoop(int index) {
    for (;;) {
      WriteTask task;
      {
        MutexLock l(&mu_);
        while (!shutdown_ && write_queues_[index].empty()) work_cv_.Wait(&mu_);
        if (shutdown_) return;
        task = std::move(write_queues_[index].front());
        write_queues_[index].pop_front();
      }
      const auto t0 = Clock::now();
      const std::string id = KeyId(task.key);
      EncodeValueHeader(id, task.buf->data(), task.bytes);
      const uint32_t crc = GetFixed32(task.buf->data() + 4);
      rocksdb::WriteBatch batch;
      batch.Put(DataKey(task.key, task.epoch), rocksdb::Slice(*task.buf));
      batch.Put(IndexKey(task.key, task.epoch), EncodeIndexValue(task.bytes, crc));
      rocksdb::WriteOptions wo;
      wo.disableWAL = true;  // durability comes from the flush in Commit
      Status st = FromRocksDb(db_->Write(wo, &batch), "writing chunk " + task.key.ToString() + " to " + dir_);
      pool_.Put(std::move(task.buf));
      MutexLock l(&mu_);
      stats_.background_io_seconds += Since(t0);
      if (!st.ok() && write_error_.ok()) write_error_ = st;
      pending_write_bytes_ -= task.bytes;
      state_cv_.NotifyAll();
    }
  }

  void ReaderLoop() {
    for (;;) {
      StateKey key;
      RecordReadAhead::SlotPtr slot;
      {
        MutexLock l(&mu_);
        slot = read_ahead_.Next(&mu_, &key);
        if (!slot) return;
      }
      auto data = pool_.Get(kValueHeaderBytes + slot->entry.bytes);
      Status st = ReadVersion(key, slot->entry, data.get());
      MutexLock l(&mu_);
      read_ahead_.Finish(&mu_, slot, std::move(st), std::move(data));
    }
  }

  const std::string dir_;
  const StoreOptions options_;
  const std::unique_ptr<rocksdb::DB> db_;
  const std::shared_ptr<rocksdb::Statistics> statistics_;
  BufferPool pool_;

  mutable Mutex mu_;
  CondVar work_cv_;   // writer threads: new work or shutdown
  CondVar state_cv_;  // callers: queue room, writes drained
  bool shutdown_ TRAIND_GUARDED_BY(mu_) = false;
  std::map<StateKey, Version> committed_ TRAIND_GUARDED_BY(mu_);
  std::map<StateKey, Version> pending_ TRAIND_GUARDED_BY(mu_);
  uint64_t committed_epoch_ TRAIND_GUARDED_BY(mu_) = 0;  // 0: nothing committed
  uint64_t next_epoch_ TRAIND_GUARDED_BY(mu_) = 1;
  int64_t step_ TRAIND_GUARDED_BY(mu_) = -1;
  std::vector<std::deque<WriteTask>> write_queues_ TRAIND_GUARDED_BY(mu_);
  size_t pending_write_bytes_ TRAIND_GUARDED_BY(mu_) = 0;
  RecordReadAhead read_ahead_ TRAIND_GUARDED_BY(mu_);
  Status write_error_ TRAIND_GUARDED_BY(mu_);  // first error of a write-behind task
  Status failed_ TRAIND_GUARDED_BY(mu_);       // sticky: writes and commits return it
  OptimizerStateStoreStats stats_ TRAIND_GUARDED_BY(mu_);
  bool committing_ TRAIND_GUARDED_BY(mu_) = false;    // CommitInBackground until AwaitCommit
  Status background_status_ TRAIND_GUARDED_BY(mu_);  // its result
  std::vector<std::thread> threads_;
  std::thread commit_thread_;  // touched only by the caller's thread (CommitInBackground, AwaitCommit)
};

}  // namespace

Result<std::unique_ptr<engine::OptimizerStateStore>> MakeRocksDbStore(const std::string& dir_in,
                                                                      const StoreOptions& options) {
  TRAIND_RETURN_IF_ERROR(ValidateOptions(options));
  if (dir_in.empty()) return Status::InvalidArgument("offload dir is empty");
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  TRAIND_RETURN_IF_ERROR(PrepareDir(dir, options.create_if_missing));
  TRAIND_RETURN_IF_ERROR(CheckStoreLayout(dir, "rocksdb"));
  rocksdb::Options ropts = MakeRocksOptions(options);
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(ropts, dir, &raw);
  if (!s.ok()) {
    Status st = FromRocksDb(s, "opening the offload store " + dir);
    if (s.IsIOError() && st.message().find("lock") != std::string::npos)
      return Status::FailedPrecondition(st.message() + " (is another process using this offload dir?)");
    return st;
  }
  StoreOptions resolved = options;
  if (resolved.write_threads == 0) resolved.write_threads = 1;  // offload.h: write_threads
  auto store = std::make_unique<RocksDbStore>(dir, resolved, std::unique_ptr<rocksdb::DB>(raw), ropts.statistics);
  TRAIND_RETURN_IF_ERROR(store->Recover());
  store->Start();
  return std::unique_ptr<engine::OptimizerStateStore>(std::move(store));
}

}  // namespace traind::offload
