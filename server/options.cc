// Flag and config-file parsing for traind (see options.h).
#include "options.h"

#include "path_policy.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <set>
#include <vector>

namespace traind::server {

Result<int64_t> ParseBytes(const std::string& text) {
  if (text == "auto" || text.empty()) return int64_t{0};
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    return Status::InvalidArgument("memory-budget: expected bytes (e.g. 8GiB) or auto, got " + text);
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else return Status::InvalidArgument("memory-budget: unknown unit '" + unit + "' in " + text);
  if (!(v > 0) || !std::isfinite(v)) return Status::InvalidArgument("memory-budget: must be positive, got " + text);
  return static_cast<int64_t>(v * mult);
}

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  const auto colon = host.rfind(':');
  if (colon != std::string::npos) host = host.substr(0, colon);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Result<ServerOptions> ParseServerOptions(int argc, char** argv, bool* help) {
  *help = false;
  ServerOptions o;
  CLI::App app{"traind: the training daemon"};
  app.add_option("--config", o.config, "YAML file; every flag is also a key");
  app.add_option("--state-dir", o.state_dir, "job store, logs and token");
  app.add_option("--listen", o.listen, "gRPC host:port");
  app.add_option("--metrics-listen", o.metrics_listen, "Prometheus host:port (/metrics)");
  app.add_option("--device", o.device, "auto | cpu | cuda:N | simt (emulated CUDA, tests only)");
  app.add_option("--memory-budget", o.memory_budget, "bytes the planner may use, or auto");
  app.add_option("--tls-cert", o.tls_cert, "PEM certificate: serve TLS");
  app.add_option("--tls-key", o.tls_key, "PEM private key of --tls-cert");
  app.add_option("--http-listen", o.http_listen, "web page host:port (same tokens and TLS); off = none");
  app.add_option("--tokens-file", o.tokens_file, "file of `user token [data=DIR,..] [output=DIR,..]` lines");
  app.add_option("--data-roots", o.data_roots, "DIR,...: where submitted jobs may read (default: anywhere)");
  app.add_option("--output-roots", o.output_roots, "DIR,...: where submitted jobs may write (default: anywhere)");
  app.add_flag("--allow-insecure-remote", o.allow_insecure_remote, "allow plaintext on a non-loopback address");
  app.add_option("--max-attempts", o.max_attempts, "job-runner attempts per job");
  app.add_option("--cancel-grace-seconds", o.cancel_grace_seconds, "seconds a cancelled job gets to stop before SIGKILL");
  app.add_option("--threads", o.threads, "CPU threads per job; 0 = all");
  app.add_option("--device-peak-flops", o.device_peak_flops, "peak FLOP/s for the MFU metric; 0 = estimate");
  app.add_option("--shutdown-timeout-seconds", o.shutdown_timeout_seconds,
                 "on SIGTERM: seconds the running job gets to checkpoint at its next step boundary "
                 "(it resumes there at the next start)");
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error");
  app.add_flag("--repair-store", o.repair_store,
               "repair a damaged job store (<state-dir>/db; backed up first to db.backup-<time>), then exit");

  // Flags given on the command line (they win over the config file).
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string config_path;
  std::set<std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    given.insert(name);
    if (name == "config") config_path = a.find('=') != std::string::npos ? a.substr(a.find('=') + 1)
                                        : (i + 1 < args.size() ? args[i + 1] : "");
  }
  std::vector<std::string> merged;
  if (!config_path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(config_path);
    } catch (const std::exception& e) {
      return Status::InvalidArgument("--config " + config_path + ": " + e.what());
    }
    if (root && !root.IsNull()) {
      if (!root.IsMap()) return Status::InvalidArgument("--config " + config_path + ": must be a mapping of flag names");
      for (const auto& kv : root) {
        std::string key = kv.first.as<std::string>();
        for (auto& c : key) if (c == '_') c = '-';
        if (key == "config" || !app.get_option_no_throw("--" + key))
          return Status::InvalidArgument("--config " + config_path + ": " + kv.first.as<std::string>() + ": unknown key");
        if (given.count(key)) continue;
        if ((key == "data-roots" || key == "output-roots") && kv.second.IsSequence()) {
          std::string joined;
          for (const auto& item : kv.second) {
            if (!item.IsScalar())
              return Status::InvalidArgument("--config " + config_path + ": " + key + ": must be a list of directories");
            joined += (joined.empty() ? "" : ",") + item.as<std::string>();
          }
          merged.push_back("--" + key + "=" + joined);
          continue;
        }
        if (!kv.second.IsScalar())
          return Status::InvalidArgument("--config " + config_path + ": " + key + ": must be a scalar");
        const std::string value = kv.second.as<std::string>();
        if (key == "allow-insecure-remote" || key == "repair-store") {
          if (value == "true") merged.push_back("--" + key);
          continue;
        }
        merged.push_back("--" + key + "=" + value);
      }
    }
  }
  merged.insert(merged.end(), args.begin(), args.end());
  std::vector<std::string> reversed(merged.rbegin(), merged.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    *help = true;
    return Status::InvalidArgument(app.help());
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what());
  }
  TRAIND_ASSIGN_OR_RETURN(o.memory_budget_bytes, ParseBytes(o.memory_budget));
  if (o.tls_cert.empty() != o.tls_key.empty())
    return Status::InvalidArgument("--tls-cert and --tls-key go together; give both or neither");
  if (o.tls_cert.empty() && !o.allow_insecure_remote && !IsLoopbackAddress(o.listen))
    return Status::InvalidArgument("refusing plaintext gRPC on non-loopback address " + o.listen +
                                   ": give --tls-cert/--tls-key, or --allow-insecure-remote");
  o.http_listen_given = app.count("--http-listen") > 0;
  if (o.http_listen.empty()) o.http_listen = "off";
  if (o.http_listen != "off" && o.tls_cert.empty() && !o.allow_insecure_remote && !IsLoopbackAddress(o.http_listen))
    return Status::InvalidArgument("refusing plaintext HTTP on non-loopback address " + o.http_listen +
                                   ": give --tls-cert/--tls-key, or --allow-insecure-remote");
  if (!o.data_roots.empty()) {
    TRAIND_ASSIGN_OR_RETURN(o.data_root_dirs, ParseRoots(o.data_roots, "--data-roots", /*allow_relative=*/true));
  }
  if (!o.output_roots.empty()) {
    TRAIND_ASSIGN_OR_RETURN(o.output_root_dirs, ParseRoots(o.output_roots, "--output-roots", /*allow_relative=*/true));
  }
  if (!o.data_root_dirs.empty() && o.output_root_dirs.empty())
    return Status::InvalidArgument(
        "--data-roots needs --output-roots too: jobs would have nowhere to write their output_dir");
  if (o.max_attempts < 1) return Status::InvalidArgument("--max-attempts must be at least 1");
  static const std::set<std::string> kLevels{"trace", "debug", "info", "warn", "error"};
  if (!kLevels.count(o.log_level)) return Status::InvalidArgument("--log-level: unknown level " + o.log_level);
  return o;
}

}  // namespace traind::server
