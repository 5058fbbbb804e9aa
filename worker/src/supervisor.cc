// Supervisor: queue + one job-runner child per attempt (see supervisor.h).
#include "traind/worker/supervisor.h"

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "fd_io.h"

namespace traind::worker {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "the job-runner process was killed by signal " + std::to_string(sig) + " (" +
           sigdescr_np(sig) + ")";
  }
  if (WIFEXITED(status)) {
    return "the job-runner process exited with code " + std::to_string(WEXITSTATUS(status)) +
           " without a result";
  }
  return "the job-runner process ended abnormally";
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions options, SupervisorListener* listener)
    : options_(std::move(options)), listener_(listener) {}

Supervisor::~Supervisor() { Stop(); }

void Supervisor::Start() {
  thread_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

void Supervisor::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    if (child_ > 0) {
      // Preemption: the child checkpoints at its next step boundary; the watchdog SIGKILLs it
      // when the grace period ends first (or sooner, when a cancel's deadline is nearer).
      if (options_.stop_grace_seconds <= 0) {
        ::kill(child_, SIGKILL);
      } else {
        ::kill(child_, SIGTERM);
        const double deadline = NowSeconds() + options_.stop_grace_seconds;
        kill_deadline_ = kill_deadline_ > 0 ? std::min(kill_deadline_, deadline) : deadline;
      }
    }
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(&mu_);
    watchdog_exit_ = true;
  }
  cv_.NotifyAll();
  if (watchdog_.joinable()) watchdog_.join();
}

void Supervisor::Enqueue(QueuedJob job) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(job));
  }
  cv_.NotifyAll();
}

Supervisor::CancelOutcome Supervisor::Cancel(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const QueuedJob& j) { return j.id == id; });
  if (it != queue_.end()) {
    queue_.erase(it);
    return CancelOutcome::kRemovedFromQueue;
  }
  if (running_ == id) {
    if (!cancel_requested_) {
      cancel_requested_ = true;
      if (child_ > 0) ::kill(child_, SIGUSR1);
      kill_deadline_ = NowSeconds() + options_.cancel_grace_seconds;
    }
    return CancelOutcome::kSignalled;
  }
  return CancelOutcome::kNotHere;
}

size_t Supervisor::QueueLength() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

std::optional<std::string> Supervisor::RunningJob() const {
  MutexLock lock(&mu_);
  if (running_.empty()) return std::nullopt;
  return running_;
}

pid_t Supervisor::RunningPid() const {
  MutexLock lock(&mu_);
  return child_;
}

void Supervisor::Watchdog() {
  MutexLock lock(&mu_);
  while (!watchdog_exit_) {
    cv_.WaitFor(&mu_, std::chrono::milliseconds(100));
    if (kill_deadline_ > 0 && NowSeconds() >= kill_deadline_ && child_ > 0) {
      ::kill(child_, SIGKILL);
      kill_deadline_ = 0;
    }
  }
}

void Supervisor::Loop() {
  while (true) {
    QueuedJob job;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      // Highest priority first, then the oldest.
      auto best = std::min_element(queue_.begin(), queue_.end(), [](const QueuedJob& a, const QueuedJob& b) {
        return a.priority != b.priority ? a.priority > b.priority : a.order < b.order;
      });
      job = std::move(*best);
      queue_.erase(best);
      running_ = job.id;
      cancel_requested_ = false;
    }
    RunJob(job);
    MutexLock lock(&mu_);
    running_.clear();
    kill_deadline_ = 0;
  }
}

void Supervisor::RunJob(const QueuedJob& job) {
  int32_t attempt = job.attempts_before;
  for (int crashes = 0, preemptions = 0;;) {
    ++attempt;
    const bool resume = job.recovered || crashes > 0 || preemptions > 0;
    listener_->OnAttemptStart(job.id, attempt, resume);
    Outcome out = RunAttempt(job, attempt, resume);
    bool cancelled, stopping;
    {
      MutexLock lock(&mu_);
      cancelled = cancel_requested_;
      stopping = stopping_;
    }
    if (out.has_result && out.result.preempted()) {
      // SIGTERM: a checkpoint at a step boundary. From Stop() the job resumes at the next start;
      // from anyone else (the child alone was signalled) it resumes now, as a crash would.
      ++preemptions;
      listener_->OnJobInterrupted(job.id, attempt, out.result, /*resumes_now=*/!stopping && !cancelled);
      if (stopping) return;
      if (cancelled) {
        listener_->OnJobEnd(job.id, v1::JOB_STATE_CANCELLED, "", nullptr);
        return;
      }
      continue;
    }
    if (out.has_result) {
      const auto code = static_cast<Status::Code>(out.result.code());
      if (code == Status::Code::kOk) {
        listener_->OnJobEnd(job.id, v1::JOB_STATE_SUCCEEDED, "", &out.result);
      } else if (code == Status::Code::kCancelled || cancelled) {
        // Cancelled where the engine could not stop at a step (a data-parallel rank in its
        // rendezvous or a collective fails instead): still the user's cancel.
        listener_->OnJobEnd(job.id, v1::JOB_STATE_CANCELLED, "", &out.result);
      } else if (job.data_parallel && !stopping && code == Status::Code::kUnavailable) {
        // The world broke (a peer died or hangs): every rank's attempt ends like this one, and
        // every rank starts its next attempt from the last checkpoint.
        ++crashes;
        const std::string reason = std::string(StatusCodeName(code)) + ": " + out.result.message();
        const bool retry = crashes < options_.max_attempts;
        listener_->OnAttemptCrashed(job.id, attempt, reason, retry);
        if (retry) continue;
        listener_->OnJobEnd(job.id, v1::JOB_STATE_FAILED,
                            reason + "; gave up after " + std::to_string(crashes) + " attempts", &out.result);
      } else {
        listener_->OnJobEnd(job.id, v1::JOB_STATE_FAILED,
                            std::string(StatusCodeName(code)) + ": " + out.result.message(), &out.result);
      }
      return;
    }
    if (stopping) return;  // daemon shutdown: the job stays RUNNING and resumes at next start
    if (cancelled) {
      listener_->OnJobEnd(job.id, v1::JOB_STATE_CANCELLED, "", nullptr);
      return;
    }
    ++crashes;
    const bool retry = crashes < options_.max_attempts;
    listener_->OnAttemptCrashed(job.id, attempt, out.crash_reason, retry);
    if (!retry) {
      listener_->OnJobEnd(job.id, v1::JOB_STATE_FAILED,
                          out.crash_reason + "; gave up after " + std::to_string(crashes) + " attempts",
                          nullptr);
      return;
    }
  }
}

Supervisor::Outcome Supervisor::RunAttempt(const QueuedJob& job, int32_t attempt, bool resume) {
  Outcome out;
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0) {
    out.crash_reason = std::string("cannot create pipes: ") + strerror(errno);
    return out;
  }
  int log_fd = -1;
  if (!options_.log_dir.empty()) {
    const std::string path = options_.log_dir + "/" + job.id + ".log";
    log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  const std::string exe = options_.runner_path;
  const char* argv[] = {exe.c_str(), "job-runner", nullptr};
  const pid_t parent = ::getpid();
  pid_t pid;
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      out.crash_reason = "stopping";
      ::close(in_pipe[0]); ::close(in_pipe[1]); ::close(out_pipe[0]); ::close(out_pipe[1]);
      if (log_fd >= 0) ::close(log_fd);
      return out;
    }
    pid = ::fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec. Dies with traind.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(1);
      ::dup2(in_pipe[0], STDIN_FILENO);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
      ::execv(exe.c_str(), const_cast<char* const*>(argv));
      _exit(127);
    }
    child_ = pid > 0 ? pid : 0;
    if (cancel_requested_ && pid > 0) ::kill(pid, SIGUSR1);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    out.crash_reason = std::string("cannot fork the job-runner: ") + strerror(errno);
    return out;
  }

  v1::RunnerRequest req;
  req.set_job_id(job.id);
  req.set_spec_json(job.spec_json);
  req.set_resume(resume);
  req.set_run_id(job.run_id);
  req.set_attempt(attempt);
  req.set_device(options_.device.device);
  req.set_memory_budget_bytes(options_.device.memory_budget_bytes);
  req.set_threads(options_.device.threads);
  std::string buf;
  {
    google::protobuf::io::StringOutputStream s(&buf);
    google::protobuf::util::SerializeDelimitedToZeroCopyStream(req, &s);
  }
  WriteAll(in_pipe[1], buf);  // a failure shows up as a child without a result
  ::close(in_pipe[1]);

  {
    google::protobuf::io::FileInputStream in(out_pipe[0]);
    while (true) {
      v1::RunnerEvent ev;
      bool clean_eof = false;
      if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&ev, &in, &clean_eof)) break;
      if (ev.has_result()) {
        out.has_result = true;
        out.result = ev.result();
      } else {
        listener_->OnRunnerEvent(job.id, ev);
      }
    }
  }
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  {
    MutexLock lock(&mu_);
    child_ = 0;
  }
  if (!out.has_result) out.crash_reason = DescribeExit(status);
  return out;
}

}  // namespace traind::worker
