// ServerOptions: everything traind can be told, from flags (CLI.md) or a --config YAML file whose
// keys are the flag names without dashes (a flag on the command line wins over the file).
// Validated once, in ParseServerOptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "traind/engine/status.h"

namespace traind::server {

struct ServerOptions {
  std::string config;                             // YAML file of these keys; "" = none
  std::string state_dir = "./.traind";            // RocksDB (db/), token, traind.log, jobs/*.log
  std::string listen = "127.0.0.1:50051";         // gRPC host:port; port 0 picks a free one
  std::string metrics_listen = "127.0.0.1:9464";  // Prometheus /metrics; port 0 picks one
  std::string device = "auto";                    // auto | cpu | cuda:N
  std::string memory_budget = "auto";             // bytes (suffixes K M G, KiB MiB GiB) or auto
  int64_t memory_budget_bytes = 0;                // parsed memory_budget; 0 = device capacity
  std::string tls_cert, tls_key;                  // PEM files: serve TLS (both or neither)
  // The web page (server/http): host:port, port 0 picks one; "off" = none. When the default
  // address is taken (another traind), traind logs a warning and serves without the page; an
  // address given by flag or config must bind or traind stops.
  std::string http_listen = "127.0.0.1:8080";
  bool http_listen_given = false;
  std::string tokens_file;  // `user token [data=DIR,..] [output=DIR,..]` lines (beside <state-dir>/token)
  // Path confinement (path_policy.h): comma-separated directories where submitted jobs may read
  // (data; outputs count too) and write (output). "" = none: not confined, unless the tokens file
  // gives the user roots. Relative entries resolve against traind's working directory; each must
  // be an existing directory; data roots need output roots. In a --config file also a YAML list.
  std::string data_roots, output_roots;
  std::vector<std::string> data_root_dirs, output_root_dirs;  // parsed, resolved (symlinks, `..`)
  bool allow_insecure_remote = false;  // plaintext on a non-loopback address (default: refused)
  int max_attempts = 3;                // job-runner attempts per job before FAILED
  double cancel_grace_seconds = 10;    // cancel signal → SIGKILL for a cancelled job's child
  int threads = 0;                     // CPU threads per job; 0 = all cores
  // Denominator of traind_model_flops_utilization in FLOP/s; 0 = on CPU, cores x 3 GHz x 32
  // (two 8-wide fp32 FMA units); on CUDA it must be set.
  double device_peak_flops = 0;
  // Graceful stop (SIGTERM/SIGINT): the running job gets this long to write its preemption
  // checkpoint at its next step boundary (then SIGKILL); in-flight RPCs get what is left of it
  // (a second at least).
  double shutdown_timeout_seconds = 25;
  std::string log_level = "info";        // trace | debug | info | warn | error
  // Repair the job store (<state-dir>/db) instead of serving: back it up, rocksdb::RepairDB, keep
  // every job that can be read, summary on stdout, exit (JobStore::Repair, docs/daemon.md).
  bool repair_store = false;
};

// Parses argv (the daemon's, without a subcommand). INVALID_ARGUMENT with one sentence for bad
// flags, config keys or values; a non-loopback plaintext --listen is refused here. `help` is set
// (and the usage text returned in the status message) for --help.
Result<ServerOptions> ParseServerOptions(int argc, char** argv, bool* help);

// "8GiB" → 8589934592, "auto" → 0; INVALID_ARGUMENT otherwise.
Result<int64_t> ParseBytes(const std::string& text);

// True for 127.0.0.0/8, ::1 and localhost hosts of a "host:port" address.
bool IsLoopbackAddress(const std::string& host_port);

}  // namespace traind::server
