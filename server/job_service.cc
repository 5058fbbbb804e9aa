// gRPC handlers: decode, call one JobManager function, encode, map the status.
#include "job_service.h"

#include "status_map.h"

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

grpc::Status JobServiceImpl::WatchJobEvents(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                            grpc::ServerWriter<v1::JobEventBatch>* writer) {
  return Handle("WatchJobEvents", ctx, [&](const std::string& user) -> Status {
    v1::JobEventBatch batch;
    return jobs_->Watch(user, *req, [&](const v1::JobEvent& ev, bool more) {
      *batch.add_events() = ev;
      if (more) return true;
      const bool ok = !ctx->IsCancelled() && writer->Write(batch);
      batch.Clear();
      return ok;
    }, [&] { return ctx->IsCancelled(); });
  });
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
