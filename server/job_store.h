// JobStore: the durable record of every job (RocksDB under <state-dir>/db). Keys:
//   job/<id>                 v1::Job (spec text + canonical JSON, owner, state, plan, summary)
//   ev/<id>/<20-digit seq>   v1::JobEvent, dense per job from 1
//   meta/submit_order        the last submit order handed out
// Every write is one WriteBatch; `sync` writes (state changes, submits) are fsynced before they
// return. Thread-safe (RocksDB is); callers serialise writes to one job themselves.
#pragma once

#include <rocksdb/db.h>

#include <memory>
#include <string>
#include <vector>

#include "traind/engine/status.h"
#include "traind/v1/job.pb.h"

namespace traind::server {

class JobStore {
 public:
  // Opens (creating if missing) the database in `dir`. DATA_LOSS when it is corrupt,
  // UNAVAILABLE when it is locked by another traind.
  static Result<std::unique_ptr<JobStore>> Open(const std::string& dir);
  ~JobStore();

  // Writes the job record, plus `event` when not null, atomically; also `submit_order` when > 0.
  Status Write(const v1::Job& job, const v1::JobEvent* event, bool sync, int64_t submit_order = 0);
  // All job records (any order).
  Result<std::vector<v1::Job>> LoadJobs();
  // The last submit order written (0 for a new store).
  Result<int64_t> LastSubmitOrder();
  // Events of `id` with sequence >= from, in order, at most `limit` (0 = all).
  Result<std::vector<v1::JobEvent>> ReadEvents(const std::string& id, int64_t from, size_t limit);

 private:
  explicit JobStore(rocksdb::DB* db) : db_(db) {}
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace traind::server
