// Device probing through the job runner (see device_probe.h).
#include "device_probe.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace traind::server {

std::string JobRunnerPath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path runner = self.parent_path() / "traind-job-runner";
  if (!ec && std::filesystem::exists(runner, ec)) return runner.string();
  return self.string();
}

std::string CpuRunnerPath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path runner = self.parent_path() / "traind-cpu-runner";
  if (!ec && std::filesystem::exists(runner, ec)) return runner.string();
  return "";
}

int QueryDeviceMain(const std::string& device) {
  Result<engine::DeviceInfo> info = engine::QueryDevice(device);
  nlohmann::json j;
  if (!info.ok()) {
    j["error"] = info.status().message();
    j["code"] = StatusCodeName(info.status().code());
    std::printf("%s\n", j.dump().c_str());
    return 2;
  }
  j = {{"device", info->device},         {"name", info->name},
       {"total_bytes", info->total_bytes}, {"free_bytes", info->free_bytes},
       {"peak_flops", info->peak_flops}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

Result<engine::DeviceInfo> ProbeDevice(const std::string& device) {
  const std::string runner = JobRunnerPath();
  if (runner.find("traind-job-runner") == std::string::npos) return engine::QueryDevice(device);
  int out[2];
  if (::pipe(out) != 0) return Status::Internal("cannot create a pipe to probe the device");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return Status::Internal("cannot start " + runner + " to probe the device");
  }
  if (pid == 0) {
    // Dies with traind (like the job runners): a traind killed mid-probe leaves no orphan behind.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(1);
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    const char* argv[] = {runner.c_str(), "query-device", device.c_str(), nullptr};
    ::execv(runner.c_str(), const_cast<char* const*>(argv));
    _exit(127);
  }
  ::close(out[1]);
  std::string text;
  std::array<char, 4096> buf;
  ssize_t n;
  while ((n = ::read(out[0], buf.data(), buf.size())) > 0) text.append(buf.data(), n);
  ::close(out[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return Status::Internal(runner + " query-device " + device + " gave no answer (exit status " +
                            std::to_string(wstatus) + ")");
  }
  if (j.contains("error")) {
    const std::string code = j.value("code", "");
    const std::string msg = j.value("error", "");
    if (code == "INVALID_ARGUMENT") return Status::InvalidArgument(msg);
    return Status::FailedPrecondition(msg);
  }
  engine::DeviceInfo info;
  info.device = j.value("device", "");
  info.name = j.value("name", "");
  info.total_bytes = j.value("total_bytes", int64_t{0});
  info.free_bytes = j.value("free_bytes", int64_t{0});
  info.peak_flops = j.value("peak_flops", 0.0);
  return info;
}

}  // namespace traind::server
