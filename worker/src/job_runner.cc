// `traind job-runner` (child process) and `traind run` (in-process): both call engine::RunJob.
#include "traind/worker/job_runner.h"

#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "fd_io.h"
#include "traind/engine/local_run.h"
#include "traind/engine/mutex.h"
#include "traind/engine/signal_thread.h"
#if TRAIND_HAVE_GLOO
#include "traind/comm/distributed.h"
#endif
#include "traind/offload/offload.h"
#include "traind/v1/runner.pb.h"
#include "traind/worker/admission.h"

namespace traind::worker {
namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_preempt{false};

// SIGTERM/SIGINT: preemption (a checkpoint at the next step boundary, then a result that says so).
// SIGUSR1: the supervisor's cancel (the job ends CANCELLED within one step).
void OnTerm(int) { g_preempt.store(true); }
void OnCancel(int) { g_cancel.store(true); }

// Writes one delimited event to `fd` in full; a closed pipe (traind died) ends the process.
void Emit(int fd, const v1::RunnerEvent& ev) {
  std::string buf;
  {
    google::protobuf::io::StringOutputStream out(&buf);
    google::protobuf::util::SerializeDelimitedToZeroCopyStream(ev, &out);
  }
  if (!WriteAll(fd, buf)) _exit(3);
}

// The events to traind. Step events (one per optimizer step: a small model makes a hundred a
// second) go out together, at most kStepBatch after the first one held: each write wakes traind's
// supervisor, which then stores and counts every event it reads at once. Any other event goes out
// at once, after the steps held before it; a flush thread sends held steps when no other event
// follows in time.
class EventPipe {
 public:
  static constexpr std::chrono::milliseconds kStepBatch{100};

  explicit EventPipe(int fd) : fd_(fd), flusher_([this] { FlushLoop(); }) {}
  ~EventPipe() {
    {
      MutexLock lock(&mu_);
      exit_ = true;
      FlushLocked();
    }
    cv_.NotifyAll();
    flusher_.join();
  }

  void Send(const v1::RunnerEvent& ev) {
    MutexLock lock(&mu_);
    const bool was_empty = held_.empty();
    {
      google::protobuf::io::StringOutputStream out(&held_);
      google::protobuf::util::SerializeDelimitedToZeroCopyStream(ev, &out);
    }
    if (!ev.has_step()) return FlushLocked();
    if (was_empty) {
      deadline_ = std::chrono::steady_clock::now() + kStepBatch;
      cv_.NotifyAll();
    }
  }

 private:
  void FlushLocked() TRAIND_REQUIRES(mu_) {
    if (held_.empty()) return;
    if (!WriteAll(fd_, held_)) _exit(3);
    held_.clear();
  }
  void FlushLoop() {
    MutexLock lock(&mu_);
    while (!exit_) {
      if (held_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline_) {
        FlushLocked();
      } else {
        cv_.WaitFor(&mu_, deadline_ - now);
      }
    }
  }

  const int fd_;
  Mutex mu_;
  CondVar cv_;
  std::string held_ TRAIND_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point deadline_ TRAIND_GUARDED_BY(mu_);
  bool exit_ TRAIND_GUARDED_BY(mu_) = false;
  std::thread flusher_;
};

v1::StepEvent ToProto(const engine::StepReport& r) {
  v1::StepEvent e;
  e.set_step(r.step);
  e.set_max_steps(r.max_steps);
  e.set_loss(r.loss);
  e.set_learning_rate(r.learning_rate);
  e.set_grad_norm(r.grad_norm);
  e.set_step_seconds(r.step_seconds);
  e.set_dataloader_wait_seconds(r.dataloader_wait_seconds);
  e.set_tokens(r.tokens);
  e.set_samples(r.samples);
  e.set_skipped(r.skipped);
  e.set_memory_used_bytes(r.memory_used_bytes);
  e.set_memory_peak_bytes(r.memory_peak_bytes);
  e.set_model_flops(r.model_flops);
  e.set_offload_read_bytes(r.offload_read_bytes);
  e.set_offload_written_bytes(r.offload_written_bytes);
  e.set_offload_io_seconds(r.offload_io_seconds);
  e.set_offload_background_io_seconds(r.offload_background_io_seconds);
  e.set_offload_store_bytes(r.offload_store_bytes);
  e.set_comm_seconds(r.comm_seconds);
  e.set_comm_bytes(r.comm_bytes);
  e.set_comm_hidden_seconds(r.comm_hidden_seconds);
  e.set_expert_layers(r.expert_layers);
  for (int64_t n : r.expert_tokens) e.add_expert_tokens(n);
  return e;
}

v1::TokenizeEvent TokenizeToProto(const engine::TokenizeReport& r) {
  v1::TokenizeEvent e;
  e.set_file(r.file);
  e.set_tokenizer(r.tokenizer);
  e.set_bytes_done(r.bytes_done);
  e.set_bytes_total(r.bytes_total);
  e.set_tokens(r.tokens);
  e.set_seconds(r.seconds);
  e.set_cache_hit(r.cache_hit);
  e.set_done(r.done);
  return e;
}

// training.offload's store: host RAM for cpu; for nvme the value-log store in offload_dir, or
// the RocksDB store with TRAIND_OFFLOAD_STORE=rocksdb (offload/README.md).
Result<std::unique_ptr<engine::OptimizerStateStore>> OpenOffloadStore(const engine::TrainingSpec& t) {
  offload::StoreOptions o;
  if (t.offload == "cpu") return offload::MakeHostStore(o);
  if (t.offload == "nvme" && t.offload_dir) {
    const char* kind = std::getenv("TRAIND_OFFLOAD_STORE");
    return offload::MakeNvmeStore(*t.offload_dir, kind != nullptr ? kind : "", o);
  }
  return Status::InvalidArgument("training.offload: " + t.offload + " has no store (nvme needs offload_dir)");
}

// distributed: one rank per process (`traind run` and the daemon's job runner alike): the spec's
// fields, else WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT (docs/distributed.md). `run_id` (a rank
// submitted by trainctl submit --hosts) replaces the attempt in the rendezvous keys' prefix, so
// every daemon's job of the run meets under traind/<run_id>/ and no other run's keys.
// `attempt` (the daemon's attempt of this job; every rank of a broken world restarts once, so the
// ranks' attempts stay in step) makes attempt N > 1 meet under <run_id>.attempt-N: a rank left
// over from an earlier attempt never joins a later one. The communicator follows opts->device
// (set before this call): Gloo on cpu, NCCL on cuda:N.
void UseCommunicator(engine::RunOptions* opts, const std::string& run_id, int32_t attempt) {
  const char* env = ::getenv("TRAIND_DIST_ATTEMPT");
  std::string key = !run_id.empty() ? run_id : (env != nullptr && *env != 0 ? env : "0");
  if (attempt > 1) key += ".attempt-" + std::to_string(attempt);
  ::setenv("TRAIND_DIST_ATTEMPT", key.c_str(), 1);
#if TRAIND_HAVE_GLOO
  opts->open_communicator = [device = opts->device.device](const engine::JobSpec& spec) {
    return comm::OpenCommunicatorForJob(spec, device);
  };
#else
  (void)opts;
#endif
}

}  // namespace

int JobRunnerMain() {
  // traind blocks SIGTERM/SIGINT for its sigwait; the mask survives exec, so unblock them here.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_DFL);
  struct sigaction sa {};
  sa.sa_handler = OnTerm;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction cancel_sa {};
  cancel_sa.sa_handler = OnCancel;
  sigaction(SIGUSR1, &cancel_sa, nullptr);
  engine::RouteSignalsToOwnThread({SIGTERM, SIGINT, SIGUSR1});
  // The protocol owns the original stdout; stray prints from below go to stderr.
  const int proto_fd = ::dup(STDOUT_FILENO);
  ::dup2(STDERR_FILENO, STDOUT_FILENO);

  v1::RunnerRequest req;
  {
    google::protobuf::io::FileInputStream in(STDIN_FILENO);
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&req, &in, &clean_eof)) {
      std::fprintf(stderr, "job-runner: could not read the RunnerRequest from stdin\n");
      return 2;
    }
  }
  v1::RunnerEvent result_ev;
  v1::RunnerResult* result = result_ev.mutable_result();
  auto spec = engine::ParseJobSpec(req.spec_json(), "");
  if (!spec.ok()) {
    result->set_code(static_cast<int>(spec.status().code()));
    result->set_message(spec.status().message());
    Emit(proto_fd, result_ev);
    return 0;
  }
  engine::RunOptions opts;
  opts.device.device = req.device().empty() ? "cpu" : req.device();
  opts.device.memory_budget_bytes = req.memory_budget_bytes();
  opts.device.threads = req.threads();
  opts.resume = req.resume();
  opts.cancel = &g_cancel;
  opts.preempt = &g_preempt;
  opts.open_optimizer_state_store = OpenOffloadStore;
  UseCommunicator(&opts, req.run_id(), req.attempt());
  EventPipe pipe(proto_fd);
  engine::RunCallbacks cb;
  cb.on_plan = [&](const engine::MemoryPlan& p) {
    v1::RunnerEvent ev;
    *ev.mutable_plan() = PlanToProto(p);
    pipe.Send(ev);
  };
  cb.on_step = [&](const engine::StepReport& r) {
    v1::RunnerEvent ev;
    *ev.mutable_step() = ToProto(r);
    pipe.Send(ev);
  };
  cb.on_log = [&](const engine::LogReport& r) {
    v1::RunnerEvent ev;
    auto* l = ev.mutable_log();
    l->set_step(r.step);
    l->set_loss(r.loss);
    l->set_learning_rate(r.learning_rate);
    l->set_grad_norm(r.grad_norm);
    l->set_tokens_per_second(r.tokens_per_second);
    l->set_samples_per_second(r.samples_per_second);
    pipe.Send(ev);
  };
  cb.on_eval = [&](const engine::EvalReport& r) {
    v1::RunnerEvent ev;
    ev.mutable_eval()->set_step(r.step);
    ev.mutable_eval()->set_eval_loss(r.eval_loss);
    if (r.eval_accuracy) ev.mutable_eval()->set_eval_accuracy(*r.eval_accuracy);
    pipe.Send(ev);
  };
  cb.on_sample = [&](const engine::SampleReport& r) {
    v1::RunnerEvent ev;
    v1::SampleEvent* e = ev.mutable_sample();
    e->set_step(r.step);
    e->set_prompt(r.prompt);
    e->set_text(r.text);
    for (int32_t id : r.prompt_ids) e->add_prompt_ids(id);
    for (int32_t id : r.ids) e->add_ids(id);
    pipe.Send(ev);
  };
  int64_t last_checkpoint_step = 0;
  cb.on_checkpoint = [&](int64_t step, const std::string& dir) {
    last_checkpoint_step = step;
    v1::RunnerEvent ev;
    ev.mutable_checkpoint()->set_step(step);
    ev.mutable_checkpoint()->set_dir(dir);
    pipe.Send(ev);
  };
  cb.on_tokenize = [&](const engine::TokenizeReport& r) {
    v1::RunnerEvent ev;
    *ev.mutable_tokenize() = TokenizeToProto(r);
    pipe.Send(ev);
  };
  cb.on_message = [&](const std::string& line) {
    v1::RunnerEvent ev;
    ev.set_message(line);
    pipe.Send(ev);
  };
  auto run = engine::RunJob(*spec, opts, cb);
  if (run.ok()) {
    result->set_code(0);
    *result->mutable_summary() = SummaryToProto(*run);
    *result->mutable_plan() = PlanToProto(run->plan);
  } else {
    result->set_code(static_cast<int>(run.status().code()));
    result->set_message(run.status().message());
    if (run.status().code() == Status::Code::kAborted && g_preempt.load()) {
      result->set_preempted(true);
      result->set_checkpoint_step(last_checkpoint_step);
    }
  }
  pipe.Send(result_ev);
  return 0;
}

int RunLocal(const std::string& spec_path, const engine::DeviceOptions& device, bool resume,
             int max_restarts) {
  engine::RunOptions opts;
  opts.device = device;
  opts.resume = resume;
  opts.open_optimizer_state_store = OpenOffloadStore;
  UseCommunicator(&opts, "", 0);
#if TRAIND_HAVE_GLOO
  // A write to a peer that closed its socket (a rank that died, or one that woke from a hang and
  // finds the world gone) must fail the collective with EPIPE, not kill the process with SIGPIPE
  // (Gloo's transport does not always send with MSG_NOSIGNAL): with --max-restarts the attempt
  // restarts, without it the rank exits 1 with the collective's error (it died of SIGPIPE, exit
  // 141, in about 1 of 4 runs of DataParallelRestart.MaxRestartsZeroFailsAsBefore).
  signal(SIGPIPE, SIG_IGN);
  if (max_restarts > 0) {
    // The world restarts itself (docs/distributed.md, "Restarts of `traind run` ranks"): each
    // attempt's communicator joins the next round of the rendezvous.
    auto world = std::make_shared<comm::RestartableWorld>(max_restarts);
    opts.open_communicator = [world, device = opts.device.device](const engine::JobSpec& spec)
        -> Result<std::unique_ptr<engine::Communicator>> {
      auto comm = world->Open(spec, device);
      if (comm.ok() && world->round() > 0) {
        std::printf("rendezvous: joined round %lld (the world's restart %lld of at most %d)\n",
                    static_cast<long long>(world->round()),
                    static_cast<long long>(world->round()), world->max_restarts());
        std::fflush(stdout);
      }
      return comm;
    };
    return engine::RunJobFileWithConsole(
        spec_path, opts, [world](const Status& failure) { return world->AfterFailure(failure); });
  }
#else
  if (max_restarts > 0) {
    std::fprintf(stderr, "--max-restarts: this build has no data parallel (built without Gloo)\n");
    return 2;
  }
#endif
  return engine::RunJobFileWithConsole(spec_path, opts);
}

}  // namespace traind::worker
