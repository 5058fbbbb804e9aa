// The Metrics registry (see metrics.h). To add a metric: a row in METRICS.md, a family member in
// metrics.h, its Build* call in Start(), and the update where its value is known.
#include "metrics.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <exception>
#include <vector>

namespace traind::server {

using prometheus::Labels;

struct Metrics::JobSeries {
  Labels labels;
  prometheus::Counter* steps;
  prometheus::Counter* tokens;
  prometheus::Counter* samples;
  prometheus::Gauge* tokens_per_second;
  prometheus::Gauge* samples_per_second;
  prometheus::Histogram* step_seconds;
  prometheus::Gauge* train_loss;
  prometheus::Gauge* eval_loss;
  prometheus::Gauge* learning_rate;
  prometheus::Gauge* grad_norm;
  prometheus::Counter* skipped;
  prometheus::Gauge* mfu;
  std::map<std::string, prometheus::Gauge*> planned;
  prometheus::Counter* dataloader_wait;
  prometheus::Counter* offload_read;
  prometheus::Counter* offload_written;
  prometheus::Counter* offload_io;
  prometheus::Counter* offload_background_io;
  prometheus::Gauge* offload_store;
  prometheus::Counter* tokenize_bytes;
  prometheus::Gauge* world_size;
  // Distributed jobs only (labels + rank); null for a plain job.
  prometheus::Counter* comm_seconds = nullptr;
  prometheus::Counter* comm_bytes = nullptr;
  prometheus::Counter* comm_hidden_seconds = nullptr;
  // Mixture of experts: one counter per (layer, expert), made on the first step that reports.
  std::vector<prometheus::Counter*> expert_tokens;
  int64_t tokenize_bytes_counted = 0;  // bytes_done of the current tokenization already counted
};

Metrics::~Metrics() {
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
}

Result<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen, double device_peak_flops,
                                                int64_t device_total_bytes) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->peak_flops_ = device_peak_flops;
  m->registry_ = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  m->jobs_ = &BuildGauge().Name("traind_jobs").Help("Jobs per state").Register(r);
  m->queue_length_ = &BuildGauge().Name("traind_queue_length").Help("Jobs waiting for the device").Register(r).Add({});
  m->steps_ = &BuildCounter().Name("traind_train_steps_total").Help("Optimizer steps done").Register(r);
  m->tokens_ = &BuildCounter().Name("traind_train_tokens_total").Help("Tokens trained").Register(r);
  m->samples_ = &BuildCounter().Name("traind_train_samples_total").Help("Sequences trained").Register(r);
  m->tokens_per_second_ = &BuildGauge().Name("traind_train_tokens_per_second")
                               .Help("Tokens per second over the last logging window").Register(r);
  m->samples_per_second_ = &BuildGauge().Name("traind_train_samples_per_second")
                                .Help("Sequences per second over the last logging window").Register(r);
  m->step_seconds_ = &BuildHistogram().Name("traind_train_step_seconds").Help("Wall time of one optimizer step").Register(r);
  m->train_loss_ = &BuildGauge().Name("traind_train_loss").Help("Last logged training loss").Register(r);
  m->eval_loss_ = &BuildGauge().Name("traind_eval_loss").Help("Last evaluation loss").Register(r);
  m->learning_rate_ = &BuildGauge().Name("traind_train_learning_rate").Help("Last learning rate").Register(r);
  m->grad_norm_ = &BuildGauge().Name("traind_train_grad_norm").Help("Last global gradient norm before clipping").Register(r);
  m->skipped_ = &BuildCounter().Name("traind_train_skipped_steps_total").Help("fp16 steps skipped on overflow").Register(r);
  m->mfu_ = &BuildGauge().Name("traind_model_flops_utilization")
                 .Help("Achieved model FLOP/s over the device's peak FLOP/s").Register(r);
  m->planned_bytes_ = &BuildGauge().Name("traind_device_memory_bytes").Help("Planned device bytes by kind").Register(r);
  m->memory_used_ = &BuildGauge().Name("traind_device_memory_used_bytes").Help("Allocator bytes in use").Register(r).Add({});
  m->memory_peak_ = &BuildGauge().Name("traind_device_memory_peak_bytes").Help("Allocator high-water mark").Register(r).Add({});
  m->memory_total_ = &BuildGauge().Name("traind_device_memory_total_bytes")
                          .Help("Device memory capacity (host RAM on the CPU backend)").Register(r).Add({});
  m->dataloader_wait_ = &BuildCounter().Name("traind_dataloader_wait_seconds_total")
                             .Help("Time steps waited for data").Register(r);
  m->offload_read_ = &BuildCounter().Name("traind_offload_read_bytes_total").Help("Offloaded optimizer-state bytes read").Register(r);
  m->offload_written_ = &BuildCounter().Name("traind_offload_written_bytes_total")
                             .Help("Offloaded optimizer-state bytes written").Register(r);
  m->offload_io_ = &BuildCounter().Name("traind_offload_io_seconds_total")
                        .Help("Time spent waiting on offload I/O").Register(r);
  m->offload_background_io_ =
      &BuildCounter().Name("traind_offload_background_io_seconds_total")
           .Help("Offload I/O time on the store's own threads, behind compute (read-ahead, write-behind, "
                 "commits; thread-seconds)").Register(r);
  m->offload_store_ = &BuildGauge().Name("traind_offload_store_bytes")
                           .Help("Bytes the offload store holds (disk for nvme, RAM for cpu)").Register(r);
  m->tokenize_bytes_ = &BuildCounter().Name("traind_tokenize_bytes_total")
                            .Help("Source bytes tokenized (cache misses only)").Register(r);
  m->comm_seconds_ = &BuildCounter().Name("traind_comm_seconds_total")
                          .Help("Time this rank spent in collectives, not hidden by compute (data parallel)").Register(r);
  m->comm_bytes_ = &BuildCounter().Name("traind_comm_bytes_total")
                        .Help("Bytes this rank's collectives sent (data parallel)").Register(r);
  m->comm_hidden_seconds_ = &BuildCounter().Name("traind_comm_hidden_seconds_total")
                                 .Help("Collective time that ran while backward computed (data parallel)").Register(r);
  m->expert_tokens_ = &BuildCounter().Name("traind_moe_expert_tokens_total")
                          .Help("Tokens routed to each expert (mixture of experts)").Register(r);
  m->world_size_ = &BuildGauge().Name("traind_world_size").Help("Ranks of a distributed job (1 for a plain job)").Register(r);
  m->requests_ = &BuildCounter().Name("traind_grpc_requests_total").Help("Control-plane calls by method and code").Register(r);
  m->memory_total_->Set(static_cast<double>(device_total_bytes));
  for (const char* s : {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}) m->jobs_->Add({{"state", s}});
  // "host:port", "[v6]:port" or "port" (every interface).
  const auto colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "0.0.0.0" : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    const std::string p = colon == std::string::npos ? listen : listen.substr(colon + 1);
    port = std::stoi(p, &used);
    if (used != p.size() || port < 0 || port > 65535) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0) return Status::InvalidArgument("--metrics-listen: expected host:port, got " + listen);
  m->http_ = std::make_unique<httplib::Server>();
  std::shared_ptr<prometheus::Registry> registry = m->registry_;
  m->http_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    m->port_ = std::max(0, m->http_->bind_to_any_port(host));
  } else if (m->http_->bind_to_port(host, port)) {
    m->port_ = port;
  }
  if (m->port_ == 0) {
    return Status::Unavailable("cannot serve metrics on " + listen +
                               " (in use, or not an address of this host)");
  }
  httplib::Server* srv = m->http_.get();
  m->http_thread_ = std::thread([srv] { srv->listen_after_bind(); });
  return m;
}

void Metrics::SetJobCounts(const std::map<v1::JobState, int>& counts) {
  static const std::pair<v1::JobState, const char*> kStates[] = {
      {v1::JOB_STATE_QUEUED, "QUEUED"}, {v1::JOB_STATE_RUNNING, "RUNNING"}, {v1::JOB_STATE_SUCCEEDED, "SUCCEEDED"},
      {v1::JOB_STATE_FAILED, "FAILED"}, {v1::JOB_STATE_CANCELLED, "CANCELLED"}};
  for (const auto& [state, name] : kStates) {
    auto it = counts.find(state);
    jobs_->Add({{"state", name}}).Set(it == counts.end() ? 0 : it->second);
  }
}

void Metrics::SetQueueLength(size_t n) { queue_length_->Set(static_cast<double>(n)); }

void Metrics::CountRequest(const std::string& method, const std::string& code) {
  MutexLock lock(&mu_);
  auto& c = request_counters_[{method, code}];
  if (!c) c = &requests_->Add({{"method", method}, {"code", code}});
  c->Increment();
}

void Metrics::JobStarted(const std::string& id, const std::string& name, const v1::Plan& plan,
                         int64_t world_size, int64_t rank) {
  MutexLock lock(&mu_);
  auto& s = series_[id];
  if (!s) {
    s = std::make_unique<JobSeries>();
    const Labels l{{"job_id", id}, {"job_name", name}};
    s->labels = l;
    s->steps = &steps_->Add(l);
    s->tokens = &tokens_->Add(l);
    s->samples = &samples_->Add(l);
    s->tokens_per_second = &tokens_per_second_->Add(l);
    s->samples_per_second = &samples_per_second_->Add(l);
    s->step_seconds = &step_seconds_->Add(
        l, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
    s->train_loss = &train_loss_->Add(l);
    s->eval_loss = &eval_loss_->Add(l);
    s->learning_rate = &learning_rate_->Add(l);
    s->grad_norm = &grad_norm_->Add(l);
    s->skipped = &skipped_->Add(l);
    s->mfu = &mfu_->Add(l);
    for (const char* kind : {"weights", "gradients", "optimizer", "activations", "temporary"}) {
      Labels lk = l;
      lk["kind"] = kind;
      s->planned[kind] = &planned_bytes_->Add(lk);
    }
    s->dataloader_wait = &dataloader_wait_->Add(l);
    s->offload_read = &offload_read_->Add(l);
    s->offload_written = &offload_written_->Add(l);
    s->offload_io = &offload_io_->Add(l);
    s->offload_background_io = &offload_background_io_->Add(l);
    s->offload_store = &offload_store_->Add(l);
    s->tokenize_bytes = &tokenize_bytes_->Add(l);
    s->world_size = &world_size_->Add(l);
    s->world_size->Set(static_cast<double>(std::max<int64_t>(1, world_size)));
    if (world_size > 1) {
      Labels lr = l;
      lr["rank"] = std::to_string(rank);
      s->comm_seconds = &comm_seconds_->Add(lr);
      s->comm_bytes = &comm_bytes_->Add(lr);
      s->comm_hidden_seconds = &comm_hidden_seconds_->Add(lr);
    }
  }
  const auto& b = plan.bytes();
  s->planned["weights"]->Set(static_cast<double>(b.weights()));
  s->planned["gradients"]->Set(static_cast<double>(b.gradients()));
  s->planned["optimizer"]->Set(static_cast<double>(b.optimizer()));
  s->planned["activations"]->Set(static_cast<double>(b.activations()));
  s->planned["temporary"]->Set(static_cast<double>(b.temporary()));
}

void Metrics::OnStep(const std::string& id, const v1::StepEvent& e) {
  MutexLock lock(&mu_);
  auto it = series_.find(id);
  if (it == series_.end()) return;
  JobSeries& s = *it->second;
  s.steps->Increment();
  s.tokens->Increment(static_cast<double>(e.tokens()));
  s.samples->Increment(static_cast<double>(e.samples()));
  s.step_seconds->Observe(e.step_seconds());
  s.train_loss->Set(e.loss());
  s.learning_rate->Set(e.learning_rate());
  s.grad_norm->Set(e.grad_norm());
  if (e.skipped()) s.skipped->Increment();
  s.offload_read->Increment(static_cast<double>(std::max<int64_t>(0, e.offload_read_bytes())));
  s.offload_written->Increment(static_cast<double>(std::max<int64_t>(0, e.offload_written_bytes())));
  s.offload_io->Increment(std::max(0.0, e.offload_io_seconds()));
  s.offload_background_io->Increment(std::max(0.0, e.offload_background_io_seconds()));
  s.offload_store->Set(static_cast<double>(e.offload_store_bytes()));
  s.dataloader_wait->Increment(std::max(0.0, e.dataloader_wait_seconds()));
  if (s.comm_seconds != nullptr) {
    s.comm_seconds->Increment(std::max(0.0, e.comm_seconds()));
    s.comm_bytes->Increment(static_cast<double>(std::max<int64_t>(0, e.comm_bytes())));
    s.comm_hidden_seconds->Increment(std::max(0.0, e.comm_hidden_seconds()));
  }
  if (e.expert_tokens_size() > 0 && e.expert_layers() > 0 &&
      e.expert_tokens_size() % e.expert_layers() == 0) {
    if (s.expert_tokens.empty()) {
      const int64_t experts = e.expert_tokens_size() / e.expert_layers();
      for (int64_t i = 0; i < e.expert_tokens_size(); ++i) {
        Labels le = s.labels;
        le["layer"] = std::to_string(i / experts);
        le["expert"] = std::to_string(i % experts);
        s.expert_tokens.push_back(&expert_tokens_->Add(le));
      }
    }
    if (static_cast<int64_t>(s.expert_tokens.size()) == e.expert_tokens_size()) {
      for (int i = 0; i < e.expert_tokens_size(); ++i) {
        s.expert_tokens[i]->Increment(static_cast<double>(std::max<int64_t>(0, e.expert_tokens(i))));
      }
    }
  }
  if (e.step_seconds() > 0) {
    if (peak_flops_ > 0) s.mfu->Set(e.model_flops() / e.step_seconds() / peak_flops_);
    // Until the first logging window reports, throughput is the last step's.
    if (s.tokens_per_second->Value() == 0) {
      s.tokens_per_second->Set(static_cast<double>(e.tokens()) / e.step_seconds());
      s.samples_per_second->Set(static_cast<double>(e.samples()) / e.step_seconds());
    }
  }
  memory_used_->Set(static_cast<double>(e.memory_used_bytes()));
  memory_peak_->Set(std::max(memory_peak_->Value(), static_cast<double>(e.memory_peak_bytes())));
}

void Metrics::OnLog(const std::string& id, const v1::LogEvent& e) {
  MutexLock lock(&mu_);
  auto it = series_.find(id);
  if (it == series_.end()) return;
  it->second->tokens_per_second->Set(e.tokens_per_second());
  it->second->samples_per_second->Set(e.samples_per_second());
  it->second->train_loss->Set(e.loss());
}

void Metrics::OnEval(const std::string& id, const v1::EvalEvent& e) {
  MutexLock lock(&mu_);
  auto it = series_.find(id);
  if (it == series_.end()) return;
  it->second->eval_loss->Set(e.eval_loss());
}

void Metrics::OnTokenize(const std::string& id, const v1::TokenizeEvent& e) {
  MutexLock lock(&mu_);
  auto it = series_.find(id);
  if (it == series_.end() || e.cache_hit()) return;
  JobSeries& s = *it->second;
  // A new tokenization (another attempt, another file) starts from 0.
  if (e.bytes_done() == 0 || e.bytes_done() < s.tokenize_bytes_counted) s.tokenize_bytes_counted = 0;
  const int64_t add = e.bytes_done() - s.tokenize_bytes_counted;
  if (add > 0) s.tokenize_bytes->Increment(static_cast<double>(add));
  s.tokenize_bytes_counted = e.bytes_done();
}

void Metrics::JobEnded(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = series_.find(id);
  if (it == series_.end()) return;
  JobSeries& s = *it->second;
  steps_->Remove(s.steps);
  tokens_->Remove(s.tokens);
  samples_->Remove(s.samples);
  tokens_per_second_->Remove(s.tokens_per_second);
  samples_per_second_->Remove(s.samples_per_second);
  step_seconds_->Remove(s.step_seconds);
  train_loss_->Remove(s.train_loss);
  eval_loss_->Remove(s.eval_loss);
  learning_rate_->Remove(s.learning_rate);
  grad_norm_->Remove(s.grad_norm);
  skipped_->Remove(s.skipped);
  mfu_->Remove(s.mfu);
  for (auto& [kind, g] : s.planned) planned_bytes_->Remove(g);
  dataloader_wait_->Remove(s.dataloader_wait);
  offload_read_->Remove(s.offload_read);
  offload_written_->Remove(s.offload_written);
  offload_io_->Remove(s.offload_io);
  offload_background_io_->Remove(s.offload_background_io);
  offload_store_->Remove(s.offload_store);
  tokenize_bytes_->Remove(s.tokenize_bytes);
  world_size_->Remove(s.world_size);
  if (s.comm_seconds != nullptr) {
    comm_seconds_->Remove(s.comm_seconds);
    comm_bytes_->Remove(s.comm_bytes);
    comm_hidden_seconds_->Remove(s.comm_hidden_seconds);
  }
  for (prometheus::Counter* c : s.expert_tokens) expert_tokens_->Remove(c);
  series_.erase(it);
  memory_used_->Set(0);
}

}  // namespace traind::server
