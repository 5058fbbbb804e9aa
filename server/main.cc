// traind: the training daemon. main reads as the lifecycle: parse flags → options → start the
// components (logging, token auth, job store, metrics, job manager, gRPC) → wait for a signal →
// graceful stop with a timeout. Subcommands: `traind run JOB.yaml` (in-process, no daemon) and the
// hidden `traind job-runner` (the per-job child process the worker starts).
#include <absl/synchronization/mutex.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "auth.h"
#include "device_probe.h"
#include "health_service.h"
#include "http/web_server.h"
#include "job_manager.h"
#include "job_service.h"
#include "job_store.h"
#include "metrics.h"
#include "options.h"
#include "path_policy.h"
#include "run_command.h"
#include "traind/worker/job_runner.h"

namespace {

using traind::Status;
namespace server = traind::server;

void SetUpLogging(const server::ServerOptions& o) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto file = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(o.state_dir + "/traind.log",
                                                                      10 * 1024 * 1024, 3);
  auto logger = std::make_shared<spdlog::logger>("traind", spdlog::sinks_init_list{console, file});
  logger->set_level(spdlog::level::from_str(o.log_level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

std::shared_ptr<grpc::ServerCredentials> Credentials(const server::ServerOptions& o, Status* status) {
  if (o.tls_cert.empty()) return grpc::InsecureServerCredentials();
  auto read = [&](const std::string& path) {
    std::ifstream f(path);
    if (!f) *status = Status::InvalidArgument("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({read(o.tls_key), read(o.tls_cert)});
  return grpc::SslServerCredentials(ssl);
}

// Niceness of the gRPC threads: 200 concurrent clients then cost training a few percent of its
// throughput instead of a fifth on a 2-core machine (tests/daemon/load_test.cc).
constexpr int kControlPlaneNice = 10;
// gRPC threads kept waiting for calls between bursts (see BuildAndStart below).
constexpr int kMaxIdleGrpcThreads = 64;

int64_t HostMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int Fail(const Status& s) {
  spdlog::error("{}", s.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The device is used only by traind-job-runner, beside this binary (server/runner_main.cc);
  // without it, these subcommands run here on the CPU.
  if (argc >= 2 && std::string(argv[1]) == "job-runner") return traind::worker::JobRunnerMain();
  if (argc >= 2 && std::string(argv[1]) == "run") {
    const std::string runner = server::JobRunnerPath();
    if (runner.find("traind-job-runner") != std::string::npos) {
      argv[0] = const_cast<char*>(runner.c_str());
      ::execv(runner.c_str(), argv);
    }
    return server::RunCommandMain(argc - 1, argv + 1);
  }

  // Debian builds abseil without NDEBUG: every absl::Mutex lock (gRPC's too) then updates a
  // lock-order graph for deadlock detection, 2-3% of traind's CPU under polling clients. Release
  // builds of abseil have it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // 1. Options.
  bool help = false;
  auto parsed = server::ParseServerOptions(argc, argv, &help);
  if (!parsed.ok()) {
    std::fprintf(help ? stdout : stderr, "%s\n", parsed.status().message().c_str());
    return help ? 0 : 2;
  }
  const server::ServerOptions opts = *parsed;

  // Job runners inherit this: OpenMP threads that spin-wait for a core that another process holds
  // make every parallel region crawl (10x on a loaded 2-core machine); sleeping costs little.
  // An explicit OMP_WAIT_POLICY from the user wins.
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);

  // 2. Signals: blocked in every thread (set before any thread starts) and taken by sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // 3. Components.
  std::error_code ec;
  std::filesystem::create_directories(opts.state_dir + "/jobs", ec);
  if (ec) {
    std::fprintf(stderr, "cannot create the state dir %s: %s\n", opts.state_dir.c_str(), ec.message().c_str());
    return 1;
  }
  // `traind --repair-store`: repair the job store and exit, before anything else starts.
  if (opts.repair_store) return server::RepairStoreMain(opts.state_dir);
  SetUpLogging(opts);
  // The job runners' token caches (engine token_cache.h) live under the state dir unless the
  // environment names another folder; children inherit it.
  setenv("TRAIND_TOKEN_CACHE_DIR", (opts.state_dir + "/token-cache").c_str(), /*overwrite=*/0);
  auto auth = server::TokenAuth::Load(opts.state_dir, opts.tokens_file);
  if (!auth.ok()) return Fail(auth.status());
  auto store = server::JobStore::Open(opts.state_dir + "/db");
  if (!store.ok() && store.status().code() == Status::Code::kDataLoss) {
    // Exit 4, not a crash: restarting would only fail again (a service manager should not restart
    // on it: RestartPreventExitStatus=4); the operator repairs (docs/daemon.md, "Job store damage").
    spdlog::error("{}. traind does not start on a damaged job store. Stop here and run `traind --state-dir {} "
                  "--repair-store`: it backs the store up to {}/db.backup-<time>, repairs it and keeps every job "
                  "that can be read",
                  store.status().message(), opts.state_dir, opts.state_dir);
    return 4;
  }
  if (!store.ok()) return Fail(store.status());
  // The device: a named device that is not there (cuda:0 without a GPU) stops traind here, with
  // the reason; "auto" without a GPU says so once and trains on the CPU.
  auto device = server::ProbeDevice(opts.device);
  if (!device.ok()) {
    std::fprintf(stderr, "traind: --device %s: %s\n", opts.device.c_str(), device.status().message().c_str());
    return 2;
  }
  // What the device the probe resolved can do (its policy: capabilities, not its name).
  auto capabilities = traind::engine::DeviceCapabilitiesOf(device->device);
  if (!capabilities.ok()) return Fail(capabilities.status());
  const traind::engine::DeviceCapabilities& caps = capabilities.value();
  // "auto" resolved to a device of another name, one without memory of its own: no GPU.
  if (opts.device != device->device && !caps.has_own_memory) {
    spdlog::info("device auto: no GPU found; jobs train on the CPU backend ({})", device->name);
  } else {
    spdlog::info("device {}: {}", device->device, device->name);
  }
  double peak = opts.device_peak_flops;
  if (peak <= 0) peak = device->peak_flops;
  if (peak <= 0) peak = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)) * 3.0e9 * 32;
  const int64_t device_total = device->total_bytes > 0 ? device->total_bytes : HostMemoryBytes();
  auto metrics = server::Metrics::Start(opts.metrics_listen, peak, device_total);
  if (!metrics.ok()) return Fail(metrics.status());

  server::JobManagerOptions jm;
  jm.supervisor.runner_path = server::JobRunnerPath();
  // Jobs on the CPU start in the runner without the GPU backends: no cuBLASLt to load and
  // initialise at each job's start (0.5-1 s of CPU on the development VM).
  if (!caps.has_own_memory && !server::CpuRunnerPath().empty()) jm.supervisor.runner_path = server::CpuRunnerPath();
  jm.supervisor.device.device = opts.device;
  jm.supervisor.device.memory_budget_bytes = opts.memory_budget_bytes;
  jm.supervisor.device.threads = opts.threads;
  // Admission plans here, without the device library: the plan's arithmetic is the same on every
  // device, and the budget is the flag's or what the probe found free on the device (95%, the
  // margin the engine keeps for library workspaces outside its arena).
  jm.admission_device.device = "cpu";
  jm.run_device = device->device;
  jm.admission_device.memory_budget_bytes = opts.memory_budget_bytes;
  if (opts.memory_budget_bytes <= 0 && caps.has_own_memory) {
    jm.admission_device.memory_budget_bytes = static_cast<int64_t>(0.95 * static_cast<double>(device->free_bytes));
  }
  jm.admission_device.threads = opts.threads;
  jm.supervisor.max_attempts = opts.max_attempts;
  jm.supervisor.cancel_grace_seconds = opts.cancel_grace_seconds;
  jm.supervisor.stop_grace_seconds = opts.shutdown_timeout_seconds;
  jm.supervisor.log_dir = opts.state_dir + "/jobs";
  // Where submitted jobs may read and write: the flags' roots, replaced per user by the tokens
  // file's (server/path_policy.h). `traind run` never gets here: it is not confined.
  auto paths = server::PathPolicy::Create(opts.data_root_dirs, opts.output_root_dirs, auth->user_roots());
  if (!paths.ok()) return Fail(paths.status());
  jm.paths = std::move(*paths);
  if (!opts.data_root_dirs.empty() || !opts.output_root_dirs.empty() || !auth->user_roots().empty()) {
    spdlog::info("paths: jobs read in --data-roots [{}] and write in --output-roots [{}]; {} user(s) with own roots",
                 opts.data_roots, opts.output_roots, auth->user_roots().size());
  }
  server::JobManager jobs(jm, store->get(), metrics->get());
  if (Status s = jobs.Start(); !s.ok()) return Fail(s);

  server::JobServiceImpl service(&jobs, &*auth, metrics->get());
  // grpc.health.v1.Health: traind's own (health_service.h), not gRPC's default service.
  server::HealthService health;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  Status cred_status;
  auto creds = Credentials(opts, &cred_status);
  if (!cred_status.ok()) return Fail(cred_status);
  // The control plane yields to training: threads created from here on (the gRPC server's) run
  // at a lower priority (Linux niceness is per thread and inherited at creation). The job
  // supervisor's thread, which starts the job runners, was created above at normal priority.
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kControlPlaneNice);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(opts.listen, creds, &grpc_port);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  // GetJob, ListJobs and WatchJobEvents: served from this queue by one thread, the only one that
  // polls (server/job_service.h); with it the sync server's queue does not poll.
  std::unique_ptr<grpc::ServerCompletionQueue> async_cq = builder.AddCompletionQueue();
  // No BDP probes: each one is a PING the peer answers, a write and a wake-up more per call of a
  // client that polls (the control plane's messages are small; its window never needs growing).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The sync server's threads (they wait on their queue, not on sockets: the async queue's thread
  // polls): a thread that takes a call is replaced when fewer than MIN_POLLERS wait, and a thread
  // back from a call exits when more than MAX_POLLERS wait. With the defaults (1, 2) a steady stream of calls from many clients
  // creates and ends a thread for most of them (stack mmap/munmap, page faults: about half of a
  // GetJob's CPU in tests/daemon/load_test); idle threads that stay cost nothing.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kMaxIdleGrpcThreads);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (!grpc_server || grpc_port == 0) {
    jobs.Stop();
    return Fail(Status::Unavailable("cannot listen on " + opts.listen + " (in use, or not an address of this host)"));
  }
  std::thread async_thread([&] {
    pthread_setname_np(pthread_self(), "traind-grpc");  // as tests/daemon/load_test prints it
    service.ServeAsync(async_cq.get());
  });
  health.SetServingStatus("traind.v1.JobService", true);
  // The web page: same job manager, same tokens, same certificate (server/http/web_server.h).
  std::unique_ptr<server::http::WebServer> web;
  if (opts.http_listen != "off") {
    server::http::WebOptions wo;
    wo.listen = opts.http_listen;
    wo.tls_cert = opts.tls_cert;
    wo.tls_key = opts.tls_key;
    wo.peak_flops = peak;
    auto started = server::http::WebServer::Start(wo, &jobs, &*auth);
    if (started.ok()) {
      web = std::move(*started);
    } else if (opts.http_listen_given) {
      jobs.Stop();
      grpc_server->Shutdown();
      service.StopAsync(async_cq.get());
      async_thread.join();
      return Fail(started.status());
    } else {
      spdlog::warn("web page off: {} (set --http-listen to another address)", started.status().message());
    }
  }
  const int http_port = web ? web->port() : 0;
  {
    std::ofstream ports(opts.state_dir + "/ports.json");
    ports << "{\"grpc\":" << grpc_port << ",\"metrics\":" << (*metrics)->port() << ",\"http\":" << http_port
          << ",\"pid\":" << getpid() << "}\n";
  }
  spdlog::info("traind serving gRPC on port {} ({}), metrics on port {}, web page {}, state in {}", grpc_port,
               opts.tls_cert.empty() ? "plaintext" : "TLS", (*metrics)->port(),
               web ? fmt::format("on port {} ({})", http_port, opts.tls_cert.empty() ? "http" : "https") : std::string("off"),
               opts.state_dir);

  // 4. Serve until SIGINT/SIGTERM.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: stopping (timeout {} s)", sig, opts.shutdown_timeout_seconds);

  // 5. Graceful stop: no new jobs start, the running job writes a checkpoint at its next step
  // boundary (preemption, within the timeout) and resumes from it at the next start; watchers end;
  // in-flight RPCs get what is left of the timeout (a second at least).
  health.Shutdown();
  if (web) web->Stop();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(opts.shutdown_timeout_seconds * 1000));
  jobs.Stop();
  grpc_server->Shutdown(std::max(deadline, std::chrono::system_clock::now() + std::chrono::seconds(1)));
  grpc_server->Wait();
  service.StopAsync(async_cq.get());
  async_thread.join();
  spdlog::info("traind stopped");
  return 0;
}
