// Metrics: every family of docs/metrics.md, registered here and nowhere else, and
// the HTTP server (cpp-httplib) that serves them at http://<listen>/metrics. Per-job series
// carry {job_id, job_name}; they appear when the job starts and are removed when it ends.
// Thread-safe (prometheus-cpp metrics are; the per-job map is guarded by mu_).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "traind/engine/status.h"
#include "traind/v1/job.pb.h"
#include "traind/engine/mutex.h"

namespace httplib {
class Server;
}

namespace traind::server {

class Metrics {
 public:
  // Serves /metrics on `listen` ("127.0.0.1:9464"; port 0 picks one). `device_peak_flops` is the
  // denominator of traind_model_flops_utilization; `device_total_bytes` is reported as
  // traind_device_memory_total_bytes. UNAVAILABLE when the address cannot be bound.
  static Result<std::unique_ptr<Metrics>> Start(const std::string& listen, double device_peak_flops,
                                                int64_t device_total_bytes);

  ~Metrics();

  int port() const { return port_; }

  void SetJobCounts(const std::map<v1::JobState, int>& counts);
  void SetQueueLength(size_t n);
  void CountRequest(const std::string& method, const std::string& code);

  // Per-job series: created by JobStarted (idempotent), updated by the events, removed by JobEnded.
  // `world_size` and `rank`: the job's place in a data-parallel run (world_size <= 1: a plain job;
  // traind_world_size is 1 and it has no traind_comm_* series).
  void JobStarted(const std::string& id, const std::string& name, const v1::Plan& plan,
                  int64_t world_size = 1, int64_t rank = 0);
  void OnStep(const std::string& id, const v1::StepEvent& e);
  void OnLog(const std::string& id, const v1::LogEvent& e);
  void OnEval(const std::string& id, const v1::EvalEvent& e);
  // traind_tokenize_bytes_total: adds the bytes encoded since the previous event of a cache miss
  // (a first event, bytes_done 0, starts a new count; cache hits add nothing).
  void OnTokenize(const std::string& id, const v1::TokenizeEvent& e);
  void JobEnded(const std::string& id);

 private:
  struct JobSeries;
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  // /metrics over cpp-httplib (its threads have the default stack). Not prometheus-cpp's civetweb
  // Exposer: Debian's civetweb gives its workers 100 KiB stacks, of which glibc takes the static
  // TLS of every loaded library (OpenBLAS alone 60 KiB); a scrape overflowed what was left and
  // killed the daemon.
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;
  double peak_flops_ = 0;

  prometheus::Family<prometheus::Gauge>* jobs_ = nullptr;
  prometheus::Gauge* queue_length_ = nullptr;
  prometheus::Family<prometheus::Counter>* steps_ = nullptr;
  prometheus::Family<prometheus::Counter>* tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* samples_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tokens_per_second_ = nullptr;
  prometheus::Family<prometheus::Gauge>* samples_per_second_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* train_loss_ = nullptr;
  prometheus::Family<prometheus::Gauge>* eval_loss_ = nullptr;
  prometheus::Family<prometheus::Gauge>* learning_rate_ = nullptr;
  prometheus::Family<prometheus::Gauge>* grad_norm_ = nullptr;
  prometheus::Family<prometheus::Counter>* skipped_ = nullptr;
  prometheus::Family<prometheus::Gauge>* mfu_ = nullptr;
  prometheus::Family<prometheus::Gauge>* planned_bytes_ = nullptr;
  prometheus::Gauge* memory_used_ = nullptr;
  prometheus::Gauge* memory_peak_ = nullptr;
  prometheus::Gauge* memory_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* dataloader_wait_ = nullptr;
  prometheus::Family<prometheus::Counter>* offload_read_ = nullptr;
  prometheus::Family<prometheus::Counter>* offload_written_ = nullptr;
  prometheus::Family<prometheus::Counter>* offload_io_ = nullptr;
  prometheus::Family<prometheus::Counter>* offload_background_io_ = nullptr;
  prometheus::Family<prometheus::Gauge>* offload_store_ = nullptr;
  prometheus::Family<prometheus::Counter>* tokenize_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* comm_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* comm_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* comm_hidden_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* expert_tokens_ = nullptr;
  prometheus::Family<prometheus::Gauge>* world_size_ = nullptr;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;

  Mutex mu_;
  std::map<std::string, std::unique_ptr<JobSeries>> series_ TRAIND_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> request_counters_;  // mu_
};

}  // namespace traind::server
