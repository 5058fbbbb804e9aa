// Daemon integration test helpers (see daemon_fixture.h).
#include "daemon_fixture.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

namespace traind::testing {

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* d = ::mkdtemp(buf.data());
  return d ? std::string(d) : std::string();
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string WriteTextData(const std::string& dir, size_t bytes) {
  static const char* kWords[] = {"the", "king", "shall", "speak", "of", "love", "and", "war", "my", "lord",
                                 "thou", "art", "a", "fool", "to", "sleep", "perchance", "dream", "night", "day"};
  std::mt19937 rng(1234);
  std::string text;
  while (text.size() < bytes) {
    text += kWords[rng() % 20];
    text += (rng() % 9 == 0) ? ".\n" : " ";
  }
  const std::string path = dir + "/data.txt";
  WriteAll(path, text);
  return path;
}

std::string WriteJobSpec(const std::string& dir, const std::string& name, SpecOptions o) {
  o.name = name;
  o.output_dir = dir + "/runs/" + name;
  const std::string path = dir + "/" + name + ".yaml";
  WriteAll(path, TinySpec(o));
  return path;
}

std::string TinySpec(const SpecOptions& o) {
  std::ostringstream s;
  s << "name: " << o.name << "\n"
    << "model:\n  arch: gpt2\n  config: {vocab_size: 256, n_positions: " << o.seq_len << ", n_embd: " << o.n_embd
    << ", n_layer: " << o.n_layer << ", n_head: 2}\n"
    << "data:\n  train_file: " << o.train_file << "\n  seq_len: " << o.seq_len
    << "\n  validation_split: " << o.validation_split << "\n"
    << "training:\n  max_steps: " << o.max_steps << "\n  per_device_train_batch_size: " << o.batch
    << "\n  logging_steps: " << o.logging_steps << "\n  save_steps: " << o.save_steps << "\n  learning_rate: 1.0e-3\n";
  if (o.seed >= 0) s << "  seed: " << o.seed << "\n";
  s << o.training_extra;
  s << "output_dir: " << o.output_dir << "\n";
  return s.str();
}

Daemon::~Daemon() {
  if (Alive()) Kill9();
}

bool Daemon::Start(const std::vector<std::string>& extra) {
  if (!Spawn(extra)) return false;
  const std::string ports = state_dir_ + "/ports.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!Alive()) break;
    const std::string text = ReadAll(ports);
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.value("pid", 0) == pid_) {
      grpc_port_ = j["grpc"];
      metrics_port_ = j["metrics"];
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "traind did not start; its log:\n%s\n", ReadAll(state_dir_ + "/stderr.log").c_str());
  return false;
}

bool Daemon::Spawn(const std::vector<std::string>& extra) {
  const std::string ports = state_dir_ + "/ports.json";
  ::unlink(ports.c_str());
  std::vector<std::string> args = {TRAIND_BIN, "--state-dir", state_dir_, "--metrics-listen", "127.0.0.1:0"};
  if (std::find(extra.begin(), extra.end(), "--listen") == extra.end()) {
    args.push_back("--listen");
    args.push_back("127.0.0.1:0");
  }
  args.insert(args.end(), extra.begin(), extra.end());
  ::mkdir(state_dir_.c_str(), 0700);
  const std::string log = state_dir_ + "/stderr.log";
  pid_ = ::fork();
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return pid_ > 0;
}

bool Daemon::Alive() const {
  if (pid_ <= 0) return false;
  int status = 0;
  return ::waitpid(pid_, &status, WNOHANG) == 0;
}

void Daemon::Kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = 0;
}

int Daemon::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Daemon::token() const {
  std::string t = ReadAll(state_dir_ + "/token");
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

std::unique_ptr<client::Client> Daemon::Connect(const std::string& token) const {
  client::ClientOptions o;
  o.addr = addr();
  o.token = token;
  auto c = client::Client::Create(o);
  return c.ok() ? std::move(*c) : nullptr;
}

pid_t Daemon::RunnerPid() const {
  if (pid_ <= 0) return 0;
  const std::string task_dir = "/proc/" + std::to_string(pid_) + "/task";
  DIR* d = ::opendir(task_dir.c_str());
  if (!d) return 0;
  pid_t found = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::istringstream in(ReadAll(task_dir + "/" + e->d_name + "/children"));
    pid_t child;
    while (in >> child) found = child;
  }
  ::closedir(d);
  return found;
}

CmdResult RunCommand(const std::vector<std::string>& argv_in, double timeout_seconds) {
  CmdResult r;
  char out_tmpl[] = "/tmp/trainctl-out-XXXXXX";
  char err_tmpl[] = "/tmp/trainctl-err-XXXXXX";
  const int out_fd = ::mkstemp(out_tmpl);
  const int err_fd = ::mkstemp(err_tmpl);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::unsetenv("TRAIND_TOKEN");
    ::unsetenv("TRAIND_ADDR");
    std::vector<std::string> args = argv_in;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadAll(out_tmpl);
  r.err = ReadAll(err_tmpl);
  ::close(out_fd);
  ::close(err_fd);
  ::unlink(out_tmpl);
  ::unlink(err_tmpl);
  return r;
}

CmdResult Trainctl(const std::vector<std::string>& args, double timeout_seconds) {
  std::vector<std::string> argv = {TRAINCTL_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout_seconds);
}

bool IsDone(const v1::Job& j) {
  return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED ||
         j.state() == v1::JOB_STATE_CANCELLED;
}

bool WaitFor(client::Client& c, const std::string& id, const std::function<bool(const v1::Job&)>& pred,
             double timeout_seconds, v1::Job* last) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    auto j = c.Get(id);
    if (j.ok()) {
      if (last) *last = *j;
      if (pred(*j)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<DaemonProcess> DaemonProcesses(const std::string& state_dir) {
  std::vector<DaemonProcess> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  const std::string under = state_dir + "/";
  while (dirent* e = ::readdir(d)) {
    const char* name = e->d_name;
    if (*name < '0' || *name > '9') continue;
    const std::string proc = std::string("/proc/") + name;
    // stat: "pid (comm) S ppid ..."; comm may hold spaces and parentheses, so parse after the last ')'.
    const std::string stat = ReadAll(proc + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    char state = '?';
    long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
    unsigned long flags = 0;
    if (std::sscanf(stat.c_str() + paren + 1, " %c %ld %ld %ld %ld %ld %lu", &state, &ppid, &pgrp, &session, &tty,
                    &tpgid, &flags) != 7)
      continue;
    if (state == 'Z' || state == 'X') continue;  // dead, waiting to be reaped
    const std::string cmdline = ReadAll(proc + "/cmdline");
    char target[4096];
    const ssize_t n = ::readlink((proc + "/fd/2").c_str(), target, sizeof(target) - 1);
    const std::string err = n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
    DaemonProcess p;
    p.pid = static_cast<pid_t>(std::atol(name));
    p.ppid = static_cast<pid_t>(ppid);
    for (size_t at = 0; at < cmdline.size();) {
      const size_t end = cmdline.find('\0', at);
      p.argv.push_back(cmdline.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    const bool names_it = std::any_of(p.argv.begin(), p.argv.end(), [&](const std::string& a) {
      return a == state_dir || a.rfind(under, 0) == 0;
    });
    if (!names_it && err.rfind(under, 0) != 0) continue;
    constexpr unsigned long kPfExiting = 0x4;  // PF_EXITING
    p.dying = (flags & kPfExiting) != 0;
    std::istringstream status(ReadAll(proc + "/status"));
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
        const unsigned long long pending = std::strtoull(line.c_str() + 7, nullptr, 16);
        if (pending & (1ull << (SIGKILL - 1))) p.dying = true;
      }
    }
    out.push_back(std::move(p));
  }
  ::closedir(d);
  return out;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) < 0) {
    ::close(fd);
    return "";
  }
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const auto body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

double FindMetric(const std::map<std::string, double>& m, const std::string& name, const std::string& label) {
  for (const auto& [k, v] : m) {
    const std::string n = k.substr(0, k.find('{'));
    if (n == name && k.find(label) != std::string::npos) return v;
  }
  return std::nan("");
}

}  // namespace traind::testing
