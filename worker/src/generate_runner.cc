// `traind-job-runner generate` (child) and RunGenerate (traind's side of the pipe).
#include "traind/worker/generate_runner.h"

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "fd_io.h"
#include "traind/v1/runner.pb.h"

namespace traind::worker {
namespace {

std::string Delimited(const google::protobuf::Message& m) {
  std::string buf;
  google::protobuf::io::StringOutputStream out(&buf);
  google::protobuf::util::SerializeDelimitedToZeroCopyStream(m, &out);
  return buf;
}

std::string DescribeWait(int status) {
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended";
}

}  // namespace

engine::GenerateOptions GenerateOptionsOf(const v1::GenerateRequest& r) {
  engine::GenerateOptions o;
  o.model_dir = r.output_dir();
  o.prompt = r.prompt();
  o.tokenizer = r.tokenizer();
  o.chat = r.chat();
  if (r.has_max_new_tokens()) o.max_new_tokens = r.max_new_tokens();
  if (r.has_temperature()) o.temperature = r.temperature();
  if (r.has_top_k()) o.top_k = r.top_k();
  if (r.has_top_p()) o.top_p = r.top_p();
  if (r.has_seed()) o.seed = r.seed();
  return o;
}

int GenerateRunnerMain() {
  signal(SIGPIPE, SIG_DFL);
  const int proto_fd = ::dup(STDOUT_FILENO);  // stray prints from below go to stderr
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  v1::RunnerGenerateRequest req;
  {
    google::protobuf::io::FileInputStream in(STDIN_FILENO);
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&req, &in, &clean_eof)) {
      std::fprintf(stderr, "generate: could not read the RunnerGenerateRequest from stdin\n");
      return 2;
    }
  }
  engine::DeviceOptions device;
  device.device = req.device().empty() ? "cpu" : req.device();
  device.memory_budget_bytes = req.memory_budget_bytes();
  device.threads = req.threads();
  v1::RunnerGenerateResult result;
  Result<engine::GenerateResult> r = engine::Generate(GenerateOptionsOf(req.request()), device);
  if (!r.ok()) {
    result.set_code(static_cast<int>(r.status().code()));
    result.set_message(r.status().message());
  } else {
    v1::GenerateResponse* resp = result.mutable_response();
    resp->set_prompt(r->prompt);
    resp->set_text(r->text);
    for (int32_t id : r->prompt_ids) resp->add_prompt_ids(id);
    for (int32_t id : r->ids) resp->add_ids(id);
    resp->set_finish_reason(r->finish_reason);
    resp->set_device(r->device);
    resp->set_seconds(r->seconds);
  }
  return WriteAll(proto_fd, Delimited(result)) ? 0 : 3;
}

Result<v1::GenerateResponse> RunGenerate(const std::string& runner_path,
                                         const engine::DeviceOptions& device,
                                         const v1::GenerateRequest& request,
                                         double timeout_seconds, const std::string& log_path) {
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
    return Status::Internal(std::string("generate: cannot create a pipe: ") + strerror(errno));
  }
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return Status::Internal(std::string("generate: cannot create a pipe: ") + strerror(errno));
  }
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  const char* argv[] = {runner_path.c_str(), "generate", nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec; dies with traind
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(1);
    ::dup2(in_pipe[0], STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
    ::execv(runner_path.c_str(), const_cast<char* const*>(argv));
    _exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return Status::Internal(std::string("generate: cannot fork the runner: ") + strerror(errno));
  }
  v1::RunnerGenerateRequest req;
  *req.mutable_request() = request;
  req.set_device(device.device);
  req.set_memory_budget_bytes(device.memory_budget_bytes);
  req.set_threads(device.threads);
  WriteAll(in_pipe[1], Delimited(req));  // a failure shows as a child without a result
  ::close(in_pipe[1]);

  // Read everything the child writes until it closes stdout, within the deadline.
  std::string bytes;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_seconds);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out_pipe[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (n == 0) continue;
    char buf[65536];
    const ssize_t got = ::read(out_pipe[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    bytes.append(buf, static_cast<size_t>(got));
  }
  ::close(out_pipe[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return Status::Unavailable("generate: no result within " +
                                    std::to_string(static_cast<int>(timeout_seconds)) +
                                    " s; the runner was stopped");
  }
  v1::RunnerGenerateResult result;
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  bool clean_eof = false;
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&result, &in, &clean_eof)) {
    return Status::Internal("generate: the runner " + DescribeWait(status) +
                            " without a result (see traind's log)");
  }
  if (result.code() != 0) {
    return Status(static_cast<Status::Code>(result.code()), result.message());
  }
  return result.response();
}

}  // namespace traind::worker
