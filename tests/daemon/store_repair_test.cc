// The job store under damage and power loss (issue 17, "Hardening"):
// - a damaged <state-dir>/db (garbled table bytes, truncated MANIFEST, missing CURRENT, a record
//   that does not parse) stops the real traind at start with one clear sentence and exit 4, no
//   crash and no serving; `traind --repair-store` backs the store up, repairs it, and the next start
//   serves the jobs whose records survived;
// - after a power loss (unsynced writes dropped by a file system wrapper, as RocksDB's
//   FaultInjectionTestFS does) no event number is handed out twice, through the real JobStore and
//   JobManager; with the reservation off the same scenario does reuse one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "daemon_fixture.h"
#include "job_manager.h"
#include "job_store.h"
#include "metrics.h"
#include "traind/v1/runner.pb.h"

namespace traind::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using traind::testing::CmdResult;
using traind::testing::Daemon;
using traind::testing::MakeTempDir;
using traind::testing::RunCommand;

// ---------------------------------------------------------------------------------------------
// A file system that can lose what was not synced, like a power loss: it remembers each file's
// size at its last Sync/Fsync (RangeSync does not count: sync_file_range promises nothing) and
// DropUnsynced() truncates every file written through it back to that size (0 if never synced).
// Crash() first freezes it: later writes, syncs, renames and deletes (those of the DB's close) do
// nothing, as on a machine that is already off.
class PowerLossFs : public rocksdb::FileSystemWrapper {
 public:
  explicit PowerLossFs(const std::shared_ptr<rocksdb::FileSystem>& base) : FileSystemWrapper(base) {}
  const char* Name() const override { return "PowerLossFs"; }

  void Crash() {
    std::lock_guard<std::mutex> lock(mu_);
    frozen_ = true;
  }
  // Truncates to the synced sizes; returns how many bytes were dropped. Then thaws.
  uint64_t DropUnsynced() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t dropped = 0;
    for (const auto& [name, synced] : synced_) {
      std::error_code ec;
      const uint64_t size = fs::file_size(name, ec);
      if (ec || size <= synced) continue;
      dropped += size - synced;
      fs::resize_file(name, synced, ec);
    }
    synced_.clear();
    frozen_ = false;
    return dropped;
  }
  // A killed process, not a power loss: the kernel keeps what was written. Thaws.
  void Thaw() {
    std::lock_guard<std::mutex> lock(mu_);
    synced_.clear();
    frozen_ = false;
  }
  int64_t syncs() {
    std::lock_guard<std::mutex> lock(mu_);
    return syncs_;
  }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r, rocksdb::IODebugContext* d) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (frozen_) return rocksdb::IOStatus::IOError("powered off");
      synced_[f] = 0;
    }
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &file, d);
    if (s.ok()) r->reset(new File(this, f, std::move(file)));
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* d) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (frozen_) return rocksdb::IOStatus::IOError("powered off");
      std::error_code ec;
      if (!synced_.count(f)) synced_[f] = fs::file_size(f, ec);
    }
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, &file, d);
    if (s.ok()) r->reset(new File(this, f, std::move(file)));
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& from, const std::string& to, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* d) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (frozen_) return rocksdb::IOStatus::OK();
    rocksdb::IOStatus s = target()->RenameFile(from, to, o, d);
    if (s.ok() && synced_.count(from)) {
      synced_[to] = synced_[from];
      synced_.erase(from);
    }
    return s;
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (frozen_) return rocksdb::IOStatus::OK();
    synced_.erase(f);
    return target()->DeleteFile(f, o, d);
  }

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(PowerLossFs* fs, std::string name, std::unique_ptr<rocksdb::FSWritableFile>&& f)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs), name_(std::move(name)) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->Append(data, o, d);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->Append(data, o, v, d);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t off, const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->PositionedAppend(data, off, o, d);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t off, const rocksdb::IOOptions& o,
                                       const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->PositionedAppend(data, off, o, v, d);
    }
    rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->Truncate(size, o, d);
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      return target()->Flush(o, d);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      rocksdb::IOStatus s = target()->Sync(o, d);
      if (s.ok()) fs_->Synced(name_);
      return s;
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (fs_->Frozen()) return rocksdb::IOStatus::OK();
      rocksdb::IOStatus s = target()->Fsync(o, d);
      if (s.ok()) fs_->Synced(name_);
      return s;
    }
    rocksdb::IOStatus Close(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      // Closing a file syncs nothing (PosixWritableFile may truncate away its preallocation).
      return target()->Close(o, d);
    }

   private:
    PowerLossFs* fs_;
    std::string name_;
  };

  bool Frozen() {
    std::lock_guard<std::mutex> lock(mu_);
    return frozen_;
  }
  void Synced(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    std::error_code ec;
    const uint64_t size = fs::file_size(name, ec);
    if (!ec) synced_[name] = size;
    ++syncs_;
  }

  std::mutex mu_;
  bool frozen_ = false;
  std::map<std::string, uint64_t> synced_;  // file → bytes on disk for sure
  int64_t syncs_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Event numbers after a power loss, through JobStore and JobManager (the supervisor is not started
// while events are produced: the test calls the listener methods the supervisor would call).

struct PowerLossOutcome {
  std::map<int64_t, std::string> seen;   // sequence → serialized event, as a watcher saw them before
  std::map<int64_t, std::string> after;  // the same job's events after the restart
  int64_t survived_last = 0;             // the newest event a watcher saw that is still stored
  int64_t resume_seq = 0;                // the number of "traind restarted while this job was running"
                                         // (0: not found)
  std::vector<int64_t> resumed_watch;    // what a client resuming at max(seen) + 1 gets
  uint64_t dropped_bytes = 0;
};

class StoreSequenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-seq");
    data_ = traind::testing::WriteTextData(dir_, 20000);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  JobManagerOptions ManagerOptions() {
    JobManagerOptions o;
    o.supervisor.runner_path = "/bin/false";  // after the restart the job's attempts fail at once
    o.supervisor.max_attempts = 1;
    o.supervisor.stop_grace_seconds = 0;
    o.supervisor.log_dir = dir_;
    o.admission_device.device = "cpu";
    o.admission_device.threads = 1;
    return o;
  }

  // Submit, start, `steps` step events (unsynced, as the runner's are), then traind stops without
  // closing the store: with `power_loss` the store's unsynced writes are dropped too and traind
  // restarts on boot-2, else (kill -9) on the same boot-1.
  PowerLossOutcome Run(bool reserve, int steps, bool power_loss) {
    PowerLossOutcome out;
    auto powerfs = std::make_shared<PowerLossFs>(rocksdb::FileSystem::Default());
    std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(powerfs);
    JobStoreOptions so;
    so.env = env.get();
    so.boot_id = "boot-1";
    so.reserve_sequences = reserve;
    auto metrics = Metrics::Start("127.0.0.1:0", 1e12, int64_t{1} << 34);
    EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
    if (!metrics.ok()) return out;
    std::string id;
    {
      auto store = JobStore::Open(dir_ + "/db", so);
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      if (!store.ok()) return out;
      JobManager jm(ManagerOptions(), store->get(), metrics->get());
      traind::testing::SpecOptions spec;
      spec.train_file = data_;
      spec.output_dir = dir_ + "/runs/seq";
      spec.max_steps = steps;
      v1::SubmitJobRequest req;
      req.set_spec_yaml(traind::testing::TinySpec(spec));
      req.set_base_dir(dir_);
      auto job = jm.Submit("local", req);
      EXPECT_TRUE(job.ok()) << job.status().ToString();
      if (!job.ok()) return out;
      id = job->id();
      jm.OnAttemptStart(id, 1, false);
      for (int i = 1; i <= steps; ++i) {
        v1::RunnerEvent ev;
        ev.mutable_step()->set_step(i);
        ev.mutable_step()->set_max_steps(steps);
        ev.mutable_step()->set_loss(5.0 - 0.01 * i);
        jm.OnRunnerEvent(id, ev);
      }
      // A client follows the job: every event so far reaches it (from the memtable, synced or not).
      v1::WatchJobRequest w;
      w.set_id(id);
      w.set_from_sequence(1);
      Status s = jm.Watch("local", w, [&](const v1::JobEvent& ev, bool) {
        out.seen[ev.sequence()] = ev.SerializeAsString();
        return true;
      }, [] { return false; });
      EXPECT_TRUE(s.ok()) << s.ToString();
      // The power goes here: nothing written from now on reaches the disk (JobManager's and the
      // store's destructors still run, as the process's memory is gone anyway).
      powerfs->Crash();
    }
    if (power_loss) out.dropped_bytes = powerfs->DropUnsynced();
    else powerfs->Thaw();

    so.boot_id = power_loss ? "boot-2" : "boot-1";
    auto store = JobStore::Open(dir_ + "/db", so);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return out;
    {
      // The restarted traind: the job was RUNNING, so Start() appends "traind restarted while this
      // job was running" under the next number AppendLocked hands out.
      JobManager jm(ManagerOptions(), store->get(), metrics->get());
      Status s = jm.Start();
      EXPECT_TRUE(s.ok()) << s.ToString();
      jm.Stop();
      const int64_t from = out.seen.empty() ? 1 : out.seen.rbegin()->first + 1;
      v1::WatchJobRequest w;
      w.set_id(id);
      w.set_from_sequence(from);
      s = jm.Watch("local", w, [&](const v1::JobEvent& ev, bool) {
        out.resumed_watch.push_back(ev.sequence());
        return true;
      }, [] { return false; });
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    auto events = (*store)->ReadEvents(id, 1, 0);
    EXPECT_TRUE(events.ok());
    for (const auto& ev : *events) {
      out.after[ev.sequence()] = ev.SerializeAsString();
      // JobManager::Start's "traind restarted while this job was running ..." (not the store's own
      // "traind restarted after the machine stopped without a clean shutdown ...").
      if (ev.has_message() && ev.message().rfind("traind restarted", 0) == 0 &&
          ev.message().find("without a clean shutdown") == std::string::npos && out.resume_seq == 0)
        out.resume_seq = ev.sequence();
      auto seen = out.seen.find(ev.sequence());
      if (seen != out.seen.end() && seen->second == ev.SerializeAsString()) out.survived_last = ev.sequence();
    }
    return out;
  }

  // Numbers that carry one event before the loss and a different one after it.
  static std::vector<int64_t> Reused(const PowerLossOutcome& o) {
    std::vector<int64_t> reused;
    for (const auto& [seq, bytes] : o.seen) {
      auto it = o.after.find(seq);
      if (it != o.after.end() && it->second != bytes) reused.push_back(seq);
    }
    return reused;
  }

  std::string dir_, data_;
};

TEST_F(StoreSequenceTest, PowerLossNeverReusesAnEventNumber) {
  const PowerLossOutcome o = Run(/*reserve=*/true, 50, /*power_loss=*/true);
  ASSERT_FALSE(o.seen.empty());
  const int64_t max_seen = o.seen.rbegin()->first;
  ASSERT_GT(o.resume_seq, 0) << "no restart event after the restart";
  // The loss happened: the watcher saw events that are no longer stored (without this the test
  // would prove nothing).
  EXPECT_GT(o.dropped_bytes, 0u);
  EXPECT_LT(o.survived_last, max_seen) << "no unsynced event was lost";
  // No number carries two different events, and the first event after the restart is numbered
  // above everything a client may have seen: a client resuming at max_seen + 1 gets it.
  EXPECT_THAT(Reused(o), ::testing::IsEmpty());
  EXPECT_GT(o.resume_seq, max_seen);
  EXPECT_THAT(o.resumed_watch, ::testing::Contains(o.resume_seq));
  // The gap is bounded by the reservation.
  EXPECT_LE(o.resume_seq, o.survived_last + JobStore::kSequenceReserve + 1);
}

TEST_F(StoreSequenceTest, WithoutTheReservationAPowerLossReusesNumbers) {
  // The same scenario with the reservation off (today's code before the fix): step events are
  // written without sync, so after the loss the stored job ends at the last synced event (attempt
  // start, #2) while the watcher saw up to #52; the restarted JobManager numbers its next event
  // last_sequence + 1 = #3, which the watcher saw as step 1: two different events under #3, and a
  // client resuming at #53 never sees the restart message.
  const PowerLossOutcome o = Run(/*reserve=*/false, 50, /*power_loss=*/true);
  ASSERT_FALSE(o.seen.empty());
  const int64_t max_seen = o.seen.rbegin()->first;
  ASSERT_GT(o.resume_seq, 0) << "no restart event after the restart";
  EXPECT_LT(o.survived_last, max_seen);
  EXPECT_THAT(Reused(o), ::testing::Not(::testing::IsEmpty()));
  EXPECT_LE(o.resume_seq, max_seen);
  EXPECT_THAT(o.resumed_watch, ::testing::Not(::testing::Contains(o.resume_seq)));
}

TEST_F(StoreSequenceTest, KillWithoutPowerLossKeepsNumbersDense) {
  // kill -9 of traind on the same boot: the kernel still writes the unsynced events, so nothing
  // is lost and numbers continue densely (recovery_test relies on it).
  const PowerLossOutcome o = Run(/*reserve=*/true, 20, /*power_loss=*/false);
  ASSERT_FALSE(o.seen.empty());
  const int64_t max_seen = o.seen.rbegin()->first;
  ASSERT_GT(o.resume_seq, 0) << "no restart event after the restart";
  EXPECT_EQ(o.survived_last, max_seen);
  EXPECT_EQ(o.resume_seq, max_seen + 1);
  EXPECT_THAT(Reused(o), ::testing::IsEmpty());
}

TEST_F(StoreSequenceTest, ReservationSyncsOncePerThousandEvents) {
  // The cost of the guarantee: unsynced step events stay unsynced except one synced mark per
  // kSequenceReserve numbers. Timed against syncing every event, on this test's disk.
  auto powerfs = std::make_shared<PowerLossFs>(rocksdb::FileSystem::Default());
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(powerfs);
  JobStoreOptions so;
  so.env = env.get();
  auto store = JobStore::Open(dir_ + "/db", so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  constexpr int kEvents = 3000, kSyncedEvents = 300;
  auto run = [&](const std::string& id, bool sync_each, int n) {
    v1::Job job;
    job.set_id(id);
    const int64_t syncs_before = powerfs->syncs();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t seq = 1; seq <= n; ++seq) {
      v1::JobEvent ev;
      ev.set_sequence(seq);
      ev.mutable_step()->set_step(seq);
      job.set_last_sequence(seq);
      EXPECT_TRUE((*store)->Write(job, &ev, sync_each).ok());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::make_pair(powerfs->syncs() - syncs_before, s);
  };
  const auto [reserved_syncs, reserved_s] = run("job-000001", false, kEvents);
  const auto [each_syncs, each_s] = run("job-000002", true, kSyncedEvents);
  std::printf("%d step events with the reservation: %lld syncs, %.1f us/event; %d events synced each: %lld syncs, "
              "%.1f us/event\n",
              kEvents, static_cast<long long>(reserved_syncs), 1e6 * reserved_s / kEvents, kSyncedEvents,
              static_cast<long long>(each_syncs), 1e6 * each_s / kSyncedEvents);
  EXPECT_LE(reserved_syncs, kEvents / JobStore::kSequenceReserve + 1);
  EXPECT_GE(each_syncs, kSyncedEvents);
}

TEST_F(StoreSequenceTest, OpenChecksALargeStore) {
  // Open reads every record (checksums, parse) three times over the WAL: its cost at start.
  constexpr int kJobs = 20, kEvents = 2500;
  {
    auto store = JobStore::Open(dir_ + "/db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (int j = 1; j <= kJobs; ++j) {
      v1::Job job;
      job.set_id("job-" + std::to_string(100000 + j).substr(0, 6));
      job.set_spec_yaml(std::string(2000, 'x'));
      for (int64_t seq = 1; seq <= kEvents; ++seq) {
        v1::JobEvent ev;
        ev.set_sequence(seq);
        ev.mutable_step()->set_step(seq);
        ev.mutable_step()->set_loss(1.0 / static_cast<double>(seq));
        job.set_last_sequence(seq);
        ASSERT_TRUE((*store)->Write(job, &ev, false).ok());
      }
    }
  }
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/db")) bytes += e.is_regular_file() ? e.file_size() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto store = JobStore::Open(dir_ + "/db");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::printf("open with checks: %d events of %d jobs, %.1f MB on disk: %.2f s\n", kJobs * kEvents, kJobs,
              static_cast<double>(bytes) / 1e6, s);
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), static_cast<size_t>(kJobs));
  EXPECT_EQ((*(*store)->ReadEvents((*jobs)[0].id(), 1, 0)).size(), static_cast<size_t>(kEvents));
}

// ---------------------------------------------------------------------------------------------
// Damage on disk, through the real traind binary.

class StoreRepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-repair");
    state_ = dir_ + "/state";
    db_ = state_ + "/db";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A daemon runs one job to the end and stops (SIGTERM); with `flush` its records are then moved
  // from the WAL into one table file, as a later start would do.
  void FinishedJob(int steps = 100, bool flush = true) {
    Daemon d(state_);
    ASSERT_TRUE(d.Start({"--http-listen", "off"}));
    auto c = d.Connect();
    const std::string spec = traind::testing::WriteJobSpec(dir_, "before", [&] {
      traind::testing::SpecOptions o;
      o.train_file = traind::testing::WriteTextData(dir_, 20000);
      o.max_steps = steps;
      o.logging_steps = 1;
      return o;
    }());
    auto job = c->SubmitFile(spec);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    v1::Job done;
    ASSERT_TRUE(traind::testing::WaitFor(*c, job->id(), traind::testing::IsDone, 120, &done));
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
    job_id_ = job->id();
    last_sequence_ = done.last_sequence();
    EXPECT_EQ(d.Stop(), 0);
    if (!flush) return;
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, db_, &raw).ok());
    ASSERT_TRUE(raw->Flush(rocksdb::FlushOptions()).ok());
    ASSERT_TRUE(raw->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr).ok());
    delete raw;
  }

  std::vector<std::string> Files(const std::string& prefix_or_ext) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(db_)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix_or_ext, 0) == 0 || e.path().extension() == prefix_or_ext) out.push_back(e.path());
    }
    return out;
  }

  // traind on the damaged store: must exit 4 at once with the sentence, not serve, not crash.
  void ExpectRefusesToStart(const std::string& what) {
    fs::remove(state_ + "/ports.json");  // the last daemon's
    const auto t0 = std::chrono::steady_clock::now();
    CmdResult r = RunCommand({TRAIND_BIN, "--state-dir", state_, "--listen", "127.0.0.1:0", "--metrics-listen",
                              "127.0.0.1:0", "--http-listen", "off"},
                             60);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("traind on the damaged store: exit %d after %.2f s:\n%s", r.exit_code, s, r.err.c_str());
    EXPECT_EQ(r.exit_code, 4) << "stdout: " << r.out << "\nstderr: " << r.err;  // -1: killed or crashed
    EXPECT_THAT(r.err, HasSubstr("the job store " + db_ + " is damaged"));
    EXPECT_THAT(r.err, HasSubstr(what));
    EXPECT_THAT(r.err, HasSubstr("traind --state-dir " + state_ + " --repair-store"));
    EXPECT_FALSE(fs::exists(state_ + "/ports.json")) << "it served";
    EXPECT_LT(s, 30) << "it hung";
    // A second try fails the same way (no partial state written by the first).
    CmdResult again = RunCommand({TRAIND_BIN, "--state-dir", state_, "--listen", "127.0.0.1:0",
                                  "--metrics-listen", "127.0.0.1:0", "--http-listen", "off"},
                                 60);
    EXPECT_EQ(again.exit_code, 4) << again.err;
  }

  CmdResult Repair() {
    CmdResult r = RunCommand({TRAIND_BIN, "--state-dir", state_, "--repair-store"}, 120);
    std::printf("traind --repair-store: exit %d\n%s%s", r.exit_code, r.out.c_str(), r.err.c_str());
    EXPECT_EQ(r.exit_code, 0) << "stdout: " << r.out << "\nstderr: " << r.err;
    EXPECT_THAT(r.out, HasSubstr("backup of the store as it was: " + db_ + ".backup-"));
    bool backup = false;
    for (const auto& e : fs::directory_iterator(state_)) {
      if (e.path().filename().string().rfind("db.backup-", 0) == 0 && !fs::is_empty(e.path())) backup = true;
    }
    EXPECT_TRUE(backup) << "no db.backup-* in " << state_;
    return r;
  }

  // The next start serves the job: listed, SUCCEEDED, its events readable in order.
  void ExpectServesJob(std::vector<int64_t>* sequences = nullptr) {
    Daemon d(state_);
    ASSERT_TRUE(d.Start({"--http-listen", "off"})) << traind::testing::ReadAll(state_ + "/stderr.log");
    auto c = d.Connect();
    auto list = c->List();
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    bool listed = false;
    for (const auto& j : *list) listed |= j.id() == job_id_;
    EXPECT_TRUE(listed) << job_id_ << " is not listed after the repair";
    auto job = c->Get(job_id_);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
    std::vector<int64_t> seqs;
    Status s = c->Watch(job_id_, 1, false, [&](const v1::JobEvent& ev) {
      seqs.push_back(ev.sequence());
      return true;
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::is_sorted(seqs.begin(), seqs.end()));
    if (sequences) *sequences = seqs;
    EXPECT_EQ(d.Stop(), 0);
  }

  std::string dir_, state_, db_, job_id_;
  int64_t last_sequence_ = 0;
};

TEST_F(StoreRepairTest, GarbledTableBytesAreRefusedThenRepairedKeepingTheRest) {
  ASSERT_NO_FATAL_FAILURE(FinishedJob());
  auto tables = Files(".sst");
  ASSERT_EQ(tables.size(), 1u);
  // Garble 64 bytes early in the file: the first data block (the job's first events, keys sort
  // ev/ < job/ < meta/) fails its checksum; the other blocks are intact.
  {
    std::fstream f(tables[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    const std::string junk(64, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  ExpectRefusesToStart("Corruption");
  CmdResult r = Repair();
  EXPECT_THAT(r.out, HasSubstr("damaged stretch"));
  std::vector<int64_t> seqs;
  ASSERT_NO_FATAL_FAILURE(ExpectServesJob(&seqs));
  // The damaged block's events are gone, the rest are back (more than what the block held), and a
  // message after the newest one says what was lost when the newest were in it.
  EXPECT_FALSE(seqs.empty());
  EXPECT_LT(seqs.size(), static_cast<size_t>(last_sequence_)) << "nothing was lost: the garbling missed";
  EXPECT_GT(seqs.size(), static_cast<size_t>(last_sequence_) / 2) << "more than the damaged block was lost";
  EXPECT_GE(seqs.back(), last_sequence_);
}

TEST_F(StoreRepairTest, GarbledWalRecordIsRefusedThenRepairedKeepingTheRest) {
  // The records are still in the WAL (the daemon closed cleanly, nothing flushed). RocksDB's
  // default recovery would stop at the bad record and silently drop every write after it.
  ASSERT_NO_FATAL_FAILURE(FinishedJob(100, /*flush=*/false));
  auto logs = Files(".log");
  ASSERT_EQ(logs.size(), 1u);
  const uintmax_t size = fs::file_size(logs[0]);
  ASSERT_GT(size, 64u * 1024) << "the WAL is too small to garble one block in its middle";
  {
    std::fstream f(logs[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const std::string junk(64, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  ExpectRefusesToStart("WAL");
  Repair();
  std::vector<int64_t> seqs;
  ASSERT_NO_FATAL_FAILURE(ExpectServesJob(&seqs));
  // One 32 KiB WAL block is lost (each write carries the job record, a few KiB): the events after
  // it are back, the newest included.
  EXPECT_LT(seqs.size(), static_cast<size_t>(last_sequence_));
  EXPECT_GT(seqs.size(), static_cast<size_t>(last_sequence_) / 2);
  EXPECT_EQ(seqs.back(), last_sequence_);
}

TEST_F(StoreRepairTest, TruncatedManifestIsRefusedThenRepairedWithEverything) {
  ASSERT_NO_FATAL_FAILURE(FinishedJob());
  auto manifests = Files("MANIFEST-");
  ASSERT_FALSE(manifests.empty());
  for (const auto& m : manifests) fs::resize_file(m, fs::file_size(m) / 2);
  ExpectRefusesToStart("MANIFEST");
  Repair();
  std::vector<int64_t> seqs;
  ASSERT_NO_FATAL_FAILURE(ExpectServesJob(&seqs));
  ASSERT_EQ(seqs.size(), static_cast<size_t>(last_sequence_));  // nothing lost
  EXPECT_EQ(seqs.back(), last_sequence_);
}

TEST_F(StoreRepairTest, MissingCurrentIsRefusedNotTakenForANewStore) {
  ASSERT_NO_FATAL_FAILURE(FinishedJob());
  fs::remove(db_ + "/CURRENT");
  ExpectRefusesToStart("CURRENT is missing");
  Repair();
  std::vector<int64_t> seqs;
  ASSERT_NO_FATAL_FAILURE(ExpectServesJob(&seqs));
  EXPECT_EQ(seqs.size(), static_cast<size_t>(last_sequence_));
}

TEST_F(StoreRepairTest, UnparsableRecordIsRefusedThenQuarantined) {
  ASSERT_NO_FATAL_FAILURE(FinishedJob());
  // Event #3 of the job and a job record that both hold garbage (valid RocksDB, invalid protobuf).
  char key[64];
  std::snprintf(key, sizeof(key), "ev/%s/%020d", job_id_.c_str(), 3);
  {
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, db_, &raw).ok());
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), key, std::string("\xff\xff\xff", 3)).ok());
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), "job/job-000099", std::string("\x0a\xff", 2)).ok());
    delete raw;
  }
  ExpectRefusesToStart("does not parse");
  CmdResult r = Repair();
  EXPECT_THAT(r.out, HasSubstr("2 record(s) that do not parse quarantined"));
  EXPECT_THAT(r.out, HasSubstr(key));
  EXPECT_THAT(r.out, HasSubstr("1 job(s) kept"));
  std::vector<int64_t> seqs;
  ASSERT_NO_FATAL_FAILURE(ExpectServesJob(&seqs));
  EXPECT_EQ(seqs.size(), static_cast<size_t>(last_sequence_) - 1);
  EXPECT_THAT(seqs, ::testing::Not(::testing::Contains(3)));
  // The bad bytes are kept for a post-mortem, outside what traind serves.
  rocksdb::DB* raw = nullptr;
  rocksdb::Options o;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(o, db_, &raw).ok());
  std::string v;
  EXPECT_TRUE(raw->Get(rocksdb::ReadOptions(), std::string("quarantine/") + key, &v).ok());
  EXPECT_EQ(v, std::string("\xff\xff\xff", 3));
  delete raw;
}

TEST_F(StoreRepairTest, RepairRefusesAStoreInUse) {
  Daemon d(state_);
  ASSERT_TRUE(d.Start({"--http-listen", "off"}));
  CmdResult r = RunCommand({TRAIND_BIN, "--state-dir", state_, "--repair-store"}, 60);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is in use"));
  bool backup = false;
  for (const auto& e : fs::directory_iterator(state_)) backup |= e.path().filename().string().rfind("db.backup-", 0) == 0;
  EXPECT_FALSE(backup);
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(StoreRepairTest, SecondTraindOnAServedStoreIsInUseNotDamaged) {
  Daemon d(state_);
  ASSERT_TRUE(d.Start({"--http-listen", "off"}));
  CmdResult r = RunCommand({TRAIND_BIN, "--state-dir", state_, "--listen", "127.0.0.1:0", "--metrics-listen",
                            "127.0.0.1:0", "--http-listen", "off"},
                           60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is in use"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("damaged")));
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(StoreRepairTest, HelpNamesTheFlag) {
  CmdResult r = RunCommand({TRAIND_BIN, "--help"}, 30);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--repair-store"));
}

}  // namespace
}  // namespace traind::server
