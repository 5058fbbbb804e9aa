// gRPC handlers: decode, call one JobManager function, encode, map the status.
#include "job_service.h"

#include "status_map.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace traind::server {

Result<std::string> JobServiceImpl::UserOf(const grpc::ServerContextBase& ctx) const {
  std::string authorization;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) authorization.assign(it->second.data(), it->second.size());
  return auth_->Authenticate(authorization);
}

template <typename Body>
grpc::Status JobServiceImpl::Handle(const char* method, grpc::ServerContextBase* ctx, Body&& body) {
  Status s;
  Result<std::string> user = UserOf(*ctx);
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

// The async calls. Each call object posts its request, then owns its call until it is deleted on
// the async thread. A completion's tag is one of a call's two Tags: its operations (the request,
// then the writes and the finish, one at a time) and, for a stream, the call's end (done).
class JobServiceImpl::AsyncCall {
 public:
  struct Tag {
    AsyncCall* call;
    bool done;  // the call's end (AsyncNotifyWhenDone), else its current operation
  };
  virtual ~AsyncCall() = default;
  // On the async thread: the operation of `tag` completed with `ok`.
  virtual void OnEvent(bool done, bool ok) = 0;

 protected:
  explicit AsyncCall(JobServiceImpl* service) : service_(service) {}

  JobServiceImpl* const service_;
  Tag op_tag_{this, false};
  Tag done_tag_{this, true};
};

// GetJob and ListJobs: request, answer on arrival, delete when the answer is written.
template <typename Request, typename Response>
class JobServiceImpl::UnaryCall final : public AsyncCall {
 public:
  using RequestFn = void (JobServiceImpl::*)(grpc::ServerContext*, Request*,
                                             grpc::ServerAsyncResponseWriter<Response>*, grpc::CompletionQueue*,
                                             grpc::ServerCompletionQueue*, void*);
  using HandleFn = Status (*)(JobServiceImpl*, const std::string& user, const Request&, Response*);

  UnaryCall(JobServiceImpl* service, const char* method, RequestFn request, HandleFn handle)
      : AsyncCall(service), method_(method), request_(request), handle_(handle) {}

  void Post() { (service_->*request_)(&ctx_, &req_, &writer_, service_->cq_, service_->cq_, &op_tag_); }

  void OnEvent(bool, bool ok) override {
    if (answered_ || !ok || service_->draining_) {
      delete this;  // written (or not), or no call: the server is shutting down
      return;
    }
    (new UnaryCall(service_, method_, request_, handle_))->Post();
    answered_ = true;
    Response resp;
    const grpc::Status status = service_->Handle(method_, &ctx_, [&](const std::string& user) {
      return handle_(service_, user, req_, &resp);
    });
    writer_.Finish(resp, status, &op_tag_);
  }

 private:
  const char* const method_;
  const RequestFn request_;
  const HandleFn handle_;
  grpc::ServerContext ctx_;
  Request req_;
  grpc::ServerAsyncResponseWriter<Response> writer_{&ctx_};
  bool answered_ = false;
};

// One WatchJobEvents stream: a batch of events per message, the next batch once the last is
// written; a follower that has caught up waits registered with the JobManager (no thread), which
// wakes it at its next tick with news. Exactly one Next (from the request, a write's completion
// or Wake) runs at a time, and each ends by starting an operation or registering: the stream is
// either writing or registered, never both. The call is deleted on the async thread once its
// finish and its end (done tag) have both come back, or, while draining, once no operation is
// left.
class JobServiceImpl::EventsCall final : public AsyncCall, public JobManager::Follower {
 public:
  explicit EventsCall(JobServiceImpl* service) : AsyncCall(service) {}

  void Post() {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestWatchJobEvents(&ctx_, &req_, &writer_, service_->cq_, service_->cq_, &op_tag_);
  }

  void OnEvent(bool done, bool ok) override {
    if (done) {
      gone_ = true;
    } else if (!started_) {
      if (!ok) {
        delete this;  // no call (the server is shutting down): no done tag comes either
        return;
      }
      started_ = true;
      if (!service_->draining_) {
        (new EventsCall(service_))->Post();
        return Start();
      }
      op_pending_ = false;
    } else if (finishing_) {
      op_pending_ = false;
      finished_ = true;
      if (wrote_last_) service_->writes_in_flight_--;
    } else {
      op_pending_ = false;
      service_->writes_in_flight_--;
      if (!service_->draining_) return OnWriteDone(ok);
    }
    const bool done_back = gone_.load();
    if (done_back && !op_pending_.load() && (finished_ || service_->draining_)) delete this;
  }

  bool Gone() override { return gone_.load(); }
  void Wake() override { Next(); }

 private:
  static constexpr size_t kBatch = 512;

  void Start() {
    Result<std::string> user = service_->UserOf(ctx_);
    if (!user.ok()) return End(user.status());
    user_ = *user;
    next_ = std::max<int64_t>(1, req_.from_sequence());
    Next();
  }

  void OnWriteDone(bool ok) {
    if (!ok) return End(Status::Cancelled("the client went away"));
    if (caught_up_ && req_.follow()) return Wait();
    Next();
  }

  void Next() {
    if (gone_.load()) return End(Status::Cancelled("the client went away"));
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
    op_pending_ = true;
    service_->writes_in_flight_++;
    if (caught_up_ && (!req_.follow() || ended)) {
      // The last batch and the status in one operation.
      service_->metrics_->CountRequest("WatchJobEvents", StatusCodeName(Status::Code::kOk));
      finishing_ = true;
      wrote_last_ = true;
      return writer_.WriteAndFinish(batch_, grpc::WriteOptions(), grpc::Status::OK, &op_tag_);
    }
    writer_.Write(batch_, &op_tag_);
  }

  void Wait() {
    if (service_->jobs_->stopping() || !service_->jobs_->AddFollower(this, req_.id(), next_))
      End(Status::Unavailable("traind is shutting down; watch again after it restarts"));
  }

  // The last thing a Next does: the call may be deleted on the async thread once it is started.
  void End(const Status& s) {
    service_->metrics_->CountRequest("WatchJobEvents", StatusCodeName(s.code()));
    op_pending_ = true;
    finishing_ = true;
    writer_.Finish(ToGrpc(s), &op_tag_);
  }

  grpc::ServerContext ctx_;
  v1::WatchJobRequest req_;
  grpc::ServerAsyncWriter<v1::JobEventBatch> writer_{&ctx_};
  std::string user_;
  int64_t next_ = 1;
  bool started_ = false;    // the async thread's
  bool finished_ = false;   // the async thread's
  bool finishing_ = false;  // set before the finish starts, read at its completion
  bool wrote_last_ = false;  // the finish carries the last batch (counted in writes_in_flight_)
  bool caught_up_ = false;
  std::atomic<bool> gone_{false};        // the done tag came back: the call ended or was cancelled
  std::atomic<bool> op_pending_{true};   // the request, a write or the finish is under way
  std::vector<v1::JobEvent> events_;
  v1::JobEventBatch batch_;
};

void JobServiceImpl::ServeAsync(grpc::ServerCompletionQueue* cq) {
  cq_ = cq;
  using GetCall = UnaryCall<v1::GetJobRequest, v1::Job>;
  using ListCall = UnaryCall<v1::ListJobsRequest, v1::ListJobsResponse>;
  (new GetCall(this, "GetJob", &JobServiceImpl::RequestGetJob,
               [](JobServiceImpl* self, const std::string& user, const v1::GetJobRequest& req, v1::Job* resp) -> Status {
                 TRAIND_ASSIGN_OR_RETURN(*resp, self->jobs_->Get(user, req.id()));
                 return Status::Ok();
               }))
      ->Post();
  (new ListCall(this, "ListJobs", &JobServiceImpl::RequestListJobs,
                [](JobServiceImpl* self, const std::string& user, const v1::ListJobsRequest& req,
                   v1::ListJobsResponse* resp) -> Status {
                  for (auto& job : self->jobs_->List(user, req.limit())) *resp->add_jobs() = std::move(job);
                  return Status::Ok();
                }))
      ->Post();
  (new EventsCall(this))->Post();
  void* tag = nullptr;
  bool ok = false;
  auto dispatch = [&] {
    if (tag == this) {  // StopAsync's alarm
      draining_ = true;
      cq->Shutdown();
      return;
    }
    auto* t = static_cast<AsyncCall::Tag*>(tag);
    t->call->OnEvent(t->done, ok);
  };
  while (cq->Next(&tag, &ok)) {
    dispatch();
    // Let what comes next arrive first (see kCoalesce), unless a stream is writing: a large one
    // waits for the client's flow-control updates, which only this thread reads.
    if (!draining_ && writes_in_flight_.load() == 0) std::this_thread::sleep_for(kCoalesce);
    // Everything that arrived meanwhile, from one poll that does not wait.
    while (cq->AsyncNext(&tag, &ok, std::chrono::system_clock::now()) == grpc::CompletionQueue::GOT_EVENT)
      dispatch();
  }
}

void JobServiceImpl::StopAsync(grpc::ServerCompletionQueue* cq) {
  stop_alarm_ = std::make_unique<grpc::Alarm>();
  stop_alarm_->Set(cq, std::chrono::system_clock::now(), this);
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
