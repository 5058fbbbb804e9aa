// JobServiceImpl: the gRPC handlers of traind.v1.JobService. Each one authenticates the caller
// (bearer token), calls one JobManager function, maps the Status to gRPC (status_map.h) and counts
// the call in traind_grpc_requests_total{method,code}.
#pragma once

#include "auth.h"
#include "job_manager.h"
#include "metrics.h"
#include "traind/v1/job_service.grpc.pb.h"

namespace traind::server {

// GetJob and ListJobs (what `trainctl status`/`list` poll) are callback handlers: they run on the
// gRPC thread that read the call, with no hand-off to a worker thread (each hand-off is a context
// switch, the largest part of a small call's cost on a VM). The others may block (fsync, planning,
// a generation, a follower waiting for events) and stay on the sync server's threads.
// WatchJobEvents (what `trainctl logs` and `logs -f` use) is a callback stream as well: it holds
// no thread while it waits for events (JobManager::Follower).
class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_GetJob<v1::JobService::WithCallbackMethod_ListJobs<
          v1::JobService::WithCallbackMethod_WatchJobEvents<v1::JobService::Service>>> {
 public:
  // All three must outlive the service.
  JobServiceImpl(JobManager* jobs, const TokenAuth* auth, Metrics* metrics)
      : jobs_(jobs), auth_(auth), metrics_(metrics) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::ServerWriteReactor<v1::JobEventBatch>* WatchJobEvents(grpc::CallbackServerContext* ctx,
                                                             const v1::WatchJobRequest* req) override;
  grpc::Status EstimateJob(grpc::ServerContext* ctx, const v1::EstimateJobRequest* req,
                           v1::EstimateJobResponse* resp) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;

 private:
  class EventsReactor;
  // Authenticates, runs body(user) -> Status, maps and counts.
  template <typename Body>
  grpc::Status Handle(const char* method, grpc::ServerContextBase* ctx, Body&& body);

  JobManager* const jobs_;
  const TokenAuth* const auth_;
  Metrics* const metrics_;
};

}  // namespace traind::server
