// offload: nvme, value-log variant (MakeValueLogStore; offload/README.md "The value-log store").
// Chunk payloads live in preallocated segment files written and read with O_DIRECT from reused
// aligned buffers; each chunk owns two slots (A/B) of its rounded size and a step writes the slot
// that is not the committed one. RocksDB (in dir/index) holds only the index (key -> slots, which
// one is committed, CRC32C) and the commit record, written in one synced WriteBatch after the
// segment files are fdatasync'ed: a crash at any point leaves the last committed step.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "crc32c.h"
#include "format.h"
#include "read_ahead.h"
#include "traind/engine/mutex.h"
#include "options.h"
#include "prepare_dir.h"
#include "rocksdb_status.h"
#include "value_log_format.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

namespace fs = std::filesystem;
using engine::OptimizerStateStoreStats;
using engine::StateChunkInfo;
using Clock = std::chrono::steady_clock;

// Slots smaller than this are written and read through the page cache (a second, buffered file
// descriptor; slots are 4 KiB-aligned, so no page is shared with a direct-I/O slot): one O_DIRECT
// request per small chunk costs a device round trip each (2,000 chunks of 512 bytes took 14 s
// in the contract test, 0.3 s buffered); the commit's fdatasync makes them durable all the same.
constexpr uint64_t kDirectMinBytes = uint64_t{1} << 20;
// Free space kept for the index database (memtable flushes, MANIFEST, WAL) on top of what a
// step allocates: the same margin as the RocksDB store (its README "Errors": Debian's librocksdb
// asserts after an ENOSPC, so RocksDB must never be the one to find the disk full).
constexpr uint64_t kFreeMargin = uint64_t{8} << 20;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }





// 4096-aligned buffers (posix_memalign) of a multiple of 4096 bytes, reused: fresh multi-MiB
// buffers cost a page fault per 4 KiB on first touch. At most `cap_bytes` are kept.
struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
struct AlignedBuf {
  std::unique_ptr<char, FreeDeleter> p;
  size_t capacity = 0;
  char* data() const { return p.get(); }
};

class AlignedPool {
 public:
  explicit AlignedPool(size_t cap_bytes) : cap_(cap_bytes) {}
  AlignedBuf Get(size_t capacity) {
    {
      MutexLock l(&mu_);
      for (size_t i = free_.size(); i-- > 0;) {
        if (free_[i].capacity >= capacity && free_[i].capacity <= 2 * capacity + kAlign) {
          AlignedBuf b = std::move(free_[i]);
          free_[i] = std::move(free_.back());
          free_.pop_back();
          held_ -= b.capacity;
          return b;
        }
      }
    }
    void* p = nullptr;
    if (::posix_memalign(&p, kAlign, capacity) != 0) std::abort();  // as operator new would
    AlignedBuf b;
    b.p.reset(static_cast<char*>(p));
    b.capacity = capacity;
    return b;
  }
  void Put(AlignedBuf b) {
    if (!b.p) return;
    MutexLock l(&mu_);
    while (!free_.empty() && held_ + b.capacity > cap_) {
      held_ -= free_.front().capacity;
      free_.erase(free_.begin());
    }
    if (b.capacity > cap_) return;
    held_ += b.capacity;
    free_.push_back(std::move(b));
  }

 private:
  Mutex mu_;
  const size_t cap_;
  std::vector<AlignedBuf> free_ TRAIND_GUARDED_BY(mu_);
  size_t held_ TRAIND_GUARDED_BY(mu_) = 0;
};

struct Segment {
  int fd = -1;   // O_DIRECT (where the file system allows it)
  int bfd = -1;  // buffered: slots under kDirectMinBytes
  std::string path;
  uint64_t size = 0;            // bytes allocated (fallocate'd) so far
  bool dirty = false;           // written since the last commit: fdatasync'ed by the next one
  std::map<uint64_t, uint64_t> free;  // offset -> length of free extents below `size`
};

struct WriteTask {
  StateKey key;
  int fd = -1;
  Loc loc;
  AlignedBuf buf;  // payload, zero-padded to capacity
  size_t bytes = 0;
  size_t capacity = 0;
};

// Read-ahead reads the committed slot (capacity bytes) into a pooled aligned buffer, checked.
using SlotReadAhead = ReadAhead<Entry, AlignedBuf>;

rocksdb::Options MakeIndexOptions() {
  rocksdb::Options r;
  r.create_if_missing = true;
  r.paranoid_checks = true;
  r.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  r.keep_log_file_num = 2;
  r.max_background_jobs = 1;
  r.write_buffer_size = 4 << 20;  // index records are 70-600 bytes: a memtable holds many steps
  r.compression = rocksdb::kNoCompression;
  r.bottommost_compression = rocksdb::kNoCompression;
  r.statistics = rocksdb::CreateDBStatistics();
  return r;
}

class ValueLogStore final : public engine::OptimizerStateStore {
 public:
  ValueLogStore(std::string dir, const StoreOptions& o, std::unique_ptr<rocksdb::DB> db,
                std::shared_ptr<rocksdb::Statistics> statistics)
      : dir_(std::move(dir)),
        options_(o),
        segment_bytes_(RoundUp(o.blob_file_bytes)),
        db_(std::move(db)),
        statistics_(std::move(statistics)),
        pool_(o.max_pending_write_bytes + o.max_prefetch_bytes + 2 * RoundUp(o.max_chunk_bytes)),
        write_queues_(o.write_threads),
        read_ahead_(o.max_prefetch_bytes) {}

  ~ValueLogStore() override {
    if (commit_thread_.joinable()) commit_thread_.join();
    {
      MutexLock l(&mu_);
      shutdown_ = true;
      work_cv_.NotifyAll();
      state_cv_.NotifyAll();
      read_ahead_.Shutdown(&mu_);
    }
    for (auto& t : threads_) t.join();
    db_->Close();
    MutexLock l(&mu_);
    for (auto& [n, seg] : segments_) {
      if (seg.bfd >= 0 && seg.bfd != seg.fd) ::close(seg.bfd);
      if (seg.fd >= 0) ::close(seg.fd);
    }
  }

  // Reads the commit record and the index, opens the segment files, rebuilds the free extents
  // (everything no committed entry owns: slots of a step that never committed are free again),
  // truncates each segment after its last owned slot and deletes segments that own nothing.
  Status Recover() {
    MutexLock l(&mu_);
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kCommitKey, &v);
    uint64_t epoch = 0;
    if (s.ok()) {
      if (!DecodeCommit(v, &epoch, &step_))
        return Status::DataLoss("offload valuelog " + dir_ + ": the commit record is damaged");
    } else if (!s.IsNotFound()) {
      return FromRocksDb(s, "reading the commit record in " + dir_ + "/index");
    }
    epoch_ = epoch;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek("i"); it->Valid() && it->key().starts_with("i"); it->Next()) {
      StateKey key;
      uint64_t unused = 0;
      Entry e;
      if (!ParseRecordKey(it->key().ToStringView(), &key, &unused) || !DecodeEntry(it->value().ToStringView(), &e))
        return Status::DataLoss("offload valuelog " + dir_ + ": a damaged index record");
      committed_.emplace(std::move(key), e);
    }
    TRAIND_RETURN_IF_ERROR(FromRocksDb(it->status(), "reading the index of " + dir_));
    // Segment files on disk.
    std::error_code ec;
    for (const auto& de : fs::directory_iterator(dir_, ec)) {
      uint32_t number = 0;
      if (!de.is_regular_file(ec) || !ParseSegmentName(de.path().filename().string(), &number)) continue;
      Segment seg;
      seg.path = de.path().string();
      segments_.emplace(number, std::move(seg));
      next_segment_ = std::max(next_segment_, number + 1);
    }
    if (ec) return Status::Unavailable("offload valuelog " + dir_ + ": listing it: " + ec.message());
    // What each segment's committed entries own.
    std::map<uint32_t, std::map<uint64_t, uint64_t>> used;
    for (const auto& [key, e] : committed_) {
      for (const Loc& loc : e.slot) {
        if (!segments_.count(loc.file))
          return Status::DataLoss("offload valuelog " + dir_ + ": chunk " + key.ToString() +
                                  ": its segment file " + dir_ + "/" + SegmentName(loc.file) + " is missing");
        used[loc.file][loc.offset] = e.capacity;
      }
    }
    for (auto it2 = segments_.begin(); it2 != segments_.end();) {
      Segment& seg = it2->second;
      auto u = used.find(it2->first);
      if (u == used.end()) {  // owns nothing: a step that never committed, or all chunks moved
        ::unlink(seg.path.c_str());
        it2 = segments_.erase(it2);
        continue;
      }
      uint64_t end = 0;
      for (const auto& [off, len] : u->second) {
        if (off > end) seg.free.emplace(end, off - end);
        end = std::max(end, off + len);
      }
      TRAIND_RETURN_IF_ERROR(OpenSegmentLocked(seg, /*create=*/false));
      struct stat st;
      if (::fstat(seg.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < end)
        return Status::DataLoss("offload valuelog " + dir_ + ": segment file " + seg.path + " is shorter (" +
                                std::to_string(st.st_size) + " bytes) than its chunks need (" +
                                std::to_string(end) + ")");
      if (static_cast<uint64_t>(st.st_size) > end && ::ftruncate(seg.fd, static_cast<off_t>(end)) != 0)
        return ErrnoStatus(errno, "truncating " + seg.path);
      seg.size = end;
      ++it2;
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
    if (committing_) {
      ++stats_.prefetch_dropped;
      return;
    }
    if (!PrefetchLocked(key) && !read_ahead_.Queued(&mu_, key)) ++stats_.prefetch_dropped;
  }

  bool PrefetchLocked(const StateKey& key) TRAIND_REQUIRES(mu_) {
    auto it = committed_.find(key);
    return it != committed_.end() && read_ahead_.Queue(&mu_, key, it->second, it->second.capacity);
  }

  Status Read(const StateKey& key, void* dst, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    const auto t0 = Clock::now();
    Entry entry;
    int fd = -1;
    SlotReadAhead::SlotPtr slot;
    {
      MutexLock l(&mu_);
      TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("Read"));
      TRAIND_RETURN_IF_ERROR(FindCommitted(committed_, key, bytes, "offload valuelog " + dir_, step_, &entry));
      fd = FdFor(segments_.at(entry.slot[entry.current].file), entry.capacity);
      slot = read_ahead_.Take(&mu_, key, &stats_);
    }
    Status st;
    if (slot) {
      st = slot->status;
      if (st.ok()) std::memcpy(dst, slot->data.data(), bytes);
      pool_.Put(std::move(slot->data));
    } else if (reinterpret_cast<uintptr_t>(dst) % kAlign == 0 && bytes == entry.capacity) {
      st = ReadEntry(key, entry, fd, static_cast<char*>(dst));  // straight into the caller's buffer
    } else {
      AlignedBuf buf = pool_.Get(entry.capacity);
      st = ReadEntry(key, entry, fd, buf.data());
      if (st.ok()) std::memcpy(dst, buf.data(), bytes);
      pool_.Put(std::move(buf));
    }
    MutexLock l(&mu_);
    stats_.io_wait_seconds += Since(t0);
    if (st.ok()) stats_.read_bytes += bytes;
    return st;
  }

  Status Write(const StateKey& key, const void* src, size_t bytes) override {
    TRAIND_RETURN_IF_ERROR(ValidateKey(key));
    if (bytes > options_.max_chunk_bytes)
      return Status::InvalidArgument("offload valuelog " + dir_ + ": chunk " + key.ToString() + " is " +
                                     std::to_string(bytes) + " bytes, max_chunk_bytes is " +
                                     std::to_string(options_.max_chunk_bytes));
    const uint64_t capacity = Capacity(bytes);
    WriteTask task;
    task.key = key;
    task.bytes = bytes;
    task.capacity = capacity;
    task.buf = pool_.Get(capacity);
    std::memcpy(task.buf.data(), src, bytes);
    std::memset(task.buf.data() + bytes, 0, capacity - bytes);
    const size_t queue = std::hash<std::string>{}(KeyId(key)) % static_cast<size_t>(options_.write_threads);
    const auto t0 = Clock::now();
    MutexLock l(&mu_);
    Status st = CheckNotCommittingLocked("Write");
    if (st.ok()) st = CheckFailedLocked();
    if (!st.ok()) {
      pool_.Put(std::move(task.buf));
      return st;
    }
    bool waited = false;
    while (!shutdown_ && pending_write_bytes_ > 0 && pending_write_bytes_ + bytes > options_.max_pending_write_bytes) {
      waited = true;
      state_cv_.Wait(&mu_);
    }
    if (waited) stats_.io_wait_seconds += Since(t0);
    st = CheckFailedLocked();
    // The slot to write: the committed entry's other slot, the pending entry's slot, or two new
    // slots when the key is new or its rounded size changed.
    Entry pending;
    auto p = pending_.find(key);
    auto c = committed_.find(key);
    // An earlier pending version of this step in slots of its own (new key or resized): free once
    // the writers are drained, if this write moves to other slots.
    const bool p_own_slots = p != pending_.end() && (c == committed_.end() || c->second.capacity != p->second.capacity);
    if (!st.ok()) {
    } else if (p != pending_.end() && p->second.capacity == capacity) {
      pending = p->second;
    } else {
      if (c != committed_.end() && c->second.capacity == capacity) {
        pending = c->second;
        pending.current = 1 - c->second.current;
      } else {
        pending.capacity = capacity;
        pending.current = 0;
        st = AllocateLocked(capacity, key, &pending.slot[0]);
        if (st.ok()) {
          st = AllocateLocked(capacity, key, &pending.slot[1]);
          if (!st.ok()) FreeLocked(pending.slot[0], capacity);
        }
        if (!st.ok()) failed_ = st;
      }
      if (st.ok() && p_own_slots) {
        release_after_drain_.push_back({p->second.slot[0], p->second.capacity});
        release_after_drain_.push_back({p->second.slot[1], p->second.capacity});
      }
    }
    if (!st.ok()) {
      pool_.Put(std::move(task.buf));
      return st;
    }
    pending.bytes = bytes;
    pending.crc = 0;  // the writer fills it in
    task.loc = pending.slot[pending.current];
    Segment& seg = segments_.at(task.loc.file);
    task.fd = FdFor(seg, capacity);
    seg.dirty = true;
    pending_[key] = pending;
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

  void CommitInBackground(int64_t step, std::vector<StateKey> then_prefetch) override {
    if (commit_thread_.joinable()) commit_thread_.join();
    MutexLock l(&mu_);
    if (committing_ && !background_status_.ok()) return;
    committing_ = true;
    commit_thread_ = std::thread(&ValueLogStore::BackgroundCommit, this, step, std::move(then_prefetch));
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

  int64_t CommittedStep() const override {
    MutexLock l(&mu_);
    return step_;
  }

  Result<std::vector<StateChunkInfo>> List() const override {
    MutexLock l(&mu_);
    TRAIND_RETURN_IF_ERROR(CheckNotCommittingLocked("List"));
    std::vector<StateChunkInfo> out;
    out.reserve(committed_.size());
    for (const auto& [k, e] : committed_) out.push_back({k, e.bytes});
    return out;
  }

  OptimizerStateStoreStats Stats() const override {
    OptimizerStateStoreStats s;
    {
      MutexLock l(&mu_);
      s = stats_;
      s.pending_write_bytes = pending_write_bytes_;
      s.device_written_bytes = segment_written_bytes_;
    }
    s.device_written_bytes += statistics_->getTickerCount(rocksdb::FLUSH_WRITE_BYTES) +
                              statistics_->getTickerCount(rocksdb::COMPACT_WRITE_BYTES) +
                              statistics_->getTickerCount(rocksdb::WAL_FILE_BYTES);
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_regular_file(ec)) s.store_bytes += it->file_size(ec);
    }
    return s;
  }

  std::string Describe() const override { return "nvme:" + dir_ + " (value log)"; }

 private:
  static Status ErrnoStatus(int e, const std::string& what) {
    const std::string m = what + ": " + std::strerror(e);
    if (e == ENOSPC || e == EDQUOT) return Status::ResourceExhausted("offload valuelog " + m);
    if (e == EROFS || e == EACCES || e == EPERM) return Status::FailedPrecondition("offload valuelog " + m);
    return Status::Unavailable("offload valuelog " + m);
  }

  // Opens seg.path with O_DIRECT; where the file system refuses it (tmpfs: EINVAL) falls back to
  // buffered I/O and says so once.
  Status OpenSegmentLocked(Segment& seg, bool create) TRAIND_REQUIRES(mu_) {
    const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
    int fd = -1;
    if (direct_io_) {
      fd = ::open(seg.path.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno == EINVAL) {
        direct_io_ = false;
        std::fprintf(stderr, "offload valuelog %s: O_DIRECT refused (%s: the file system has no direct I/O): "
                     "using buffered I/O\n",
                     dir_.c_str(), std::strerror(errno));
      }
    }
    // (A refused O_DIRECT open with O_CREAT may have created the file already: no O_EXCL then.)
    if (!direct_io_) fd = ::open(seg.path.c_str(), flags & ~O_EXCL, 0644);
    if (fd < 0) return ErrnoStatus(errno, "opening segment file " + seg.path);
    seg.fd = fd;
    seg.bfd = direct_io_ ? ::open(seg.path.c_str(), O_RDWR | O_CLOEXEC) : fd;
    if (seg.bfd < 0) return ErrnoStatus(errno, "opening segment file " + seg.path);
    return Status::Ok();
  }

  // A `capacity`-byte slot for `key`: a free extent of an existing segment (first fit), else
  // appended to the newest segment (a new one past segment_bytes_), preallocated with fallocate.
  Status AllocateLocked(uint64_t capacity, const StateKey& key, Loc* out) TRAIND_REQUIRES(mu_) {
    for (auto& [number, seg] : segments_) {
      for (auto f = seg.free.begin(); f != seg.free.end(); ++f) {
        if (f->second < capacity) continue;
        out->file = number;
        out->offset = f->first;
        const uint64_t off = f->first, len = f->second;
        seg.free.erase(f);
        if (len > capacity) seg.free.emplace(off + capacity, len - capacity);
        return Status::Ok();
      }
    }
    TRAIND_RETURN_IF_ERROR(CheckFreeSpaceLocked(capacity, "allocating a slot for chunk " + key.ToString()));
    Segment* seg = segments_.empty() ? nullptr : &segments_.rbegin()->second;
    uint32_t number = segments_.empty() ? 0 : segments_.rbegin()->first;
    if (seg == nullptr || (seg->size > 0 && seg->size + capacity > segment_bytes_)) {
      number = next_segment_++;
      Segment fresh;
      fresh.path = dir_ + "/" + SegmentName(number);
      TRAIND_RETURN_IF_ERROR(OpenSegmentLocked(fresh, /*create=*/true));
      seg = &segments_.emplace(number, std::move(fresh)).first->second;
      dir_dirty_ = true;
    }
    int rc = 0;
    if (capacity >= kDirectMinBytes) {
      rc = ::posix_fallocate(seg->fd, static_cast<off_t>(seg->size), static_cast<off_t>(capacity));
    } else {
      // Small slots get zeros written through the page cache instead: preallocated but never
      // written ranges stay "unwritten" extents, and thousands of them alternating with written
      // ones made deleting a segment take seconds (one discard per extent on this ext4).
      static const std::vector<char> zeros(kDirectMinBytes, 0);
      for (uint64_t done = 0; rc == 0 && done < capacity;) {
        const ssize_t n = ::pwrite(seg->bfd, zeros.data(), capacity - done, static_cast<off_t>(seg->size + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) rc = n < 0 ? errno : EIO;
        else done += static_cast<uint64_t>(n);
      }
      if (rc == 0) segment_written_bytes_ += capacity;
    }
    if (rc != 0)
      return ErrnoStatus(rc, dir_ + ": preallocating " + std::to_string(capacity) + " bytes in " + seg->path +
                                 " for chunk " + key.ToString() +
                                 (rc == ENOSPC ? " (free space there, then reopen the store; the last committed "
                                                 "step is intact)" : ""));
    out->file = number;
    out->offset = seg->size;
    seg->size += capacity;
    return Status::Ok();
  }

  // The descriptor for a slot of `capacity` bytes in `seg`.
  static int FdFor(const Segment& seg, uint64_t capacity) { return capacity >= kDirectMinBytes ? seg.fd : seg.bfd; }

  // Returns a slot to its segment's free extents (merged with its neighbours).
  void FreeLocked(Loc loc, uint64_t capacity) TRAIND_REQUIRES(mu_) {
    auto s = segments_.find(loc.file);
    if (s == segments_.end()) return;
    auto& free = s->second.free;
    uint64_t off = loc.offset, len = capacity;
    auto next = free.lower_bound(off);
    if (next != free.end() && off + len == next->first) {
      len += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free.erase(prev);
      }
    }
    free.emplace(off, len);
  }

  Status CheckNotCommittingLocked(const char* call) const TRAIND_REQUIRES(mu_) {
    if (!committing_) return Status::Ok();
    return Status::FailedPrecondition("offload valuelog " + dir_ + ": " + call +
                                      " while a background commit is in flight (AwaitCommit first)");
  }

  Status CheckFailedLocked() TRAIND_REQUIRES(mu_) {
    if (failed_.ok() && !write_error_.ok()) failed_ = write_error_;
    if (failed_.ok()) return Status::Ok();
    return Status(failed_.code(), failed_.message() + " [the store stopped accepting writes; reopen it]");
  }

  // RESOURCE_EXHAUSTED when dir_'s file system has less than `more` + 8 MiB free (the margin is
  // the index database's: see kFreeMargin).
  Status CheckFreeSpaceLocked(uint64_t more, const std::string& what) TRAIND_REQUIRES(mu_) {
    struct statvfs vfs;
    // Unknown (ramfs reports no size at all): let the writes tell.
    if (::statvfs(dir_.c_str(), &vfs) != 0 || vfs.f_blocks == 0) return Status::Ok();
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    const uint64_t need = more + kFreeMargin;
    if (avail >= need) return Status::Ok();
    char sizes[96];
    std::snprintf(sizes, sizeof(sizes), "%.2f MiB free, the step needs at least %.2f MiB more",
                  avail / 1048576.0, need / 1048576.0);
    return Status::ResourceExhausted("offload valuelog " + dir_ + ": " + what + ": the file system has " + sizes +
                                     " (free space there, then reopen the store; the last committed step "
                                     "is intact)");
  }

  void AccountCommitLocked(Clock::time_point t0, bool background = false) TRAIND_REQUIRES(mu_) {
    const double s = Since(t0);
    if (background) {
      stats_.background_io_seconds += s;
      return;
    }
    stats_.commit_seconds += s;
    stats_.io_wait_seconds += s;
  }

  std::string Where(const Entry& e) const {
    return "segment file " + dir_ + "/" + SegmentName(e.slot[e.current].file) + " at offset " +
           std::to_string(e.slot[e.current].offset) + " (slot " + (e.current ? "B" : "A") + ", " +
           std::to_string(e.capacity) + " bytes)";
  }

  // Reads the committed slot of `e` (capacity bytes) into the aligned buf and checks its CRC.
  Status ReadEntry(const StateKey& key, const Entry& e, int fd, char* buf) {
    const auto t0 = Clock::now();
    const Loc loc = e.slot[e.current];
    const std::string what = "offload valuelog " + dir_ + ": chunk " + key.ToString();
    Status st;
    uint64_t done = 0;
    while (done < e.capacity) {
      const ssize_t n = ::pread(fd, buf + done, e.capacity - done, static_cast<off_t>(loc.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        st = ErrnoStatus(errno, dir_ + ": reading chunk " + key.ToString() + " from " + Where(e));
        break;
      }
      if (n == 0) {
        st = Status::DataLoss(what + ": " + Where(e) + " ends early (the file is truncated)");
        break;
      }
      done += static_cast<uint64_t>(n);
    }
    if (st.ok()) {
      const std::string id = KeyId(key);
      const uint32_t crc = Crc32c(Crc32c(0, id.data(), id.size()), buf, e.bytes);
      if (crc != e.crc) {
        char m[80];
        std::snprintf(m, sizeof(m), "crc32c mismatch (stored %08x, computed %08x)", e.crc, crc);
        st = Status::DataLoss(what + ": " + m + " [" + Where(e) + "]");
      }
    }
    MutexLock l(&mu_);
    stats_.background_io_seconds += Since(t0);
    return st;
  }

  void BackgroundCommit(int64_t step, std::vector<StateKey> keys) {
    Status st = CommitNow(step, /*background=*/true);
    MutexLock l(&mu_);
    if (st.ok()) {
      for (const StateKey& key : keys) {
        if (!ValidateKey(key).ok() || !PrefetchLocked(key)) break;
      }
    }
    if (background_status_.ok()) background_status_ = st;
  }

  Status CommitNow(int64_t step, bool background) {
    if (step < 0)
      return Status::InvalidArgument("offload valuelog " + dir_ + ": Commit step must be >= 0, got " +
                                     std::to_string(step));
    const auto t0 = Clock::now();
    std::vector<std::pair<int, std::string>> to_sync;
    bool sync_dir = false;
    rocksdb::WriteBatch batch;
    {
      MutexLock l(&mu_);
      while (!shutdown_ && pending_write_bytes_ > 0) state_cv_.Wait(&mu_);
      read_ahead_.DrainAndClear(&mu_);
      for (const auto& r : release_after_drain_) FreeLocked(r.first, r.second);
      release_after_drain_.clear();
      Status failed = CheckFailedLocked();
      if (failed.ok()) {
        failed = CheckFreeSpaceLocked(0, "committing step " + std::to_string(step));
        if (!failed.ok()) failed_ = failed;
      }
      if (!failed.ok()) {
        AccountCommitLocked(t0, background);
        return failed;
      }
      for (auto& [number, seg] : segments_) {
        if (!seg.dirty) continue;
        to_sync.emplace_back(seg.bfd, seg.path);  // (fdatasync covers the file, either descriptor)
        seg.dirty = false;
      }
      sync_dir = dir_dirty_;
      dir_dirty_ = false;
      for (const auto& [key, e] : pending_) batch.Put(IndexKey(key, 0), EncodeEntry(e));
      batch.Put(kCommitKey, EncodeCommit(epoch_ + 1, step));
    }
    const std::string what = "committing step " + std::to_string(step) + " in " + dir_;
    // 1. The step's data is durable in its slots (and the new segment files' names in dir_).
    Status st;
    for (const auto& [fd, path] : to_sync) {
      if (::fdatasync(fd) != 0) {
        st = ErrnoStatus(errno, what + " (fdatasync " + path + ")");
        break;
      }
    }
    if (st.ok() && sync_dir) {
      const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0 || ::fsync(dfd) != 0) st = ErrnoStatus(errno, what + " (fsync of the directory)");
      if (dfd >= 0) ::close(dfd);
    }
    // 2. Then the index entries and the commit record, one synced batch: the step exists exactly
    // when this is durable.
    if (st.ok()) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      st = FromRocksDb(db_->Write(wo, &batch), what + " (index and commit record)");
    }
    MutexLock l(&mu_);
    if (!st.ok()) {
      if (failed_.ok()) failed_ = st;
      AccountCommitLocked(t0, background);
      return st;
    }
    for (auto& [key, e] : pending_) {
      auto [pos, inserted] = committed_.try_emplace(key, e);
      if (!inserted) {
        if (pos->second.capacity != e.capacity) {  // resized: the old slots are free now
          FreeLocked(pos->second.slot[0], pos->second.capacity);
          FreeLocked(pos->second.slot[1], pos->second.capacity);
        }
        pos->second = e;
      }
    }
    pending_.clear();
    ++epoch_;
    step_ = step;
    ++stats_.commits;
    AccountCommitLocked(t0, background);
    return Status::Ok();
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
      const uint32_t crc = Crc32c(Crc32c(0, id.data(), id.size()), task.buf.data(), task.bytes);
      Status st;
      uint64_t done = 0;
      while (done < task.capacity) {
        const ssize_t n = ::pwrite(task.fd, task.buf.data() + done, task.capacity - done,
                                   static_cast<off_t>(task.loc.offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          st = ErrnoStatus(n < 0 ? errno : EIO, dir_ + ": writing chunk " + task.key.ToString() + " to " +
                                                    SegmentName(task.loc.file) + " at offset " +
                                                    std::to_string(task.loc.offset));
          break;
        }
        done += static_cast<uint64_t>(n);
      }
      pool_.Put(std::move(task.buf));
      MutexLock l(&mu_);
      stats_.background_io_seconds += Since(t0);
      segment_written_bytes_ += done;
      if (!st.ok() && write_error_.ok()) write_error_ = st;
      // The pending entry may have moved to other slots since (a resize): only record the CRC
      // for the slot this task wrote.
      auto p = pending_.find(task.key);
      if (p != pending_.end() && p->second.slot[p->second.current].file == task.loc.file &&
          p->second.slot[p->second.current].offset == task.loc.offset && p->second.bytes == task.bytes)
        p->second.crc = crc;
      pending_write_bytes_ -= task.bytes;
      state_cv_.NotifyAll();
    }
  }

  void ReaderLoop() {
    for (;;) {
      StateKey key;
      SlotReadAhead::SlotPtr slot;
      int fd = -1;
      {
        MutexLock l(&mu_);
        slot = read_ahead_.Next(&mu_, &key);
        if (!slot) return;
        fd = FdFor(segments_.at(slot->entry.slot[slot->entry.current].file), slot->entry.capacity);
      }
      AlignedBuf data = pool_.Get(slot->entry.capacity);
      Status st = ReadEntry(key, slot->entry, fd, data.data());
      MutexLock l(&mu_);
      read_ahead_.Finish(&mu_, slot, std::move(st), std::move(data));
    }
  }

  const std::string dir_;
  const StoreOptions options_;
  const uint64_t segment_bytes_;
  const std::unique_ptr<rocksdb::DB> db_;
  const std::shared_ptr<rocksdb::Statistics> statistics_;
  AlignedPool pool_;

  mutable Mutex mu_;
  CondVar work_cv_;
  CondVar state_cv_;
  bool shutdown_ TRAIND_GUARDED_BY(mu_) = false;
  bool direct_io_ TRAIND_GUARDED_BY(mu_) = true;
  std::map<uint32_t, Segment> segments_ TRAIND_GUARDED_BY(mu_);
  uint32_t next_segment_ TRAIND_GUARDED_BY(mu_) = 1;
  bool dir_dirty_ TRAIND_GUARDED_BY(mu_) = false;
  std::map<StateKey, Entry> committed_ TRAIND_GUARDED_BY(mu_);
  std::map<StateKey, Entry> pending_ TRAIND_GUARDED_BY(mu_);
  std::vector<std::pair<Loc, uint64_t>> release_after_drain_ TRAIND_GUARDED_BY(mu_);
  uint64_t epoch_ TRAIND_GUARDED_BY(mu_) = 0;
  int64_t step_ TRAIND_GUARDED_BY(mu_) = -1;
  std::vector<std::deque<WriteTask>> write_queues_ TRAIND_GUARDED_BY(mu_);
  size_t pending_write_bytes_ TRAIND_GUARDED_BY(mu_) = 0;
  uint64_t segment_written_bytes_ TRAIND_GUARDED_BY(mu_) = 0;
  SlotReadAhead read_ahead_ TRAIND_GUARDED_BY(mu_);
  Status write_error_ TRAIND_GUARDED_BY(mu_);
  Status failed_ TRAIND_GUARDED_BY(mu_);
  OptimizerStateStoreStats stats_ TRAIND_GUARDED_BY(mu_);
  bool committing_ TRAIND_GUARDED_BY(mu_) = false;
  Status background_status_ TRAIND_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
  std::thread commit_thread_;
};

}  // namespace

Result<std::unique_ptr<engine::OptimizerStateStore>> MakeValueLogStore(const std::string& dir_in,
                                                                       const StoreOptions& options) {
  TRAIND_RETURN_IF_ERROR(ValidateOptions(options));
  if (dir_in.empty()) return Status::InvalidArgument("offload dir is empty");
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  TRAIND_RETURN_IF_ERROR(PrepareDir(dir, options.create_if_missing));
  TRAIND_RETURN_IF_ERROR(CheckStoreLayout(dir, "valuelog"));
  rocksdb::Options ropts = MakeIndexOptions();
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(ropts, dir + "/index", &raw);
  if (!s.ok()) {
    Status st = FromRocksDb(s, "opening the offload store index " + dir + "/index");
    if (s.IsIOError() && st.message().find("lock") != std::string::npos)
      return Status::FailedPrecondition(st.message() + " (is another process using this offload dir?)");
    return st;
  }
  StoreOptions resolved = options;
  if (resolved.write_threads == 0) resolved.write_threads = 2;  // offload.h: write_threads
  auto store = std::make_unique<ValueLogStore>(dir, resolved, std::unique_ptr<rocksdb::DB>(raw), ropts.statistics);
  TRAIND_RETURN_IF_ERROR(store->Recover());
  store->Start();
  return std::unique_ptr<engine::OptimizerStateStore>(std::move(store));
}

}  // namespace traind::offload
