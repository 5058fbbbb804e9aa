// JobStore over RocksDB (see job_store.h for the key layout).
#include "job_store.h"

#include <rocksdb/write_batch.h>

#include <cinttypes>
#include <cstdio>

#include "status_map.h"

namespace traind::server {
namespace {

std::string JobKey(const std::string& id) { return "job/" + id; }
std::string EventKey(const std::string& id, int64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020" PRId64, seq);
  return "ev/" + id + "/" + buf;
}
constexpr char kOrderKey[] = "meta/submit_order";

}  // namespace

Result<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.keep_log_file_num = 3;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) return FromRocksDb(s, "opening the job store " + dir);
  return std::unique_ptr<JobStore>(new JobStore(db));
}

JobStore::~JobStore() {
  if (db_) db_->Close();
}

Status JobStore::Write(const v1::Job& job, const v1::JobEvent* event, bool sync, int64_t submit_order) {
  rocksdb::WriteBatch batch;
  batch.Put(JobKey(job.id()), job.SerializeAsString());
  if (event) batch.Put(EventKey(job.id(), event->sequence()), event->SerializeAsString());
  if (submit_order > 0) batch.Put(kOrderKey, std::to_string(submit_order));
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocksDb(db_->Write(wo, &batch), "writing job " + job.id());
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
  return static_cast<int64_t>(std::stoll(v));
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

}  // namespace traind::server
