// traind: the training daemon. main reads as the lifecycle: parse flags → options → start the
// components (logging, token auth, job store, metrics, job manager, gRPC) → wait for a signal →
// graceful stop with a timeout. Subcommands: `traind run JOB.yaml` (in-process, no daemon) and the
// hidden `traind job-runner` (the per-job child process the worker starts).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "auth.h"
#include "job_manager.h"
#include "job_service.h"
#include "job_store.h"
#include "metrics.h"
#include "options.h"
#include "traind/worker/job_runner.h"

namespace {

using traind::Status;
namespace server = traind::server;

int RunCommand(int argc, char** argv) {
  CLI::App app{"traind run: train a job spec in this process, without the daemon"};
  std::string spec, device = "auto", budget = "auto";
  bool resume = false;
  int threads = 0;
  app.add_option("spec", spec, "job spec (YAML)")->required();
  app.add_option("--device", device, "auto | cpu | cuda:N");
  app.add_option("--memory-budget", budget, "bytes or auto");
  app.add_option("--threads", threads, "CPU threads; 0 = all");
  app.add_flag("--resume", resume, "continue from output_dir's newest checkpoint");
  CLI11_PARSE(app, argc, argv);
  auto bytes = server::ParseBytes(budget);
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().message().c_str());
    return 2;
  }
  traind::engine::DeviceOptions d;
  d.device = device;
  d.memory_budget_bytes = *bytes;
  d.threads = threads;
  return traind::worker::RunLocal(spec, d, resume);
}

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

int64_t HostMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int Fail(const Status& s) {
  spdlog::error("{}", s.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "job-runner") return traind::worker::JobRunnerMain();
  if (argc >= 2 && std::string(argv[1]) == "run") return RunCommand(argc - 1, argv + 1);

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
  SetUpLogging(opts);
  auto auth = server::TokenAuth::Load(opts.state_dir, opts.tokens_file);
  if (!auth.ok()) return Fail(auth.status());
  auto store = server::JobStore::Open(opts.state_dir + "/db");
  if (!store.ok()) return Fail(store.status());
  double peak = opts.device_peak_flops;
  if (peak <= 0) peak = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)) * 3.0e9 * 32;
  auto metrics = server::Metrics::Start(opts.metrics_listen, peak, HostMemoryBytes());
  if (!metrics.ok()) return Fail(metrics.status());

  server::JobManagerOptions jm;
  jm.supervisor.runner_path = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  jm.supervisor.device.device = opts.device;
  jm.supervisor.device.memory_budget_bytes = opts.memory_budget_bytes;
  jm.supervisor.device.threads = opts.threads;
  jm.supervisor.max_attempts = opts.max_attempts;
  jm.supervisor.cancel_grace_seconds = opts.cancel_grace_seconds;
  jm.supervisor.log_dir = opts.state_dir + "/jobs";
  server::JobManager jobs(jm, store->get(), metrics->get());
  if (Status s = jobs.Start(); !s.ok()) return Fail(s);

  server::JobServiceImpl service(&jobs, &*auth, metrics->get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  Status cred_status;
  auto creds = Credentials(opts, &cred_status);
  if (!cred_status.ok()) return Fail(cred_status);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(opts.listen, creds, &grpc_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (!grpc_server || grpc_port == 0) {
    jobs.Stop();
    return Fail(Status::Unavailable("cannot listen on " + opts.listen + " (in use, or not an address of this host)"));
  }
  grpc_server->GetHealthCheckService()->SetServingStatus("traind.v1.JobService", true);
  {
    std::ofstream ports(opts.state_dir + "/ports.json");
    ports << "{\"grpc\":" << grpc_port << ",\"metrics\":" << (*metrics)->port() << ",\"pid\":" << getpid() << "}\n";
  }
  spdlog::info("traind serving gRPC on port {} ({}), metrics on port {}, state in {}", grpc_port,
               opts.tls_cert.empty() ? "plaintext" : "TLS", (*metrics)->port(), opts.state_dir);

  // 4. Serve until SIGINT/SIGTERM.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: stopping (timeout {} s)", sig, opts.shutdown_timeout_seconds);

  // 5. Graceful stop: no new jobs start and watchers end; in-flight RPCs get the timeout.
  grpc_server->GetHealthCheckService()->SetServingStatus(false);
  jobs.Stop();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(opts.shutdown_timeout_seconds * 1000));
  grpc_server->Shutdown(deadline);
  grpc_server->Wait();
  spdlog::info("traind stopped");
  return 0;
}
