// Helpers for the daemon integration tests: start the real traind binary on free loopback ports
// (port 0; the ports come back through <state-dir>/ports.json) with a temporary state dir, run
// trainctl, write tiny job specs and data, and wait for job states.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "traind/client/client.h"

namespace traind::testing {

// A fresh temporary directory (removed by the caller or left for post-mortems under /tmp).
std::string MakeTempDir(const std::string& prefix);
std::string ReadAll(const std::string& path);
void WriteAll(const std::string& path, const std::string& text);

// ~`bytes` of deterministic English-like text (a fixed word list, seeded order).
std::string WriteTextData(const std::string& dir, size_t bytes = 60000);

struct SpecOptions {
  std::string name = "tiny";
  std::string train_file;
  std::string output_dir;
  int64_t max_steps = 20;
  int64_t batch = 4;
  int64_t seq_len = 32;
  int64_t n_embd = 32;
  int64_t n_layer = 2;
  int64_t save_steps = 0;
  int64_t logging_steps = 5;
  double validation_split = 0.05;
  int64_t seed = -1;  // >= 0: training.seed (else the spec's default)
  // Extra lines under `training:` (each "  key: value\n"), e.g. overwrite_output_dir.
  std::string training_extra;
};
std::string TinySpec(const SpecOptions& o);  // a YAML job spec (gpt2, byte vocab)
// Writes TinySpec(o) for job `name` to <dir>/<name>.yaml, with o.name = name and o.output_dir =
// <dir>/runs/<name>; returns the file's path.
std::string WriteJobSpec(const std::string& dir, const std::string& name, SpecOptions o);

class Daemon {
 public:
  explicit Daemon(std::string state_dir) : state_dir_(std::move(state_dir)) {}
  ~Daemon();  // SIGKILLs a daemon still running

  // Starts traind with --state-dir, --listen/--metrics-listen on 127.0.0.1:0 (unless `extra` has
  // its own --listen) plus `extra`, and
  // waits (up to 20 s) until it serves. Returns false (with the log on stderr) when it does not.
  bool Start(const std::vector<std::string>& extra = {});
  // Starts traind as Start does, without waiting for it to serve (e.g. to kill it mid-start).
  bool Spawn(const std::vector<std::string>& extra = {});
  void Kill9();
  int Stop();  // SIGTERM, then waits; returns the exit status (or -1)
  bool Alive() const;

  pid_t pid() const { return pid_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int metrics_port() const { return metrics_port_; }
  const std::string& state_dir() const { return state_dir_; }
  std::string token() const;  // <state-dir>/token
  std::unique_ptr<client::Client> Connect(const std::string& token) const;
  std::unique_ptr<client::Client> Connect() const { return Connect(token()); }
  // Pid of the running job-runner child (0 when none).
  pid_t RunnerPid() const;

 private:
  std::string state_dir_;
  pid_t pid_ = 0;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

struct CmdResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs trainctl with `args` (and env TRAIND_TOKEN etc. unset), capturing stdout and stderr.
CmdResult Trainctl(const std::vector<std::string>& args, double timeout_seconds = 120);
CmdResult RunCommand(const std::vector<std::string>& argv, double timeout_seconds = 120);

// Polls GetJob until `pred` holds (true) or `timeout_seconds` pass (false; `last` has the job).
bool WaitFor(client::Client& c, const std::string& id, const std::function<bool(const v1::Job&)>& pred,
             double timeout_seconds, v1::Job* last = nullptr);
bool IsDone(const v1::Job& j);

// A live process (not a zombie) that belongs to the daemon on `state_dir`: its command line names
// the state dir (traind itself, or a child forked but not yet exec'd) or its stderr is a file under
// it (traind sends each job runner's stderr to <state-dir>/jobs/<id>.log; Daemon sends traind's
// own, which the device probe `traind-job-runner query-device` inherits, to <state-dir>/stderr.log).
struct DaemonProcess {
  pid_t pid = 0;
  pid_t ppid = 0;
  std::vector<std::string> argv;
  bool dying = false;  // SIGKILL pending, or exiting
  bool IsJobRunner() const { return argv.size() >= 2 && argv[1] == "job-runner"; }
};
// Scans /proc for them (any parent: orphans included).
std::vector<DaemonProcess> DaemonProcesses(const std::string& state_dir);

// GET http://127.0.0.1:port/path; the body ("" on failure).
std::string HttpGet(int port, const std::string& path);

// A Prometheus text exposition as name{labels} -> value (comments skipped).
std::map<std::string, double> ParseMetrics(const std::string& text);
// The value of the first series named `name` whose labels include `label` (NaN when none).
double FindMetric(const std::map<std::string, double>& m, const std::string& name, const std::string& label = "");

}  // namespace traind::testing
