// JobStore over RocksDB (see job_store.h for the key layout, the checks at open, the event-number
// reservation and the repair).
#include "job_store.h"

#include <rocksdb/sst_file_reader.h>
#include <rocksdb/write_batch.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "status_map.h"

namespace traind::server {
namespace {

namespace fs = std::filesystem;

std::string JobKey(const std::string& id) { return "job/" + id; }
std::string EventKey(const std::string& id, int64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020" PRId64, seq);
  return "ev/" + id + "/" + buf;
}
std::string MarkKey(const std::string& id) { return "meta/seq/" + id; }
constexpr char kOrderKey[] = "meta/submit_order";
constexpr char kBootKey[] = "meta/boot_id";
constexpr char kCleanKey[] = "meta/clean";
constexpr char kQuarantine[] = "quarantine/";

bool StartsWith(const rocksdb::Slice& s, const char* prefix) { return s.starts_with(prefix); }

// A non-negative decimal number, or -1.
int64_t ParseNumber(const std::string& text) {
  if (text.empty() || text.size() > 18) return -1;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

// ev/<id>/<20 digits> → (id, seq); false for another shape.
bool ParseEventKey(const std::string& key, std::string* id, int64_t* seq) {
  if (key.rfind("ev/", 0) != 0) return false;
  const size_t slash = key.rfind('/');
  if (slash <= 3 || key.size() - slash - 1 != 20) return false;
  *id = key.substr(3, slash - 3);
  // 20 digits, the first two 0 (numbers stay below 10^18).
  *seq = key.compare(slash + 1, 2, "00") == 0 ? ParseNumber(key.substr(slash + 3)) : -1;
  return *seq > 0 && id->find('/') == std::string::npos;
}

// job-000042 → 42 (0 for another shape).
int64_t JobNumber(const std::string& id) {
  if (id.rfind("job-", 0) != 0) return 0;
  return std::max<int64_t>(0, ParseNumber(id.substr(4)));
}

std::string ThisBoot() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

rocksdb::Options StoreOptions(rocksdb::Env* env) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.keep_log_file_num = 3;
  if (env) options.env = env;
  return options;
}

Status Damaged(const std::string& dir, const std::string& what) {
  return Status::DataLoss("the job store " + dir + " is damaged: " + what);
}

// Why a record does not parse ("" when it does). Keys outside the layout are left alone.
std::string CheckRecord(const rocksdb::Slice& key_slice, const rocksdb::Slice& value) {
  const std::string key = key_slice.ToString();
  if (StartsWith(key_slice, "job/")) {
    v1::Job job;
    if (!job.ParseFromArray(value.data(), static_cast<int>(value.size()))) return "does not parse as a job record";
    if (job.id() != key.substr(4)) return "holds job " + job.id() + ", not " + key.substr(4);
    return "";
  }
  if (StartsWith(key_slice, "ev/")) {
    std::string id;
    int64_t seq = 0;
    if (!ParseEventKey(key, &id, &seq)) return "is not an event key (ev/<job>/<20 digits>)";
    v1::JobEvent ev;
    if (!ev.ParseFromArray(value.data(), static_cast<int>(value.size()))) return "does not parse as an event";
    if (ev.sequence() != seq) return "holds event number " + std::to_string(ev.sequence());
    return "";
  }
  if (key == kOrderKey || StartsWith(key_slice, "meta/seq/")) {
    if (ParseNumber(value.ToString()) < 0) return "is not a number";
  }
  return "";
}

// Reads every record (each block's checksum verified) and checks it parses. Bad records go to
// `bad` (key, why); a block that cannot be read is the returned Corruption.
rocksdb::Status ScanRecords(rocksdb::DB* db, std::vector<std::pair<std::string, std::string>>* bad) {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (StartsWith(it->key(), kQuarantine)) continue;
    std::string why = CheckRecord(it->key(), it->value());
    if (!why.empty()) bad->emplace_back(it->key().ToString(), why);
  }
  return it->status();
}

// A fixed-width big-endian number over keys, for the bisection in SalvageTable.
constexpr size_t kKeyWidth = 128;
using WideKey = std::array<uint8_t, kKeyWidth>;
WideKey Widen(const std::string& key) {
  WideKey w{};
  std::copy_n(key.begin(), std::min(key.size(), kKeyWidth), w.begin());
  return w;
}
std::string Narrow(const WideKey& w) { return std::string(w.begin(), w.end()); }
WideKey Midpoint(const WideKey& a, const WideKey& b) {
  // (a + b) / 2 with the carry kept in `carry`.
  WideKey sum{};
  unsigned carry = 0;
  for (size_t i = kKeyWidth; i-- > 0;) {
    const unsigned v = unsigned{a[i]} + unsigned{b[i]} + carry;
    sum[i] = static_cast<uint8_t>(v & 0xff);
    carry = v >> 8;
  }
  WideKey mid{};
  for (size_t i = 0; i < kKeyWidth; ++i) {
    mid[i] = static_cast<uint8_t>((sum[i] >> 1) | (carry << 7));
    carry = sum[i] & 1;
  }
  return mid;
}

struct SalvageResult {
  bool opened = false;
  int64_t records = 0;
  int64_t damaged_regions = 0;
};

// The records of a table file that RepairDB set aside as damaged, without its unreadable blocks.
// A block that fails its checksum stops an iterator; the first key past it is found by bisection
// over the key space (a Seek lands in the block that would hold its target, so "Seek(k) reads
// fine" is false up to the damaged block's last key and true after it).
SalvageResult SalvageTable(const std::string& path,
                           const std::function<void(const rocksdb::Slice&, const rocksdb::Slice&)>& emit) {
  SalvageResult r;
  rocksdb::Options options;
  rocksdb::SstFileReader reader(options);
  if (!reader.Open(path).ok()) return r;
  r.opened = true;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  auto reads_fine = [&](const WideKey& k) {
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(ro));
    it->Seek(Narrow(k));
    return it->status().ok();
  };
  std::string start, last;
  bool have_last = false;
  for (int round = 0; round < 100000; ++round) {
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(ro));
    if (start.empty()) it->SeekToFirst();
    else it->Seek(start);
    for (; it->Valid(); it->Next()) {
      if (have_last && it->key().compare(last) <= 0) continue;
      emit(it->key(), it->value());
      last = it->key().ToString();
      have_last = true;
      r.records++;
    }
    if (it->status().ok()) break;
    r.damaged_regions++;
    WideKey lo = have_last ? Widen(last) : WideKey{};
    WideKey hi;
    hi.fill(0xff);
    if (!reads_fine(hi)) break;  // the damage reaches the end of the file
    while (true) {
      const WideKey mid = Midpoint(lo, hi);
      if (mid == lo) break;
      if (reads_fine(mid)) hi = mid;
      else lo = mid;
    }
    std::string next = Narrow(hi);
    if (!start.empty() && next <= start) break;  // no progress: give up on the rest
    start = std::move(next);
  }
  return r;
}

std::string UtcStamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}


Status CheckStore(const std::string& dir, rocksdb::Env* env, const std::string& this_boot) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::Ok();  // a first start
  if (!fs::exists(dir + "/CURRENT", ec)) {
    // RocksDB would take this for a new store and delete its tables as obsolete.
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const std::string ext = entry.path().extension().string();
      if (name.rfind("MANIFEST-", 0) == 0 || ext == ".sst" || ext == ".log")
        return Damaged(dir, "CURRENT is missing (it names the live MANIFEST) but " + name + " is there");
    }
    return Status::Ok();
  }
  // Read-only: nothing is written to (or deleted from) a store that may be damaged.
  // The WAL: RocksDB's default recovery (point in time) stops at the first bad record and drops
  // the rest of the log, which is right for what a power loss tears off the end. When no power
  // loss can have happened since the last writer (a clean close, or the same boot: a kill leaves at
  // most a truncated last record, never a garbled one), a bad record before the end is damage. So
  // the first open tolerates only a truncated tail; when that finds a bad record, a point-in-time
  // open tells WAL damage from other damage and the boot record says which case this is.
  rocksdb::Options strict_options = StoreOptions(env);
  strict_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status strict_status = rocksdb::DB::OpenForReadOnly(strict_options, dir, &raw);
  rocksdb::Status s = strict_status;
  if (strict_status.IsCorruption()) s = rocksdb::DB::OpenForReadOnly(StoreOptions(env), dir, &raw);
  if (!s.ok()) {
    const std::string m = s.ToString();
    if (s.IsCorruption() || (s.IsIOError() && m.find("No such file") != std::string::npos)) return Damaged(dir, m);
    return FromRocksDb(s, "opening the job store " + dir);
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  if (!strict_status.ok()) {
    std::string boot, clean;
    const bool no_power_loss = db->Get(rocksdb::ReadOptions(), kCleanKey, &clean).ok() ||
                               (db->Get(rocksdb::ReadOptions(), kBootKey, &boot).ok() && !boot.empty() && boot == this_boot);
    if (no_power_loss) {
      return Damaged(dir, "a WAL (*.log) record before the end of the log is bad (" + strict_status.ToString() +
                              "); a normal start would drop every write after it");
    }
  }
  // A table file the MANIFEST does not list is normally a leftover of a flush or compaction cut
  // short (its records are in the WAL or in live tables) and RocksDB deletes it; when it holds
  // records the store does not have, the MANIFEST lost edits and deleting it would lose them.
  std::vector<rocksdb::LiveFileMetaData> live;
  db->GetLiveFilesMetaData(&live);
  std::set<std::string> live_names;
  for (const auto& f : live) live_names.insert(fs::path(f.name).filename().string());
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".sst" || live_names.count(name)) continue;
    rocksdb::Options o;
    rocksdb::SstFileReader reader(o);
    if (!reader.Open(entry.path().string()).ok()) continue;  // a torn leftover
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (it->key() == rocksdb::Slice(kCleanKey)) continue;
      std::string v;
      if (db->Get(rocksdb::ReadOptions(), it->key(), &v).IsNotFound()) {
        return Damaged(dir, "table file " + name + " holds records (" + it->key().ToString() +
                                ", ...) that the MANIFEST does not list: the MANIFEST lost edits");
      }
    }
  }
  s = db->VerifyChecksum();
  if (!s.ok()) return Damaged(dir, s.ToString());
  std::vector<std::pair<std::string, std::string>> bad;
  s = ScanRecords(db.get(), &bad);
  if (!s.ok()) return Damaged(dir, s.ToString());
  if (!bad.empty()) {
    return Damaged(dir, "record " + bad[0].first + " " + bad[0].second +
                            (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more records)" : ""));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir, const JobStoreOptions& opts) {
  {
    // The checks read the store while holding its lock: a traind serving from it would change it
    // under them (and is reported as such, not as damage).
    std::error_code ec;
    rocksdb::Env* env = opts.env ? opts.env : rocksdb::Env::Default();
    rocksdb::FileLock* lock = nullptr;
    if (fs::is_directory(dir, ec)) {
      rocksdb::Status s = env->LockFile(dir + "/LOCK", &lock);
      if (!s.ok()) {
        return Status::Unavailable("the job store " + dir + " is in use (" + s.ToString() +
                                   "): is another traind running on this state dir?");
      }
    }
    Status checked = CheckStore(dir, opts.env, opts.boot_id.empty() ? ThisBoot() : opts.boot_id);
    if (lock) (void)env->UnlockFile(lock);
    TRAIND_RETURN_IF_ERROR(checked);
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(StoreOptions(opts.env), dir, &db);
  if (!s.ok()) {
    const std::string m = s.ToString();
    if (s.IsIOError() && (m.find("lock") != std::string::npos || m.find("LOCK") != std::string::npos))
      return Status::Unavailable("the job store " + dir + " is in use (" + m + "): is another traind running on this state dir?");
    if (s.IsCorruption() || (s.IsIOError() && m.find("No such file") != std::string::npos))
      return Damaged(dir, m);
    return FromRocksDb(s, "opening the job store " + dir);
  }
  std::unique_ptr<JobStore> store(new JobStore(db, opts));
  TRAIND_RETURN_IF_ERROR(store->RecoverSequences());
  store->opened_ = true;
  return store;
}

Status JobStore::RecoverSequences() {
  std::string prev_boot, clean;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kBootKey, &prev_boot);
  if (!s.ok() && !s.IsNotFound()) return FromRocksDb(s, "reading " + std::string(kBootKey));
  s = db_->Get(rocksdb::ReadOptions(), kCleanKey, &clean);
  if (!s.ok() && !s.IsNotFound()) return FromRocksDb(s, "reading " + std::string(kCleanKey));
  const bool was_clean = s.ok();
  const std::string boot = options_.boot_id.empty() ? ThisBoot() : options_.boot_id;
  // Unsynced writes can only have been lost if the kernel that held them is gone.
  const bool may_have_lost = !was_clean && (boot.empty() || prev_boot != boot);

  std::map<std::string, int64_t> marks;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("meta/seq/"); it->Valid() && it->key().starts_with("meta/seq/"); it->Next()) {
    marks[it->key().ToString().substr(9)] = ParseNumber(it->value().ToString());
  }
  TRAIND_RETURN_IF_ERROR(FromRocksDb(it->status(), "reading event number marks"));
  TRAIND_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, LoadJobs());
  MutexLock lock(&mu_);
  rocksdb::WriteBatch batch;
  int64_t jumped = 0;
  for (v1::Job& job : jobs) {
    auto m = marks.find(job.id());
    if (m == marks.end()) continue;
    if (may_have_lost && m->second > job.last_sequence()) {
      const int64_t last = job.last_sequence();
      v1::JobEvent ev;
      ev.set_sequence(m->second);
      ev.set_time_unix_ms(NowMs());
      ev.set_message("traind restarted after the machine stopped without a clean shutdown (power loss?): events after #" +
                     std::to_string(last) + " that were not yet on disk are lost, and numbers " +
                     std::to_string(last + 1) + " to " + std::to_string(m->second) +
                     " are not used again (this event takes the last of them)");
      job.set_last_sequence(m->second);
      batch.Put(JobKey(job.id()), job.SerializeAsString());
      batch.Put(EventKey(job.id(), ev.sequence()), ev.SerializeAsString());
      ++jumped;
    }
    reserved_[job.id()] = m->second;
  }
  batch.Put(kBootKey, boot);
  batch.Delete(kCleanKey);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  TRAIND_RETURN_IF_ERROR(FromRocksDb(db_->Write(wo, &batch), "recording this boot in the job store"));
  if (jumped > 0) {
    spdlog::warn("job store: the machine stopped without a clean shutdown since the last start; {} job(s) continue "
                 "their event numbers after the reserved ones (no number is used twice)", jumped);
  }
  return Status::Ok();
}

JobStore::~JobStore() {
  if (!db_) return;
  if (opened_) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    (void)db_->Put(wo, kCleanKey, "1");
  }
  db_->Close();
}

Status JobStore::Write(const v1::Job& job, const v1::JobEvent* event, bool sync, int64_t submit_order) {
  rocksdb::WriteBatch batch;
  batch.Put(JobKey(job.id()), job.SerializeAsString());
  if (submit_order > 0) batch.Put(kOrderKey, std::to_string(submit_order));
  int64_t new_mark = -1;
  if (event) {
    batch.Put(EventKey(job.id(), event->sequence()), event->SerializeAsString());
    if (options_.reserve_sequences) {
      MutexLock lock(&mu_);
      const int64_t mark = reserved_.count(job.id()) ? reserved_[job.id()] : 0;
      if (sync) {
        // Everything up to here is on disk once this returns: no reservation is needed.
        if (mark != event->sequence()) new_mark = event->sequence();
      } else if (event->sequence() > mark) {
        new_mark = event->sequence() + kSequenceReserve;
        sync = true;
      }
    }
    if (new_mark >= 0) batch.Put(MarkKey(job.id()), std::to_string(new_mark));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  TRAIND_RETURN_IF_ERROR(FromRocksDb(db_->Write(wo, &batch), "writing job " + job.id()));
  if (new_mark >= 0) {
    MutexLock lock(&mu_);
    reserved_[job.id()] = new_mark;
  }
  return Status::Ok();
}

Result<std::vector<v1::Job>> JobStore::LoadJobs() {
  std::vector<v1::Job> jobs;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("job/"); it->Valid() && it->key().starts_with("job/"); it->Next()) {
    v1::Job job;
    if (!job.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())))
      return Status::DataLoss("job record " + it->key().ToString() + " does not parse");
    jobs.push_back(std::move(job));
  }
  TRAIND_RETURN_IF_ERROR(FromRocksDb(it->status(), "reading job records"));
  return jobs;
}

Result<int64_t> JobStore::LastSubmitOrder() {
  std::string v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kOrderKey, &v);
  if (s.IsNotFound()) return int64_t{0};
  TRAIND_RETURN_IF_ERROR(FromRocksDb(s, "reading the submit order"));
  const int64_t order = ParseNumber(v);
  if (order < 0) return Status::DataLoss(std::string(kOrderKey) + " is not a number");
  return order;
}

Result<std::vector<v1::JobEvent>> JobStore::ReadEvents(const std::string& id, int64_t from, size_t limit) {
  std::vector<v1::JobEvent> out;
  const std::string prefix = "ev/" + id + "/";
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(EventKey(id, from < 1 ? 1 : from)); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    v1::JobEvent ev;
    if (!ev.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())))
      return Status::DataLoss("event " + it->key().ToString() + " does not parse");
    out.push_back(std::move(ev));
    if (limit > 0 && out.size() >= limit) break;
  }
  TRAIND_RETURN_IF_ERROR(FromRocksDb(it->status(), "reading events of " + id));
  return out;
}

Result<RepairReport> JobStore::Repair(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::NotFound("no job store at " + dir + ": nothing to repair");
  RepairReport report;
  rocksdb::Env* env = rocksdb::Env::Default();
  {
    // Hold the store's lock while copying: a running traind would change it under the copy.
    rocksdb::FileLock* lock = nullptr;
    rocksdb::Status s = env->LockFile(dir + "/LOCK", &lock);
    if (!s.ok())
      return Status::Unavailable("the job store " + dir + " is in use (" + s.ToString() +
                                 "): stop the traind that runs on this state dir, then repair");
    std::string backup = dir + ".backup-" + UtcStamp();
    for (int i = 2; fs::exists(backup, ec); ++i) backup = dir + ".backup-" + UtcStamp() + "-" + std::to_string(i);
    fs::copy(dir, backup, fs::copy_options::recursive, ec);
    (void)env->UnlockFile(lock);
    if (ec) {
      return Status::Unavailable("cannot back up " + dir + " to " + backup + " (" + ec.message() +
                                 "); the store is unchanged: free disk space and try again");
    }
    report.backup_dir = backup;
  }
  const std::string with_backup = " (the store as it was is in " + report.backup_dir + ")";

  // Files RepairDB sets aside go to <dir>/lost/; only this run's are read back below.
  std::set<std::string> lost_before;
  for (const auto& e : fs::directory_iterator(dir + "/lost", ec)) lost_before.insert(e.path().filename().string());
  ec.clear();
  rocksdb::Options options = StoreOptions(nullptr);
  rocksdb::Status s = rocksdb::RepairDB(dir, options);
  if (!s.ok()) return Status::DataLoss("rocksdb::RepairDB on " + dir + " failed: " + s.ToString() + with_backup);
  {
    // What RepairDB skipped in WAL files ("dropping N bytes") and set aside goes to its info log.
    std::ifstream log(dir + "/LOG");
    std::string line;
    int shown = 0;
    while (std::getline(log, line)) {
      const bool dropped = line.find("dropping") != std::string::npos;
      if ((dropped || line.find("ignoring") != std::string::npos) && shown++ < 10) {
        const size_t at = line.find(dropped ? "Log #" : "Table #");
        report.notes.push_back("rocksdb::RepairDB: " + line.substr(at == std::string::npos ? 0 : at));
      }
    }
  }

  rocksdb::DB* raw = nullptr;
  s = rocksdb::DB::Open(options, dir, &raw);
  if (!s.ok()) return Status::DataLoss("opening " + dir + " after rocksdb::RepairDB: " + s.ToString() + with_backup);
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions sync;
  sync.sync = true;

  // 1. Table files RepairDB could not use whole: everything but their unreadable blocks comes back
  //    (keys the repaired store already has keep its value: RepairDB kept the newer ones).
  for (const auto& e : fs::directory_iterator(dir + "/lost", ec)) {
    const std::string name = e.path().filename().string();
    if (lost_before.count(name) || e.path().extension() != ".sst") continue;
    rocksdb::WriteBatch batch;
    int64_t added = 0;
    SalvageResult r = SalvageTable(e.path().string(), [&](const rocksdb::Slice& k, const rocksdb::Slice& v) {
      std::string existing;
      if (db->Get(rocksdb::ReadOptions(), k, &existing).IsNotFound()) {
        batch.Put(k, v);
        ++added;
      }
    });
    if (!r.opened) {
      report.unreadable_tables++;
      report.notes.push_back("table file lost/" + name + " cannot be read at all (its footer or index is damaged)");
      continue;
    }
    s = db->Write(sync, &batch);
    if (!s.ok()) return Status::DataLoss("writing back records of lost/" + name + ": " + s.ToString() + with_backup);
    report.salvaged_records += added;
    report.damaged_regions += r.damaged_regions;
    report.notes.push_back("table file lost/" + name + ": " + std::to_string(r.records) + " records read back (" +
                           std::to_string(added) + " not already in the store), " +
                           std::to_string(r.damaged_regions) + " damaged stretch(es) skipped");
  }
  ec.clear();

  // 2. Records that do not parse → quarantine/<key> (kept for a post-mortem, never served).
  std::vector<std::pair<std::string, std::string>> bad;
  std::set<std::string> quarantined_marks;
  s = ScanRecords(db.get(), &bad);
  if (!s.ok()) return Status::DataLoss("reading " + dir + " after rocksdb::RepairDB: " + s.ToString() + with_backup);
  {
    rocksdb::WriteBatch batch;
    for (const auto& [key, why] : bad) {
      std::string value;
      if (!db->Get(rocksdb::ReadOptions(), key, &value).ok()) continue;
      batch.Put(kQuarantine + key, value);
      batch.Delete(key);
      if (key.rfind("meta/seq/", 0) == 0) quarantined_marks.insert(key.substr(9));
      if (report.quarantined_keys.size() < 10) report.quarantined_keys.push_back(key + " (" + why + ")");
      report.quarantined++;
    }
    s = db->Write(sync, &batch);
    if (!s.ok()) return Status::DataLoss("quarantining records: " + s.ToString() + with_backup);
  }

  // 3. Consistent numbering: every job's last_sequence covers its newest event and the event at
  //    last_sequence exists (else a watcher would find a hole at the end); submit orders above
  //    every job id seen, so that a job whose record is gone does not get its id reused.
  std::map<std::string, int64_t> newest_event, marks;
  std::set<std::string> ids_with_events;
  int64_t max_job_number = 0, stored_order = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek("ev/"); it->Valid() && it->key().starts_with("ev/"); it->Next()) {
      std::string id;
      int64_t seq = 0;
      if (!ParseEventKey(it->key().ToString(), &id, &seq)) continue;
      newest_event[id] = std::max(newest_event[id], seq);
      report.events++;
    }
    for (it->Seek("meta/seq/"); it->Valid() && it->key().starts_with("meta/seq/"); it->Next())
      marks[it->key().ToString().substr(9)] = ParseNumber(it->value().ToString());
    std::string v;
    if (db->Get(rocksdb::ReadOptions(), kOrderKey, &v).ok()) stored_order = std::max<int64_t>(0, ParseNumber(v));
  }
  std::vector<v1::Job> jobs;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek("job/"); it->Valid() && it->key().starts_with("job/"); it->Next()) {
      v1::Job job;
      if (job.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) jobs.push_back(std::move(job));
    }
  }
  rocksdb::WriteBatch fix;
  std::set<std::string> job_ids;
  for (v1::Job& job : jobs) {
    job_ids.insert(job.id());
    max_job_number = std::max({max_job_number, JobNumber(job.id()), job.submit_order()});
    const int64_t newest = newest_event.count(job.id()) ? newest_event[job.id()] : 0;
    const int64_t top = std::max(job.last_sequence(), newest);
    if (top > newest) {
      // Events up to `top` were handed out but the newest are gone: a message after them (a new
      // number, never one a watcher may have seen) marks the loss.
      v1::JobEvent ev;
      ev.set_sequence(top + 1);
      ev.set_time_unix_ms(NowMs());
      ev.set_message("traind --repair-store: the job store was damaged; events " + std::to_string(newest + 1) +
                     " to " + std::to_string(top) + " of this job are lost");
      fix.Put(EventKey(job.id(), ev.sequence()), ev.SerializeAsString());
      job.set_last_sequence(top + 1);
      fix.Put(JobKey(job.id()), job.SerializeAsString());
      report.jobs_fixed++;
      report.notes.push_back(job.id() + ": events " + std::to_string(newest + 1) + " to " + std::to_string(top) +
                             " are lost; a message event #" + std::to_string(top + 1) + " says so");
    } else if (job.last_sequence() < newest) {
      job.set_last_sequence(newest);
      fix.Put(JobKey(job.id()), job.SerializeAsString());
      report.jobs_fixed++;
      report.notes.push_back(job.id() + ": its record was older than its events; last_sequence set to " +
                             std::to_string(newest));
    }
    // A mark that did not parse (quarantined above): assume the worst, numbers handed out up to a
    // full reservation ahead.
    if (quarantined_marks.count(job.id()))
      fix.Put(MarkKey(job.id()), std::to_string(job.last_sequence() + kSequenceReserve));
  }
  for (const auto& [id, newest] : newest_event) {
    if (job_ids.count(id)) continue;
    max_job_number = std::max(max_job_number, JobNumber(id));
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    int64_t n = 0;
    for (it->Seek("ev/" + id + "/"); it->Valid() && it->key().starts_with("ev/" + id + "/"); it->Next()) ++n;
    report.orphan_events += n;
    report.notes.push_back(id + ": its job record is lost; its " + std::to_string(n) +
                           " event(s) are kept but no job shows them");
  }
  if (max_job_number > stored_order) fix.Put(kOrderKey, std::to_string(max_job_number));
  // A clean-close marker may come back from an old table: the next start must not trust it.
  fix.Delete(kCleanKey);
  s = db->Write(sync, &fix);
  if (!s.ok()) return Status::DataLoss("writing the repaired numbering: " + s.ToString() + with_backup);
  report.jobs = static_cast<int64_t>(jobs.size());
  report.events -= report.orphan_events;

  // 4. It must now pass the checks a normal start makes.
  bad.clear();
  s = db->VerifyChecksum();
  if (s.ok()) s = ScanRecords(db.get(), &bad);
  if (!s.ok() || !bad.empty()) {
    return Status::DataLoss("the repaired store still fails its checks: " +
                            (s.ok() ? "record " + bad[0].first + " " + bad[0].second : s.ToString()) + with_backup);
  }
  s = db->Close();
  if (!s.ok()) return Status::DataLoss("closing the repaired store: " + s.ToString() + with_backup);
  return report;
}

int RepairStoreMain(const std::string& state_dir) {
  const std::string dir = state_dir + "/db";
  std::printf("traind --repair-store: repairing the job store %s\n", dir.c_str());
  std::fflush(stdout);
  auto r = JobStore::Repair(dir);
  if (!r.ok()) {
    std::fprintf(stderr, "traind --repair-store: %s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("backup of the store as it was: %s\n", r->backup_dir.c_str());
  for (const std::string& note : r->notes) std::printf("  %s\n", note.c_str());
  for (const std::string& key : r->quarantined_keys) std::printf("  quarantined: %s\n", key.c_str());
  std::printf(
      "repaired: %lld job(s) kept with %lld event(s); %lld record(s) that do not parse quarantined "
      "(dropped from use, kept under quarantine/); %lld record(s) read back from damaged table files "
      "(%lld damaged stretch(es) lost, %lld table file(s) unreadable); %lld orphan event(s)\n",
      static_cast<long long>(r->jobs), static_cast<long long>(r->events), static_cast<long long>(r->quarantined),
      static_cast<long long>(r->salvaged_records), static_cast<long long>(r->damaged_regions),
      static_cast<long long>(r->unreadable_tables), static_cast<long long>(r->orphan_events));
  std::printf("start traind as usual: jobs that were running resume from their last checkpoint\n");
  return 0;
}

}  // namespace traind::server
