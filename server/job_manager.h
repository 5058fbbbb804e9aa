// JobManager: the daemon's job lifecycle between the gRPC handlers, the job store and the worker's
// Supervisor. Owns the in-memory view of every job (written through to the JobStore first), the
// per-job event log (increasing sequence numbers, never reused: docs/daemon.md) and the watchers
// waiting on it.
// Thread-safe: every public method may be called from any gRPC thread; the Supervisor calls the
// listener methods from its own thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "job_store.h"
#include "metrics.h"
#include "path_policy.h"
#include "traind/engine/status.h"
#include "traind/v1/job_service.pb.h"
#include "traind/engine/mutex.h"
#include "traind/worker/supervisor.h"

namespace traind::server {

struct JobManagerOptions {
  worker::SupervisorOptions supervisor;  // runner path, device, attempts, cancel grace, log dir
  engine::DeviceOptions admission_device;  // what SubmitJob/EstimateJob plan against
  std::string run_device = "cpu";          // the device jobs train on (data parallel: cpu only)
  PathPolicy paths;                        // where each user's jobs may read and write
};

class JobManager : public worker::SupervisorListener {
 public:
  // `store` and `metrics` must outlive the manager.
  JobManager(JobManagerOptions options, JobStore* store, Metrics* metrics);
  ~JobManager() override;

  // Loads every stored job: QUEUED ones are queued again, a RUNNING one is queued first to resume
  // from its last checkpoint (with an event saying so). Then starts the Supervisor.
  Status Start();
  // Stops the Supervisor (a running child is killed; its job resumes at the next Start) and ends
  // every WatchJob stream. Idempotent.
  void Stop();

  // Path confinement of `user` (INVALID_ARGUMENT naming the field, before any input is opened),
  // admission (parse, inputs, plan vs budget), then a durable QUEUED record. Errors are the
  // engine's (INVALID_ARGUMENT with the field path, NOT_FOUND / FAILED_PRECONDITION), and
  // FAILED_PRECONDITION naming the other job when the resolved output_dir is, holds or lies
  // inside the output_dir of a QUEUED or RUNNING job (of any user).
  Result<v1::Job> Submit(const std::string& user, const v1::SubmitJobRequest& req);
  // The memory plan; the spec's paths are confined as for Submit. A job that does not fit is no
  // error: fits false, the smallest configuration tried, and the advice.
  Result<v1::EstimateJobResponse> Estimate(const std::string& user, const v1::EstimateJobRequest& req);
  // NOT_FOUND for an unknown id and for another user's job alike.
  Result<v1::Job> Get(const std::string& user, const std::string& id);
  std::vector<v1::Job> List(const std::string& user, int limit);  // newest first
  Result<v1::Job> Cancel(const std::string& user, const std::string& id);
  // Sends the job's events from req.from_sequence through `send` (false = the client went away),
  // in batches: `more` is true for every event of a batch but its last (a stream may buffer those
  // and flush at the last). With req.follow, waits for new events until the job ends, `send`
  // fails, or Stop(): woken by the events themselves, and at most one batch per
  // kFollowBatchInterval (a job's step events come hundreds a second; a follower gets them in a
  // few batches a second, all of them). `client_gone` is polled while waiting.
  Status Watch(const std::string& user, const v1::WatchJobRequest& req,
               const std::function<bool(const v1::JobEvent& ev, bool more)>& send,
               const std::function<bool()>& client_gone);
  static constexpr std::chrono::milliseconds kFollowBatchInterval{500};

  // Up to `limit` events of `id` from sequence `from` on, from memory (the newest events of a
  // running job) or the store. *ended: the job is terminal (it has no events after the last one
  // there is). NOT_FOUND for an unknown id and for another user's job alike.
  Status ReadEvents(const std::string& user, const std::string& id, int64_t from, size_t limit,
                    std::vector<v1::JobEvent>* out, bool* ended);

  // A follow stream that holds no thread while it waits (JobServiceImpl's WatchJobEvents): one
  // follow thread wakes every waiting follower whose job has news at ticks kFollowBatchInterval
  // apart, so 20 open `logs -f` cost one wake-up per tick, not 20 threads' wake-ups per event.
  class Follower {
   public:
    virtual ~Follower() = default;
    // The client went away (polled at each tick; such a follower is woken to end its stream).
    virtual bool Gone() = 0;
    // Called once per AddFollower, on the follow thread (or in Stop), with no lock of the manager
    // held; by then the follower is no longer registered and may register again.
    virtual void Wake() = 0;
  };
  // Wakes `f` at the next tick at which job `id` has an event numbered `next` or later, has
  // ended, is gone, or f->Gone(), or when traind stops. False (and no wake) once traind stops.
  bool AddFollower(Follower* f, const std::string& id, int64_t next);
  bool stopping() const {
    MutexLock lock(&mu_);
    return stopping_;
  }

  // Text from a model folder (trainctl generate), run in a job-runner child on traind's device
  // (worker/generate_runner.h); the folder is confined like a spec input for `user`.
  Result<v1::GenerateResponse> Generate(const std::string& user, const v1::GenerateRequest& req);

  pid_t RunnerPid() const { return supervisor_->RunningPid(); }

  // worker::SupervisorListener
  void OnAttemptStart(const std::string& id, int32_t attempt, bool resume) override;
  void OnRunnerEvent(const std::string& id, const v1::RunnerEvent& ev) override;
  void OnAttemptCrashed(const std::string& id, int32_t attempt, const std::string& reason,
                        bool will_retry) override;
  void OnJobInterrupted(const std::string& id, int32_t attempt, const v1::RunnerResult& result,
                        bool resumes_now) override;
  void OnJobEnd(const std::string& id, v1::JobState state, const std::string& error,
                const v1::RunnerResult* result) override;

 private:
  // Appends `ev` (sequence and time filled in here) to `job`'s log and writes both. Caller holds mu_.
  Status AppendLocked(v1::Job* job, v1::JobEvent ev, bool sync) TRAIND_REQUIRES(mu_);
  void UpdateGaugesLocked() TRAIND_REQUIRES(mu_);
  Result<std::string> SpecText(const v1::SubmitJobRequest& req) const;
  // The path policy's verdict on `text` for `user` (OK for a spec that does not parse: admission
  // reports that).
  Status CheckPaths(const std::string& user, const std::string& text, const std::string& base_dir) const;
  // FAILED_PRECONDITION when `output_dir` (resolved) collides with a QUEUED or RUNNING job's.
  Status CheckOutputDirFreeLocked(const std::string& output_dir) const TRAIND_REQUIRES(mu_);

  const JobManagerOptions options_;
  JobStore* const store_;
  Metrics* const metrics_;
  std::unique_ptr<worker::Supervisor> supervisor_;

  mutable Mutex mu_;
  CondVar changed_;  // any event appended, or stopping
  CondVar stop_cv_;  // stopping (followers pausing between batches)
  std::map<std::string, v1::Job> jobs_ TRAIND_GUARDED_BY(mu_);
  // Job id → its output_dir resolved (symlinks, `..`) at submit or at Start; consulted for the
  // jobs that are not terminal.
  std::map<std::string, std::string> resolved_output_ TRAIND_GUARDED_BY(mu_);
  int64_t last_order_ TRAIND_GUARDED_BY(mu_) = 0;
  // The newest events of each job that is not terminal (at most kTailEvents): Watch serves
  // followers and `logs` from here instead of a store read per batch. Dropped when the job ends.
  static constexpr size_t kTailEvents = 512;
  std::map<std::string, std::deque<v1::JobEvent>> tail_ TRAIND_GUARDED_BY(mu_);
  // The follow thread (FollowLoop) and the followers waiting for it. Lock order: follow_mu_, then mu_.
  void FollowLoop();
  struct Waiting {
    Follower* follower;
    std::string id;
    int64_t next;
  };
  Mutex follow_mu_;
  CondVar follow_cv_;
  std::vector<Waiting> followers_ TRAIND_GUARDED_BY(follow_mu_);
  bool follow_exit_ TRAIND_GUARDED_BY(follow_mu_) = false;
  std::thread follow_thread_;
  std::atomic<int> generating_{0};  // Generate calls in progress
  static constexpr double kGenerateTimeoutSeconds = 600;
  bool stopping_ TRAIND_GUARDED_BY(mu_) = false;
};

}  // namespace traind::server
