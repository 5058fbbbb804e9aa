// Supervisor: the device owner's queue. Runs one job at a time, each attempt in its own
// `traind job-runner` child process; a crashed child ends that attempt only (the job restarts from
// its newest checkpoint, up to max_attempts, then FAILS with the reason). Knows nothing of gRPC
// or the job store: it reports through a SupervisorListener.
// Thread safety: every public method may be called from any thread. Listener callbacks run on the
// supervisor's own thread, one at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "traind/engine/trainer.h"
#include "traind/engine/mutex.h"
#include "traind/v1/job.pb.h"
#include "traind/v1/runner.pb.h"

namespace traind::worker {

struct SupervisorOptions {
  // The executable started per attempt as `runner_path job-runner` (traind itself).
  std::string runner_path;
  engine::DeviceOptions device;  // device, memory budget (0 = capacity), CPU threads
  // Attempts per job when the child dies without a result (crash, kill -9), default 3.
  int max_attempts = 3;
  // After a cancel, seconds the child gets to stop on its own before SIGKILL. Default 10.
  double cancel_grace_seconds = 10;
  // Stop(): seconds a running child gets, after SIGTERM, to write its preemption checkpoint at the
  // next step boundary and end before SIGKILL (traind's --shutdown-timeout-seconds). Default 25.
  double stop_grace_seconds = 25;
  // Folder for the children's stderr, one file per job (<log_dir>/<job_id>.log); "" = inherit.
  std::string log_dir;
};

struct QueuedJob {
  std::string id;
  int32_t priority = 0;   // higher first
  int64_t order = 0;      // FIFO within a priority (submit order)
  std::string spec_json;  // canonical spec (paths absolute)
  int32_t attempts_before = 0;  // attempts made by earlier daemon runs (for numbering)
  // Resume from the output_dir's checkpoints on the first attempt (the job was running when the
  // daemon stopped).
  bool recovered = false;
  // Data parallel (one rank of a run across daemons): the run's id for the rendezvous keys. A
  // rank's attempt also ends when its collectives or its rendezvous fail (UNAVAILABLE: a
  // peer died, hangs past the collective timeout, or never came); that is retried like a crash. Every rank of a broken
  // world fails once, so the ranks' attempt numbers stay in step and attempt N of every rank meets
  // under the rendezvous keys of attempt N (RunnerRequest.attempt), resuming from the last
  // checkpoint (docs/distributed.md).
  std::string run_id;
  bool data_parallel = false;
};

class SupervisorListener {
 public:
  virtual ~SupervisorListener() = default;
  // A child was started for `attempt` (1-based, counted over the job's life).
  virtual void OnAttemptStart(const std::string& id, int32_t attempt, bool resume) = 0;
  // A progress event from the child (never `result`).
  virtual void OnRunnerEvent(const std::string& id, const v1::RunnerEvent& ev) = 0;
  // The child died without a result: `reason` says how; `will_retry` false means OnJobEnd follows.
  virtual void OnAttemptCrashed(const std::string& id, int32_t attempt, const std::string& reason,
                                bool will_retry) = 0;
  // The child was preempted (SIGTERM): `result` says where its checkpoint is. When `resumes_now`
  // the supervisor starts it again at once (someone signalled the child alone); otherwise it
  // stays where the caller records it and resumes at the next start.
  virtual void OnJobInterrupted(const std::string& id, int32_t attempt, const v1::RunnerResult& result,
                                bool resumes_now) = 0;
  // The job ended: SUCCEEDED (result set), FAILED (error), or CANCELLED.
  virtual void OnJobEnd(const std::string& id, v1::JobState state, const std::string& error,
                        const v1::RunnerResult* result) = 0;
};

class Supervisor {
 public:
  // `listener` must outlive the Supervisor.
  Supervisor(SupervisorOptions options, SupervisorListener* listener);
  ~Supervisor();  // Stop()s
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  void Start();
  // Stops taking jobs and preempts a running child: SIGTERM, so it checkpoints at its next step
  // boundary (OnJobInterrupted follows), then SIGKILL after stop_grace_seconds. Either way the job
  // stays RUNNING in the caller's records and resumes from its newest checkpoint at the next start.
  // Blocks until the child is gone. Idempotent.
  void Stop();

  void Enqueue(QueuedJob job);

  enum class CancelOutcome { kRemovedFromQueue, kSignalled, kNotHere };
  // Queued: removed (the caller records CANCELLED; no listener call). Running: SIGUSR1 now,
  // SIGKILL after the grace period; OnJobEnd(CANCELLED) follows. Otherwise kNotHere.
  CancelOutcome Cancel(const std::string& id);

  size_t QueueLength() const;
  std::optional<std::string> RunningJob() const;
  pid_t RunningPid() const;  // 0 when no child runs (tests kill it)

 private:
  struct Outcome {
    bool has_result = false;
    v1::RunnerResult result;
    std::string crash_reason;
  };
  void Loop();
  void Watchdog();
  void RunJob(const QueuedJob& job);
  Outcome RunAttempt(const QueuedJob& job, int32_t attempt, bool resume);

  const SupervisorOptions options_;
  SupervisorListener* const listener_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<QueuedJob> queue_ TRAIND_GUARDED_BY(mu_);
  std::string running_ TRAIND_GUARDED_BY(mu_);
  pid_t child_ TRAIND_GUARDED_BY(mu_) = 0;
  bool cancel_requested_ TRAIND_GUARDED_BY(mu_) = false;  // for the running job
  double kill_deadline_ TRAIND_GUARDED_BY(mu_) = 0;        // monotonic seconds, 0 = none
  bool stopping_ TRAIND_GUARDED_BY(mu_) = false;
  bool watchdog_exit_ TRAIND_GUARDED_BY(mu_) = false;      // set once the loop thread has ended
  std::thread thread_;
  std::thread watchdog_;
};

}  // namespace traind::worker
