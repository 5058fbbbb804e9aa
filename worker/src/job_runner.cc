// `traind job-runner` (child process) and `traind run` (in-process): both call engine::RunJob.
#include "traind/worker/job_runner.h"

#include <google/protobuf/util/delimited_message_util.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "traind/v1/runner.pb.h"
#include "traind/worker/admission.h"

namespace traind::worker {
namespace {

std::atomic<bool> g_cancel{false};

void OnTerm(int) { g_cancel.store(true); }

// Writes one delimited event to `fd` in full; a closed pipe (traind died) ends the process.
void Emit(int fd, const v1::RunnerEvent& ev) {
  std::string buf;
  {
    google::protobuf::io::StringOutputStream out(&buf);
    google::protobuf::util::SerializeDelimitedToZeroCopyStream(ev, &out);
  }
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + off, buf.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(3);
    off += static_cast<size_t>(n);
  }
}

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
  return e;
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
  engine::RunCallbacks cb;
  cb.on_plan = [&](const engine::MemoryPlan& p) {
    v1::RunnerEvent ev;
    *ev.mutable_plan() = PlanToProto(p);
    Emit(proto_fd, ev);
  };
  cb.on_step = [&](const engine::StepReport& r) {
    v1::RunnerEvent ev;
    *ev.mutable_step() = ToProto(r);
    Emit(proto_fd, ev);
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
    Emit(proto_fd, ev);
  };
  cb.on_eval = [&](const engine::EvalReport& r) {
    v1::RunnerEvent ev;
    ev.mutable_eval()->set_step(r.step);
    ev.mutable_eval()->set_eval_loss(r.eval_loss);
    Emit(proto_fd, ev);
  };
  cb.on_checkpoint = [&](int64_t step, const std::string& dir) {
    v1::RunnerEvent ev;
    ev.mutable_checkpoint()->set_step(step);
    ev.mutable_checkpoint()->set_dir(dir);
    Emit(proto_fd, ev);
  };
  cb.on_message = [&](const std::string& line) {
    v1::RunnerEvent ev;
    ev.set_message(line);
    Emit(proto_fd, ev);
  };
  auto run = engine::RunJob(*spec, opts, cb);
  if (run.ok()) {
    result->set_code(0);
    *result->mutable_summary() = SummaryToProto(*run);
    *result->mutable_plan() = PlanToProto(run->plan);
  } else {
    result->set_code(static_cast<int>(run.status().code()));
    result->set_message(run.status().message());
  }
  Emit(proto_fd, result_ev);
  return 0;
}

int RunLocal(const std::string& spec_path, const engine::DeviceOptions& device, bool resume) {
  std::ifstream f(spec_path);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", spec_path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string base = std::filesystem::current_path().string();  // as trainctl does
  auto admitted = Admit(ss.str(), base, device);
  if (!admitted.ok()) {
    std::fprintf(stderr, "%s\n", admitted.status().ToString().c_str());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = OnTerm;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  engine::RunOptions opts;
  opts.device = device;
  opts.resume = resume;
  opts.cancel = &g_cancel;
  engine::RunCallbacks cb;
  cb.on_plan = [](const engine::MemoryPlan& p) {
    std::printf("plan: micro_batch %lld x %lld accumulation, %.1f MiB (%s)\n",
                static_cast<long long>(p.micro_batch), static_cast<long long>(p.gradient_accumulation_steps),
                static_cast<double>(p.bytes.total()) / (1 << 20), p.reason.c_str());
  };
  cb.on_log = [](const engine::LogReport& r) {
    std::printf("step %lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tokens/s\n", static_cast<long long>(r.step),
                r.loss, r.learning_rate, r.grad_norm, r.tokens_per_second);
    std::fflush(stdout);
  };
  cb.on_eval = [](const engine::EvalReport& r) {
    std::printf("step %lld  eval_loss %.4f\n", static_cast<long long>(r.step), r.eval_loss);
  };
  cb.on_checkpoint = [](int64_t step, const std::string& dir) {
    std::printf("checkpoint step %lld -> %s\n", static_cast<long long>(step), dir.c_str());
  };
  cb.on_message = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  auto run = engine::RunJob(admitted->spec, opts, cb);
  if (!run.ok()) {
    std::fprintf(stderr, "%s\n", run.status().ToString().c_str());
    return 1;
  }
  std::printf("done: %lld steps, train_loss %.4f, eval_loss %.4f, %.0f tokens/s; model in %s\n",
              static_cast<long long>(run->global_step), run->train_loss, run->eval_loss,
              run->train_tokens_per_second, run->output_dir.c_str());
  return 0;
}

}  // namespace traind::worker
