// JobStore: the durable record of every job (RocksDB under <state-dir>/db). Keys:
//   job/<id>                 v1::Job (spec text + canonical JSON, owner, state, plan, summary)
//   ev/<id>/<20-digit seq>   v1::JobEvent, from 1; dense except after a power loss (below)
//   meta/submit_order        the last submit order handed out
//   meta/seq/<id>            the event numbers of <id> reserved up to (a decimal number)
//   meta/boot_id, meta/clean the machine boot that last opened the store; "closed cleanly"
//   quarantine/<key>         records `--repair-store` found unparsable (kept, never served)
// Every write is one WriteBatch; `sync` writes (state changes, submits) are fsynced before they
// return. Thread-safe (RocksDB is); callers serialise writes to one job themselves.
//
// Event numbers survive a power loss (docs/daemon.md, "Event numbers after a power loss"): an
// unsynced event may be handed to a watcher and then vanish with the page cache, so a restarted
// traind must not give its number to another event. Before an unsynced event gets a number above
// the job's reserved mark, the store syncs a new mark kSequenceReserve numbers ahead (in the same
// batch); a synced write brings the mark down to its own number (nothing unsynced remains). When
// the store is opened on another boot of the machine than the one that last wrote it, without a
// clean close in between, each job whose mark is above its last stored event continues after the
// mark: one message event at the mark says which numbers were skipped. On the same boot nothing
// unsynced can have been lost (the kernel still had it), so numbers stay dense after a kill -9.
#pragma once

#include <rocksdb/db.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "traind/engine/status.h"
#include "traind/v1/job.pb.h"
#include "traind/engine/mutex.h"

namespace traind::server {

struct JobStoreOptions {
  // The RocksDB Env (file system) under the store; null = the default. Tests pass one that can
  // drop unsynced writes (a simulated power loss). Not owned; must outlive the store.
  rocksdb::Env* env = nullptr;
  // This machine boot's identity; "" = /proc/sys/kernel/random/boot_id. Tests set it to simulate
  // a reboot.
  std::string boot_id;
  // Reserve event numbers ahead with a synced mark (above). Tests only: false shows the reuse it
  // prevents.
  bool reserve_sequences = true;
};

// What `traind --repair-store` did (JobStore::Repair).
struct RepairReport {
  std::string backup_dir;            // the copy of the store taken before anything changed
  int64_t jobs = 0;                  // job records kept (all parse)
  int64_t events = 0;                // event records kept
  int64_t quarantined = 0;           // records that do not parse, moved to quarantine/<key>
  std::vector<std::string> quarantined_keys;  // the first few
  int64_t salvaged_records = 0;      // records read back from damaged table files
  int64_t damaged_regions = 0;       // unreadable stretches skipped in those files
  int64_t unreadable_tables = 0;     // table files RocksDB set aside that could not be read at all
  int64_t orphan_events = 0;         // events of jobs whose record is gone (kept, not served)
  int64_t jobs_fixed = 0;            // jobs whose last_sequence was raised or given a loss marker
  std::vector<std::string> notes;    // one line per thing worth saying
};

class JobStore {
 public:
  // Number of event numbers reserved per synced mark: at ~1000 step events/s one extra sync per
  // second per running job; after a power loss at most this many numbers are skipped.
  static constexpr int64_t kSequenceReserve = 1000;

  // Opens (creating if missing) the database in `dir` and checks it: every table block's checksum
  // and every record (job/ parses as v1::Job, ev/ as v1::JobEvent with its key's number, meta/
  // numbers as numbers); a directory with table files but no CURRENT is damaged, not new.
  // DATA_LOSS "the job store DIR is damaged: WHAT" when any of that fails (the caller points at
  // `traind --repair-store`), UNAVAILABLE when it is locked by another traind.
  static Result<std::unique_ptr<JobStore>> Open(const std::string& dir, const JobStoreOptions& options = {});
  // Closes; records a clean close (synced) so that the next open, even on another boot, keeps
  // numbers dense.
  ~JobStore();

  // `traind --repair-store`: copies `dir` to <dir>.backup-<UTC time> (first; nothing changes when
  // the copy fails), runs rocksdb::RepairDB, reads back what it can of the table files RepairDB set
  // aside as damaged (all but the unreadable blocks), moves records that do not parse to
  // quarantine/<key>, and makes each job's numbering consistent (last_sequence >= its newest
  // event; a job whose newest events are gone gets a message event after them). Jobs keep their
  // state: a RUNNING one resumes at the next start. NOT_FOUND when `dir` does not exist,
  // UNAVAILABLE when a traind holds it; errors name the backup when one was made.
  static Result<RepairReport> Repair(const std::string& dir);

  // Writes the job record, plus `event` when not null, atomically; also `submit_order` when > 0.
  Status Write(const v1::Job& job, const v1::JobEvent* event, bool sync, int64_t submit_order = 0);
  // All job records (any order).
  Result<std::vector<v1::Job>> LoadJobs();
  // The last submit order written (0 for a new store).
  Result<int64_t> LastSubmitOrder();
  // Events of `id` with sequence >= from, in order, at most `limit` (0 = all). Skips numbers
  // that have no event (after a power loss or a repair).
  Result<std::vector<v1::JobEvent>> ReadEvents(const std::string& id, int64_t from, size_t limit);

 private:
  JobStore(rocksdb::DB* db, const JobStoreOptions& options) : db_(db), options_(options) {}
  // Boot check and, after an unclean stop on another boot, the jump past reserved numbers.
  Status RecoverSequences();

  std::unique_ptr<rocksdb::DB> db_;
  JobStoreOptions options_;
  bool opened_ = false;  // passed every check; the destructor records a clean close
  Mutex mu_;
  std::map<std::string, int64_t> reserved_ TRAIND_GUARDED_BY(mu_);  // job id → durable reserved mark
};

// `traind --state-dir DIR --repair-store`: Repair(DIR/db), a summary on stdout; returns the exit
// code (0 repaired, 1 with the reason on stderr).
int RepairStoreMain(const std::string& state_dir);

}  // namespace traind::server
