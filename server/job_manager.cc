// JobManager: submit → store → queue; runner events → store + metrics + watchers (job_manager.h).
#include "job_manager.h"
#include "job_state.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>

#include "traind/engine/generate.h"
#include "traind/worker/admission.h"
#include "traind/worker/generate_runner.h"

namespace traind::server {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

v1::JobEvent StateChange(v1::JobState state, const std::string& error, int32_t attempt,
                         const std::string& reason) {
  v1::JobEvent ev;
  auto* s = ev.mutable_state();
  s->set_state(state);
  s->set_error(error);
  s->set_attempt(attempt);
  s->set_reason(reason);
  return ev;
}

}  // namespace

JobManager::JobManager(JobManagerOptions options, JobStore* store, Metrics* metrics)
    : options_(std::move(options)), store_(store), metrics_(metrics) {
  supervisor_ = std::make_unique<worker::Supervisor>(options_.supervisor, this);
  follow_thread_ = std::thread([this] { FollowLoop(); });
}

JobManager::~JobManager() { Stop(); }

Status JobManager::Start() {
  TRAIND_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->LoadJobs());
  TRAIND_ASSIGN_OR_RETURN(int64_t last_order, store_->LastSubmitOrder());
  MutexLock lock(&mu_);
  last_order_ = last_order;
  for (auto& job : jobs) {
    last_order_ = std::max(last_order_, job.submit_order());
    if (!v1::IsTerminal(job.state())) {
      auto resolved = ResolvePath(job.output_dir());
      resolved_output_[job.id()] = resolved.ok() ? *resolved : job.output_dir();
    }
    jobs_[job.id()] = job;
  }
  // Queue in submit order; the job that was running goes first.
  std::vector<v1::Job*> pending;
  for (auto& [id, job] : jobs_) {
    if (!v1::IsTerminal(job.state())) pending.push_back(&job);
  }
  std::sort(pending.begin(), pending.end(),
            [](const v1::Job* a, const v1::Job* b) { return a->submit_order() < b->submit_order(); });
  for (v1::Job* job : pending) {
    worker::QueuedJob q;
    q.id = job->id();
    q.priority = job->priority();
    q.order = job->submit_order();
    q.spec_json = job->spec_json();
    q.attempts_before = job->attempts();
    q.run_id = job->run_id();
    q.data_parallel = job->world_size() > 1;
    if (job->state() == v1::JOB_STATE_RUNNING) {
      q.recovered = true;
      q.priority = INT32_MAX;
      v1::JobEvent ev;
      ev.set_message(job->interruptions() > 0 && job->interrupted_step() == job->step()
                         ? "traind restarted; this job was interrupted at step " +
                               std::to_string(job->interrupted_step()) + " and resumes from its last checkpoint"
                         : "traind restarted while this job was running; it resumes from its last checkpoint");
      TRAIND_RETURN_IF_ERROR(AppendLocked(job, std::move(ev), true));
      spdlog::info("job {}: was running when traind stopped; resuming from its last checkpoint", job->id());
    }
    supervisor_->Enqueue(std::move(q));
  }
  spdlog::info("job store: {} jobs, {} to run", jobs_.size(), pending.size());
  UpdateGaugesLocked();
  supervisor_->Start();
  return Status::Ok();
}

void JobManager::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.NotifyAll();
  stop_cv_.NotifyAll();
  // Followers end now (UNAVAILABLE, after the events they have not been sent).
  std::vector<Waiting> waiting;
  {
    MutexLock lock(&follow_mu_);
    follow_exit_ = true;
    waiting.swap(followers_);
  }
  follow_cv_.NotifyAll();
  if (follow_thread_.joinable()) follow_thread_.join();
  for (Waiting& w : waiting) w.follower->Wake();
  supervisor_->Stop();
}

bool JobManager::AddFollower(Follower* f, const std::string& id, int64_t next) {
  MutexLock lock(&follow_mu_);
  if (follow_exit_) return false;
  followers_.push_back(Waiting{f, id, next});
  if (followers_.size() == 1) follow_cv_.NotifyAll();  // the loop sleeps while there are none
  return true;
}

void JobManager::FollowLoop() {
  std::vector<Follower*> ready;
  follow_mu_.Lock();
  while (!follow_exit_) {
    if (followers_.empty()) {
      follow_cv_.Wait(&follow_mu_);
      continue;
    }
    const auto tick = std::chrono::steady_clock::now() + kFollowBatchInterval;
    while (!follow_exit_ && std::chrono::steady_clock::now() < tick)
      follow_cv_.WaitFor(&follow_mu_, tick - std::chrono::steady_clock::now());
    if (follow_exit_) break;
    ready.clear();
    {
      MutexLock jobs_lock(&mu_);
      for (size_t i = 0; i < followers_.size();) {
        const Waiting& w = followers_[i];
        bool wake = stopping_ || w.follower->Gone();
        if (!wake) {
          auto it = jobs_.find(w.id);
          wake = it == jobs_.end() || v1::IsTerminal(it->second.state()) || it->second.last_sequence() >= w.next;
        }
        if (wake) {
          ready.push_back(w.follower);
          followers_[i] = std::move(followers_.back());
          followers_.pop_back();
        } else {
          ++i;
        }
      }
    }
    if (ready.empty()) continue;
    // Woken followers read and start their writes without this lock (they may register again).
    follow_mu_.Unlock();
    for (Follower* f : ready) f->Wake();
    follow_mu_.Lock();
  }
  follow_mu_.Unlock();
}


Result<std::string> JobManager::SpecText(const v1::SubmitJobRequest& req) const {
  if (!req.base_dir().empty() && !std::filesystem::path(req.base_dir()).is_absolute())
    return Status::InvalidArgument("base_dir: must be an absolute path, got " + req.base_dir());
  if (req.has_spec()) return worker::SpecMessageToText(req.spec());
  if (req.spec_yaml().empty()) return Status::InvalidArgument("spec: empty; send spec_yaml or spec");
  if (const size_t bad = engine::FirstInvalidUtf8(req.spec_yaml()); bad != std::string::npos)
    return Status::InvalidArgument("spec: not UTF-8 text (bad byte at offset " + std::to_string(bad) + ")");
  return req.spec_yaml();
}

Status JobManager::CheckPaths(const std::string& user, const std::string& text, const std::string& base_dir) const {
  if (!options_.paths.Confines(user)) return Status::Ok();
  auto spec = engine::ParseJobSpec(text, base_dir);
  if (!spec.ok()) return Status::Ok();
  return options_.paths.CheckSpec(user, *spec);
}

Status JobManager::CheckOutputDirFreeLocked(const std::string& output_dir) const {
  for (const auto& [id, other] : jobs_) {
    if (v1::IsTerminal(other.state())) continue;
    auto it = resolved_output_.find(id);
    const std::string& theirs = it != resolved_output_.end() ? it->second : other.output_dir();
    std::string relation;
    if (output_dir == theirs) relation = " is the output_dir of ";
    else if (IsWithin(output_dir, theirs)) relation = " is inside " + theirs + ", the output_dir of ";
    else if (IsWithin(theirs, output_dir)) relation = " holds " + theirs + ", the output_dir of ";
    else continue;
    return Status::FailedPrecondition("output_dir: " + output_dir + relation + id + " (" +
                                      v1::JobStateName(other.state()) +
                                      "); submit again after it ends, or choose another output_dir");
  }
  return Status::Ok();
}

Result<v1::Job> JobManager::Submit(const std::string& user, const v1::SubmitJobRequest& req) {
  TRAIND_ASSIGN_OR_RETURN(std::string text, SpecText(req));
  // Confinement first: admission opens the input files.
  TRAIND_RETURN_IF_ERROR(CheckPaths(user, text, req.base_dir()));
  // An output_dir a queued or running job owns is refused with that job's id before admission
  // looks inside it (where it would find that job's files); checked again below, under the lock.
  if (auto parsed = engine::ParseJobSpec(text, req.base_dir()); parsed.ok()) {
    auto resolved = ResolvePath(parsed->output_dir);
    MutexLock lock(&mu_);
    TRAIND_RETURN_IF_ERROR(CheckOutputDirFreeLocked(resolved.ok() ? *resolved : parsed->output_dir));
  }
  TRAIND_ASSIGN_OR_RETURN(worker::Admitted admitted,
                          worker::Admit(text, req.base_dir(), options_.admission_device));
  TRAIND_RETURN_IF_ERROR(worker::CheckDistributedDevice(admitted.spec, options_.run_device));
  const int64_t world = worker::DistributedWorld(admitted.spec);
  auto resolved = ResolvePath(admitted.spec.output_dir);
  const std::string output_dir = resolved.ok() ? *resolved : admitted.spec.output_dir;
  MutexLock lock(&mu_);
  if (stopping_) return Status::Unavailable("traind is shutting down; submit again after it restarts");
  TRAIND_RETURN_IF_ERROR(CheckOutputDirFreeLocked(output_dir));
  const int64_t order = last_order_ + 1;
  char id[32];
  std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(order));
  v1::Job job;
  job.set_id(id);
  job.set_name(admitted.spec.name);
  job.set_owner(user);
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_max_steps(admitted.spec.training.max_steps);
  job.set_output_dir(admitted.spec.output_dir);
  job.set_priority(req.priority());
  job.set_submit_order(order);
  job.set_created_unix_ms(NowMs());
  *job.mutable_plan() = worker::PlanToProto(admitted.plan);
  job.set_spec_yaml(req.has_spec() ? "" : text);
  job.set_spec_json(admitted.spec_json);
  job.set_base_dir(req.base_dir());
  if (world > 0) {
    job.set_world_size(world);
    job.set_rank(worker::DistributedRank(admitted.spec));
    job.set_run_id(req.run_id());
  }
  v1::JobEvent ev = StateChange(v1::JOB_STATE_QUEUED, "", 0, "submitted by " + user);
  ev.set_sequence(1);
  ev.set_time_unix_ms(job.created_unix_ms());
  job.set_last_sequence(1);
  TRAIND_RETURN_IF_ERROR(store_->Write(job, &ev, /*sync=*/true, order));
  last_order_ = order;
  jobs_[job.id()] = job;
  resolved_output_[job.id()] = output_dir;
  worker::QueuedJob q;
  q.id = job.id();
  q.priority = job.priority();
  q.order = order;
  q.spec_json = job.spec_json();
  q.run_id = job.run_id();
  q.data_parallel = job.world_size() > 1;
  supervisor_->Enqueue(std::move(q));
  UpdateGaugesLocked();
  spdlog::info("job {} ({}) submitted by {}: {} steps, plan {} bytes", job.id(), job.name(), user,
               job.max_steps(), job.plan().bytes().total());
  return job;
}

Result<v1::EstimateJobResponse> JobManager::Estimate(const std::string& user, const v1::EstimateJobRequest& req) {
  v1::SubmitJobRequest as_submit;
  if (req.has_spec()) *as_submit.mutable_spec() = req.spec();
  else as_submit.set_spec_yaml(req.spec_yaml());
  as_submit.set_base_dir(req.base_dir());
  TRAIND_ASSIGN_OR_RETURN(std::string text, SpecText(as_submit));
  TRAIND_RETURN_IF_ERROR(CheckPaths(user, text, req.base_dir()));
  TRAIND_ASSIGN_OR_RETURN(engine::MemoryPlan plan, worker::Estimate(text, req.base_dir(), options_.admission_device));
  v1::EstimateJobResponse resp;
  *resp.mutable_plan() = worker::PlanToProto(plan);
  resp.set_reason(plan.reason);
  resp.set_fits(plan.fits);
  for (const engine::PlanLever& l : plan.levers) {
    v1::PlanLever* out = resp.add_levers();
    out->set_change(l.change);
    out->set_bytes(l.bytes);
    out->set_fits(l.fits);
  }
  return resp;
}

Result<v1::GenerateResponse> JobManager::Generate(const std::string& user,
                                                  const v1::GenerateRequest& req) {
  TRAIND_RETURN_IF_ERROR(engine::ValidateGenerateOptions(worker::GenerateOptionsOf(req)));
  TRAIND_RETURN_IF_ERROR(options_.paths.CheckInput(user, "output_dir", req.output_dir()));
  if (!req.tokenizer().empty() && req.tokenizer() != "byte") {
    TRAIND_RETURN_IF_ERROR(options_.paths.CheckInput(user, "tokenizer", req.tokenizer()));
  }
  // Each generation is a process holding the model on the device: a few at a time.
  constexpr int kMaxConcurrent = 4;
  if (generating_.fetch_add(1) >= kMaxConcurrent) {
    generating_.fetch_sub(1);
    return Status::ResourceExhausted("generate: " + std::to_string(kMaxConcurrent) +
                                     " generations are running; try again when one ends");
  }
  const std::string log = options_.supervisor.log_dir.empty()
                              ? std::string()
                              : options_.supervisor.log_dir + "/generate.log";
  Result<v1::GenerateResponse> r = worker::RunGenerate(
      options_.supervisor.runner_path, options_.supervisor.device, req, kGenerateTimeoutSeconds, log);
  generating_.fetch_sub(1);
  if (r.ok()) {
    spdlog::info("user {} generated {} tokens from {} on {} in {:.2f} s", user, r->ids_size(),
                 req.output_dir(), r->device(), r->seconds());
  }
  return r;
}

Result<v1::Job> JobManager::Get(const std::string& user, const std::string& id) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.owner() != user) return Status::NotFound("no job " + id);
  return it->second;
}

std::vector<v1::Job> JobManager::List(const std::string& user, int limit) {
  std::vector<v1::Job> out;
  MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (job.owner() == user) out.push_back(job);
  }
  std::sort(out.begin(), out.end(),
            [](const v1::Job& a, const v1::Job& b) { return a.submit_order() > b.submit_order(); });
  if (limit > 0 && out.size() > static_cast<size_t>(limit)) out.resize(static_cast<size_t>(limit));
  return out;
}

Result<v1::Job> JobManager::Cancel(const std::string& user, const std::string& id) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.owner() != user) return Status::NotFound("no job " + id);
  v1::Job& job = it->second;
  if (v1::IsTerminal(job.state())) return job;
  const auto outcome = supervisor_->Cancel(id);
  if (outcome != worker::Supervisor::CancelOutcome::kSignalled) {
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    TRAIND_RETURN_IF_ERROR(AppendLocked(&job, StateChange(v1::JOB_STATE_CANCELLED, "", job.attempts(),
                                                          "cancelled by " + user + " while queued"), true));
    UpdateGaugesLocked();
  } else {
    v1::JobEvent ev;
    ev.set_message("cancel requested by " + user + "; the job stops within one step");
    TRAIND_RETURN_IF_ERROR(AppendLocked(&job, std::move(ev), true));
  }
  spdlog::info("job {}: cancel requested by {}", id, user);
  return job;
}

Status JobManager::Watch(const std::string& user, const v1::WatchJobRequest& req,
                         const std::function<bool(const v1::JobEvent&, bool)>& send,
                         const std::function<bool()>& client_gone) {
  constexpr size_t kBatch = 512;
  int64_t next = std::max<int64_t>(1, req.from_sequence());
  bool sent_before = false;
  std::vector<v1::JobEvent> events;
  while (true) {
    events.clear();
    {
      MutexLock lock(&mu_);
      auto it = jobs_.find(req.id());
      if (it == jobs_.end() || it->second.owner() != user) return Status::NotFound("no job " + req.id());
      if (sent_before && req.follow() && !v1::IsTerminal(it->second.state())) {
        // A follower that was just sent a batch waits out the interval (the events it brings
        // come in the next batch), unless the job ends or traind stops.
        const auto until = std::chrono::steady_clock::now() + kFollowBatchInterval;
        while (!stopping_ && !v1::IsTerminal(it->second.state()) && std::chrono::steady_clock::now() < until)
          stop_cv_.WaitFor(&mu_, until - std::chrono::steady_clock::now());
      }
      const int64_t last = it->second.last_sequence();
      const bool ended = v1::IsTerminal(it->second.state());
      if (next > last) {
        if (!req.follow() || ended) return Status::Ok();
        if (stopping_) return Status::Unavailable("traind is shutting down; watch again after it restarts");
        if (client_gone()) return Status::Cancelled("the client went away");
        sent_before = false;
        changed_.WaitFor(&mu_, std::chrono::milliseconds(500));
        continue;
      }
      auto tail = tail_.find(req.id());
      if (tail != tail_.end() && !tail->second.empty() && tail->second.front().sequence() <= next &&
          next <= tail->second.back().sequence()) {
        const std::deque<v1::JobEvent>& q = tail->second;
        for (auto e = q.begin() + (next - q.front().sequence()); e != q.end() && events.size() < kBatch; ++e)
          events.push_back(*e);
      }
    }
    if (events.empty()) {
      TRAIND_ASSIGN_OR_RETURN(events, store_->ReadEvents(req.id(), next, kBatch));
      if (events.empty()) return Status::DataLoss("events of " + req.id() + " from " + std::to_string(next) + " are missing");
    }
    for (size_t i = 0; i < events.size(); ++i) {
      if (!send(events[i], i + 1 < events.size())) return Status::Cancelled("the client went away");
      next = events[i].sequence() + 1;
    }
    sent_before = events.size() < kBatch;  // caught up (a follower far behind reads on at once)
  }
}

Status JobManager::ReadEvents(const std::string& user, const std::string& id, int64_t from, size_t limit,
                              std::vector<v1::JobEvent>* out, bool* ended) {
  out->clear();
  from = std::max<int64_t>(1, from);
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.owner() != user) return Status::NotFound("no job " + id);
    *ended = v1::IsTerminal(it->second.state());
    if (from > it->second.last_sequence()) return Status::Ok();
    auto tail = tail_.find(id);
    if (tail != tail_.end() && !tail->second.empty() && tail->second.front().sequence() <= from &&
        from <= tail->second.back().sequence()) {
      const std::deque<v1::JobEvent>& q = tail->second;
      for (auto e = q.begin() + (from - q.front().sequence()); e != q.end() && out->size() < limit; ++e)
        out->push_back(*e);
      return Status::Ok();
    }
  }
  TRAIND_ASSIGN_OR_RETURN(*out, store_->ReadEvents(id, from, limit));
  if (out->empty()) return Status::DataLoss("events of " + id + " from " + std::to_string(from) + " are missing");
  return Status::Ok();
}

Status JobManager::AppendLocked(v1::Job* job, v1::JobEvent ev, bool sync) {
  ev.set_sequence(job->last_sequence() + 1);
  ev.set_time_unix_ms(NowMs());
  // In place: no copy of the whole job (spec and plan included) per step event.
  job->set_last_sequence(ev.sequence());
  Status s = store_->Write(*job, &ev, sync);
  if (!s.ok()) {
    job->set_last_sequence(ev.sequence() - 1);
    spdlog::error("job {}: {}", job->id(), s.ToString());
    return s;
  }
  if (v1::IsTerminal(job->state())) {
    tail_.erase(job->id());
    stop_cv_.NotifyAll();  // followers pausing between batches: the job's last events now
  } else {
    std::deque<v1::JobEvent>& q = tail_[job->id()];
    // Dense from its front: a gap (numbers skipped after a power loss) starts it again.
    if (!q.empty() && q.back().sequence() + 1 != ev.sequence()) q.clear();
    q.push_back(std::move(ev));
    if (q.size() > kTailEvents) q.pop_front();
  }
  changed_.NotifyAll();
  return Status::Ok();
}

void JobManager::UpdateGaugesLocked() {
  std::map<v1::JobState, int> counts;
  for (const auto& [id, job] : jobs_) counts[job.state()]++;
  metrics_->SetJobCounts(counts);
  metrics_->SetQueueLength(supervisor_->QueueLength());
}

void JobManager::OnAttemptStart(const std::string& id, int32_t attempt, bool resume) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::Job& job = it->second;
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempts(attempt);
  if (job.started_unix_ms() == 0) job.set_started_unix_ms(NowMs());
  const std::string reason = resume ? "attempt " + std::to_string(attempt) + ": resuming from the last checkpoint"
                                    : "attempt " + std::to_string(attempt) + ": started";
  (void)AppendLocked(&job, StateChange(v1::JOB_STATE_RUNNING, "", attempt, reason), true);
  metrics_->JobStarted(id, job.name(), job.plan(), job.world_size(), job.rank());
  UpdateGaugesLocked();
  spdlog::info("job {}: {}", id, reason);
}

void JobManager::OnRunnerEvent(const std::string& id, const v1::RunnerEvent& rev) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::Job& job = it->second;
  v1::JobEvent ev;
  switch (rev.kind_case()) {
    case v1::RunnerEvent::kPlan:
      *job.mutable_plan() = rev.plan();
      *ev.mutable_plan() = rev.plan();
      metrics_->JobStarted(id, job.name(), rev.plan(), job.world_size(), job.rank());
      break;
    case v1::RunnerEvent::kStep:
      job.set_step(rev.step().step());
      job.set_max_steps(rev.step().max_steps());
      job.set_last_loss(rev.step().loss());
      *ev.mutable_step() = rev.step();
      if (rev.step().offload_written_bytes() > 0 || rev.step().offload_read_bytes() > 0) {
        v1::OffloadTotals* o = job.mutable_offload();
        o->set_read_bytes(o->read_bytes() + rev.step().offload_read_bytes());
        o->set_written_bytes(o->written_bytes() + rev.step().offload_written_bytes());
        o->set_io_seconds(o->io_seconds() + rev.step().offload_io_seconds());
        o->set_background_io_seconds(o->background_io_seconds() +
                                     rev.step().offload_background_io_seconds());
        o->set_store_bytes(rev.step().offload_store_bytes());
      }
      if (job.world_size() > 1) {
        v1::CommTotals* c = job.mutable_comm();
        c->set_seconds(c->seconds() + rev.step().comm_seconds());
        c->set_bytes(c->bytes() + rev.step().comm_bytes());
        c->set_hidden_seconds(c->hidden_seconds() + rev.step().comm_hidden_seconds());
      }
      metrics_->OnStep(id, rev.step());
      break;
    case v1::RunnerEvent::kLog:
      *ev.mutable_log() = rev.log();
      metrics_->OnLog(id, rev.log());
      break;
    case v1::RunnerEvent::kEval:
      *ev.mutable_eval() = rev.eval();
      metrics_->OnEval(id, rev.eval());
      break;
    case v1::RunnerEvent::kCheckpoint:
      *ev.mutable_checkpoint() = rev.checkpoint();
      break;
    case v1::RunnerEvent::kSample:
      *ev.mutable_sample() = rev.sample();
      break;
    case v1::RunnerEvent::kMessage:
      ev.set_message(rev.message());
      break;
    case v1::RunnerEvent::kTokenize:
      *job.mutable_tokenize() = rev.tokenize();
      *ev.mutable_tokenize() = rev.tokenize();
      metrics_->OnTokenize(id, rev.tokenize());
      break;
    default:
      return;
  }
  (void)AppendLocked(&job, std::move(ev), rev.has_checkpoint());
}

void JobManager::OnAttemptCrashed(const std::string& id, int32_t attempt, const std::string& reason,
                                  bool will_retry) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::JobEvent ev;
  ev.set_message("attempt " + std::to_string(attempt) + " failed: " + reason +
                 (will_retry ? "; restarting from the last checkpoint" : ""));
  spdlog::warn("job {}: {}", id, ev.message());
  (void)AppendLocked(&it->second, std::move(ev), true);
}

void JobManager::OnJobInterrupted(const std::string& id, int32_t attempt, const v1::RunnerResult& result,
                                  bool resumes_now) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::Job& job = it->second;
  // The newest checkpoint: the one the runner wrote on SIGTERM, or (preempted right after a
  // resume, before a new step) the one it resumed from.
  const int64_t step = result.checkpoint_step() > 0 ? result.checkpoint_step() : job.step();
  job.set_interruptions(job.interruptions() + 1);
  job.set_interrupted_step(step);
  v1::JobEvent ev;
  ev.set_message("attempt " + std::to_string(attempt) + " interrupted by SIGTERM: " + result.message() +
                 (resumes_now ? "; resuming from it now" : "; the job resumes from it at the next start"));
  spdlog::info("job {}: {}", id, ev.message());
  (void)AppendLocked(&job, std::move(ev), true);
}

void JobManager::OnJobEnd(const std::string& id, v1::JobState state, const std::string& error,
                          const v1::RunnerResult* result) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::Job& job = it->second;
  job.set_state(state);
  job.set_error(error);
  job.set_finished_unix_ms(NowMs());
  if (result && state == v1::JOB_STATE_SUCCEEDED) {
    *job.mutable_summary() = result->summary();
    if (result->has_plan()) *job.mutable_plan() = result->plan();
    job.set_step(result->summary().global_step());
  }
  (void)AppendLocked(&job, StateChange(state, error, job.attempts(), ""), true);
  metrics_->JobEnded(id);
  UpdateGaugesLocked();
  spdlog::info("job {}: {}{}{}", id, v1::JobStateName(state), error.empty() ? "" : ": ", error);
}

}  // namespace traind::server
