// JobServiceImpl: the gRPC handlers of traind.v1.JobService. Each one authenticates the caller
// (bearer token), calls one JobManager function, maps the Status to gRPC (status_map.h) and counts
// the call in traind_grpc_requests_total{method,code}.
#pragma once

#include <grpcpp/alarm.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "auth.h"
#include "job_manager.h"
#include "metrics.h"
#include "traind/v1/job_service.grpc.pb.h"

namespace traind::server {

// GetJob, ListJobs (what `trainctl status`/`list` poll) and WatchJobEvents (what `trainctl logs`
// and `logs -f` use) are served with the async API from one completion queue by one thread
// (ServeAsync), the only thread of traind that polls gRPC's sockets: a call is read, answered
// and written by that thread with no hand-off, and between calls it sleeps in epoll_wait. Several
// polling threads (the callback API's two, or sync pollers) pass the poller role to each other
// at every wake-up (a futex wake and a context switch more per call: most of a polled call's cost
// on a VM). The other methods may block (fsync, planning, a generation) and run on the sync
// server's threads, which do not poll. A WatchJobEvents stream holds no thread while it waits for
// events (JobManager::Follower).
class JobServiceImpl final
    : public v1::JobService::WithAsyncMethod_GetJob<v1::JobService::WithAsyncMethod_ListJobs<
          v1::JobService::WithAsyncMethod_WatchJobEvents<v1::JobService::Service>>> {
 public:
  // All three must outlive the service.
  JobServiceImpl(JobManager* jobs, const TokenAuth* auth, Metrics* metrics)
      : jobs_(jobs), auth_(auth), metrics_(metrics) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status EstimateJob(grpc::ServerContext* ctx, const v1::EstimateJobRequest* req,
                           v1::EstimateJobResponse* resp) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;

  // Serves GetJob, ListJobs and WatchJobEvents from `cq` (from ServerBuilder::AddCompletionQueue,
  // the server started) on the calling thread; returns once StopAsync was called and `cq` is
  // drained. Call it on one thread only.
  void ServeAsync(grpc::ServerCompletionQueue* cq);
  // Ends ServeAsync: call after JobManager::Stop and grpc::Server::Shutdown have returned (no
  // follower left, no new call); ServeAsync then starts no operation, shuts `cq` down and drains it.
  // `cq` is ServeAsync's (passed here, not read from the serving thread, which may not have
  // started yet when a start-up failure stops traind at once).
  void StopAsync(grpc::ServerCompletionQueue* cq);

 private:
  class AsyncCall;
  template <typename Request, typename Response>
  class UnaryCall;
  class EventsCall;
  // The caller's user from the call's `authorization` metadata, or the authentication's error.
  Result<std::string> UserOf(const grpc::ServerContextBase& ctx) const;
  // Authenticates, runs body(user) -> Status, maps and counts.
  template <typename Body>
  grpc::Status Handle(const char* method, grpc::ServerContextBase* ctx, Body&& body);

  JobManager* const jobs_;
  const TokenAuth* const auth_;
  Metrics* const metrics_;
  // The async thread's queue, and the alarm by which StopAsync reaches that thread.
  grpc::ServerCompletionQueue* cq_ = nullptr;
  std::unique_ptr<grpc::Alarm> stop_alarm_;
  bool draining_ = false;  // the async thread's: after StopAsync, no operation starts
  std::atomic<int> writes_in_flight_{0};  // WatchJobEvents batches being written
  // After a wake-up, the async thread waits this long before it polls again, and then takes all
  // that arrived meanwhile: 200 clients polling once a second cost it a wake-up per few calls
  // instead of one per call (on a VM a wake-up costs more than a small call's own work). A call
  // waits at most this much longer for its answer.
  static constexpr std::chrono::milliseconds kCoalesce{20};
};

}  // namespace traind::server
