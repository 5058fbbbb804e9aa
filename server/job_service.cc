// gRPC handlers: decode, call one JobManager function, encode, map the status.
#include "job_service.h"

#include "status_map.h"

#include <algorithm>
#include <string>
#include <vector>

namespace traind::server {

template <typename Body>
grpc::Status JobServiceImpl::Handle(const char* method, grpc::ServerContextBase* ctx, Body&& body) {
  Status s;
  std::string authorization;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) authorization.assign(it->second.data(), it->second.size());
  Result<std::string> user = auth_->Authenticate(authorization);
  if (!user.ok()) {
    s = user.status();
  } else {
    s = body(*user);
  }
  metrics_->CountRequest(method, StatusCodeName(s.code()));
  return ToGrpc(s);
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  return Handle("SubmitJob", ctx, [&](const std::string& user) -> Status {
    TRAIND_ASSIGN_OR_RETURN(*resp->mutable_job(), jobs_->Submit(user, *req));
    return Status::Ok();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                                 v1::Job* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(Handle("GetJob", ctx, [&](const std::string& user) -> Status {
    TRAIND_ASSIGN_OR_RETURN(*resp, jobs_->Get(user, req->id()));
    return Status::Ok();
  }));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(Handle("ListJobs", ctx, [&](const std::string& user) -> Status {
    for (auto& job : jobs_->List(user, req->limit())) *resp->add_jobs() = std::move(job);
    return Status::Ok();
  }));
  return reactor;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::Job* resp) {
  return Handle("CancelJob", ctx, [&](const std::string& user) -> Status {
    TRAIND_ASSIGN_OR_RETURN(*resp, jobs_->Cancel(user, req->id()));
    return Status::Ok();
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return Handle("WatchJob", ctx, [&](const std::string& user) -> Status {
    return jobs_->Watch(user, *req, [&](const v1::JobEvent& ev, bool) {
      return !ctx->IsCancelled() && writer->Write(ev);
    }, [&] { return ctx->IsCancelled(); });
  });
}

// One WatchJobEvents stream: a batch of events per message, the next batch once the last is
// written; a follower that has caught up waits registered with the JobManager (no thread), which
// wakes it at its next tick with news. Exactly one of Next (from Start, OnWriteDone or Wake) runs
// at a time: the stream is either writing or registered, never both.
class JobServiceImpl::EventsReactor final : public grpc::ServerWriteReactor<v1::JobEventBatch>,
                                            public JobManager::Follower {
 public:
  EventsReactor(JobServiceImpl* service, grpc::CallbackServerContext* ctx, const v1::WatchJobRequest& req)
      : service_(service), ctx_(ctx), req_(req), next_(std::max<int64_t>(1, req.from_sequence())) {}

  void Start() {
    const auto& md = ctx_->client_metadata();
    auto it = md.find("authorization");
    std::string authorization;
    if (it != md.end()) authorization.assign(it->second.data(), it->second.size());
    Result<std::string> user = service_->auth_->Authenticate(authorization);
    if (!user.ok()) return End(user.status());
    user_ = *user;
    Next();
  }

  bool Gone() override { return ctx_->IsCancelled(); }
  void Wake() override { Next(); }
  void OnWriteDone(bool ok) override {
    if (!ok) return End(Status::Cancelled("the client went away"));
    if (caught_up_ && req_.follow()) return Wait();
    Next();
  }
  void OnDone() override { delete this; }

 private:
  static constexpr size_t kBatch = 512;

  void Next() {
    if (ctx_->IsCancelled()) return End(Status::Cancelled("the client went away"));
    bool ended = false;
    Status s = service_->jobs_->ReadEvents(user_, req_.id(), next_, kBatch, &events_, &ended);
    if (!s.ok()) return End(s);
    if (events_.empty()) {
      if (!req_.follow() || ended) return End(Status::Ok());
      return Wait();
    }
    batch_.Clear();
    for (v1::JobEvent& ev : events_) *batch_.add_events() = std::move(ev);
    next_ = batch_.events(batch_.events_size() - 1).sequence() + 1;
    caught_up_ = events_.size() < kBatch;
    if (caught_up_ && (!req_.follow() || ended)) {
      // The last batch and the status in one operation.
      service_->metrics_->CountRequest("WatchJobEvents", StatusCodeName(Status::Code::kOk));
      return StartWriteAndFinish(&batch_, grpc::WriteOptions(), grpc::Status::OK);
    }
    StartWrite(&batch_);
  }

  void Wait() {
    if (service_->jobs_->stopping() || !service_->jobs_->AddFollower(this, req_.id(), next_))
      End(Status::Unavailable("traind is shutting down; watch again after it restarts"));
  }

  void End(const Status& s) {
    service_->metrics_->CountRequest("WatchJobEvents", StatusCodeName(s.code()));
    Finish(ToGrpc(s));
  }

  JobServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  const v1::WatchJobRequest req_;
  std::string user_;
  int64_t next_;
  bool caught_up_ = false;
  std::vector<v1::JobEvent> events_;
  v1::JobEventBatch batch_;
};

grpc::ServerWriteReactor<v1::JobEventBatch>* JobServiceImpl::WatchJobEvents(grpc::CallbackServerContext* ctx,
                                                                           const v1::WatchJobRequest* req) {
  auto* reactor = new EventsReactor(this, ctx, *req);
  reactor->Start();
  return reactor;
}

grpc::Status JobServiceImpl::EstimateJob(grpc::ServerContext* ctx, const v1::EstimateJobRequest* req,
                                         v1::EstimateJobResponse* resp) {
  return Handle("EstimateJob", ctx, [&](const std::string& user) -> Status {
    TRAIND_ASSIGN_OR_RETURN(*resp, jobs_->Estimate(user, *req));
    return Status::Ok();
  });
}

grpc::Status JobServiceImpl::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                      v1::GenerateResponse* resp) {
  return Handle("Generate", ctx, [&](const std::string& user) -> Status {
    TRAIND_ASSIGN_OR_RETURN(*resp, jobs_->Generate(user, *req));
    return Status::Ok();
  });
}

}  // namespace traind::server
