// Metrics: a scrape of /metrics during a job finds every METRICS.md series that applies, with
// values that move between scrapes; the per-job series go away when the job ends. A second test
// runs the real Prometheus server (Debian `prometheus`) against traind and reads a series back
// through its HTTP API.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-metrics");
    data_ = WriteTextData(dir_);
  }
  std::string Spec(const std::string& name, int64_t steps) {
    SpecOptions o;
    o.train_file = data_;
    o.max_steps = steps;
    o.logging_steps = 2;
    return WriteJobSpec(dir_, name, o);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string dir_, data_;
};

TEST_F(MetricsTest, EverySeriesPresentAndMovingDuringAJob) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto job = c->SubmitFile(Spec("metered", 100000));
  auto queued = c->SubmitFile(Spec("waiting", 2));
  ASSERT_TRUE(job.ok() && queued.ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 5; }, 60));
  const std::string label = "job_id=\"" + job->id() + "\"";
  const auto first = ParseMetrics(HttpGet(d.metrics_port(), "/metrics"));
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 15; }, 60));
  const std::string text = HttpGet(d.metrics_port(), "/metrics");
  const auto second = ParseMetrics(text);

  const std::vector<std::string> per_job = {
      "traind_train_steps_total", "traind_train_tokens_total", "traind_train_samples_total",
      "traind_train_tokens_per_second", "traind_train_samples_per_second", "traind_train_step_seconds_count",
      "traind_train_step_seconds_sum", "traind_train_step_seconds_bucket", "traind_train_loss", "traind_eval_loss",
      "traind_train_learning_rate", "traind_train_grad_norm", "traind_train_skipped_steps_total",
      "traind_model_flops_utilization", "traind_device_memory_bytes", "traind_dataloader_wait_seconds_total",
      "traind_offload_read_bytes_total", "traind_offload_written_bytes_total", "traind_offload_io_seconds_total",
      "traind_offload_background_io_seconds_total", "traind_tokenize_bytes_total"};
  for (const auto& name : per_job) {
    EXPECT_FALSE(std::isnan(FindMetric(second, name, label))) << name << " missing for " << job->id() << "\n" << text;
  }
  EXPECT_THAT(text, ::testing::HasSubstr("job_name=\"metered\""));
  // A plain job: world size 1 and no communication series (those carry a rank; hosts_submit_test).
  EXPECT_EQ(FindMetric(second, "traind_world_size", label), 1);
  EXPECT_TRUE(std::isnan(FindMetric(second, "traind_comm_bytes_total", label)));
  EXPECT_TRUE(std::isnan(FindMetric(second, "traind_comm_seconds_total", label)));
  EXPECT_TRUE(std::isnan(FindMetric(second, "traind_comm_hidden_seconds_total", label)));
  for (const char* kind : {"weights", "gradients", "optimizer", "activations", "temporary"}) {
    EXPECT_GT(FindMetric(second, "traind_device_memory_bytes", std::string("kind=\"") + kind + "\""), 0) << kind;
  }
  for (const char* name : {"traind_queue_length", "traind_device_memory_used_bytes",
                           "traind_device_memory_peak_bytes", "traind_device_memory_total_bytes"}) {
    EXPECT_FALSE(std::isnan(FindMetric(second, name))) << name;
  }
  EXPECT_EQ(FindMetric(second, "traind_jobs", "state=\"RUNNING\""), 1);
  EXPECT_EQ(FindMetric(second, "traind_jobs", "state=\"QUEUED\""), 1);
  EXPECT_EQ(FindMetric(second, "traind_queue_length"), 1);
  EXPECT_GT(FindMetric(second, "traind_device_memory_total_bytes"), 1e8);
  EXPECT_GT(FindMetric(second, "traind_device_memory_peak_bytes"), 0);
  EXPECT_GT(FindMetric(second, "traind_grpc_requests_total", "method=\"SubmitJob\""), 0);
  EXPECT_GT(FindMetric(second, "traind_grpc_requests_total", "method=\"GetJob\""), 0);
  // Values that move.
  for (const char* name : {"traind_train_steps_total", "traind_train_tokens_total", "traind_train_samples_total",
                           "traind_train_step_seconds_count", "traind_train_step_seconds_sum"}) {
    EXPECT_GT(FindMetric(second, name, label), FindMetric(first, name, label)) << name;
  }
  EXPECT_GE(FindMetric(second, "traind_train_steps_total", label), 15);
  EXPECT_EQ(FindMetric(second, "traind_train_tokens_total", label), 128 * FindMetric(second, "traind_train_steps_total", label));
  const double loss = FindMetric(second, "traind_train_loss", label);
  EXPECT_GT(loss, 0.5);
  EXPECT_LT(loss, 6);
  EXPECT_GT(FindMetric(second, "traind_train_tokens_per_second", label), 0);
  EXPECT_GT(FindMetric(second, "traind_train_learning_rate", label), 0);
  EXPECT_GT(FindMetric(second, "traind_train_grad_norm", label), 0);
  const double mfu = FindMetric(second, "traind_model_flops_utilization", label);
  EXPECT_GT(mfu, 0);
  EXPECT_LT(mfu, 1);

  // After the job ends its series are gone; the final numbers stay in status.
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitFor(*c, queued->id(), IsDone, 60));
  const std::string after = HttpGet(d.metrics_port(), "/metrics");
  EXPECT_THAT(after, ::testing::Not(::testing::HasSubstr(label)));
  EXPECT_EQ(FindMetric(ParseMetrics(after), "traind_jobs", "state=\"CANCELLED\""), 1);
  EXPECT_EQ(FindMetric(ParseMetrics(after), "traind_jobs", "state=\"SUCCEEDED\""), 1);
}

// A mixture-of-experts job (mixtral): traind_moe_expert_tokens_total{layer, expert} for every
// layer and expert, counting each step's tokens once per chosen expert, gone when the job ends.
TEST_F(MetricsTest, MoeExpertTokensPerLayerAndExpert) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  const std::string spec = dir_ + "/moe.yaml";
  std::ofstream(spec) << "name: moe\nmodel:\n  arch: mixtral\n  config: {vocab_size: 256, "
                         "hidden_size: 32, intermediate_size: 32, num_hidden_layers: 2, "
                         "num_attention_heads: 4, num_key_value_heads: 2, "
                         "max_position_embeddings: 64, num_local_experts: 4, "
                         "num_experts_per_tok: 2, output_router_logits: true}\n"
                         "data: {train_file: " << data_ << ", seq_len: 16}\n"
                         "training: {max_steps: 100000, per_device_train_batch_size: 4, "
                         "logging_steps: 2}\noutput_dir: " << dir_ << "/moe-out\n";
  auto job = c->SubmitFile(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 5; }, 60));
  const std::string label = "job_id=\"" + job->id() + "\"";
  const std::string text = HttpGet(d.metrics_port(), "/metrics");
  const auto m = ParseMetrics(text);
  double routed = 0;
  for (int layer = 0; layer < 2; ++layer) {
    for (int expert = 0; expert < 4; ++expert) {
      const std::string want = "layer=\"" + std::to_string(layer) + "\",expert=\"" +
                               std::to_string(expert) + "\"";
      double v = std::nan("");
      for (const auto& [series, value] : m) {
        if (series.rfind("traind_moe_expert_tokens_total{", 0) == 0 &&
            series.find(label) != std::string::npos &&
            series.find("layer=\"" + std::to_string(layer) + "\"") != std::string::npos &&
            series.find("expert=\"" + std::to_string(expert) + "\"") != std::string::npos) {
          v = value;
        }
      }
      ASSERT_FALSE(std::isnan(v)) << want << " missing\n" << text;
      routed += v;
    }
  }
  // Every step routes B*T = 64 tokens to 2 experts in each of 2 layers (a step may land between
  // the counters of one scrape: one step of slack).
  const double steps = FindMetric(m, "traind_train_steps_total", label);
  EXPECT_GE(steps, 5);
  EXPECT_NEAR(routed, 64 * 2 * 2 * steps, 64 * 2 * 2);
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 60));
  EXPECT_THAT(HttpGet(d.metrics_port(), "/metrics"),
              ::testing::Not(::testing::HasSubstr("traind_moe_expert_tokens_total{")));
}

// A job with training.offload: nvme through the daemon: the traind_offload_* series of METRICS.md
// move with its steps (bytes read and written per step = its optimizer state, the store's bytes on
// disk), and `trainctl status` (text and -o json) shows the offload plan and its I/O so far.
TEST_F(MetricsTest, OffloadSeriesMoveAndStatusShowsThem) {
  const std::string path = dir_ + "/offload.yaml";
  WriteAll(path, "name: offloaded\nmodel:\n  arch: gpt2\n  config: {vocab_size: 256, n_positions: 32, "
                 "n_embd: 32, n_layer: 2, n_head: 2}\ndata:\n  train_file: " + data_ +
                 "\n  seq_len: 32\ntraining:\n  max_steps: 100000\n  per_device_train_batch_size: 4\n"
                 "  logging_steps: 5\n  offload: nvme\n  offload_dir: " + dir_ + "/offload-store\n"
                 "output_dir: " + dir_ + "/runs/offloaded\n");
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto job = c->SubmitFile(path);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 3; }, 90));
  const std::string label = "job_id=\"" + job->id() + "\"";
  const auto first = ParseMetrics(HttpGet(d.metrics_port(), "/metrics"));
  // The series move in the daemon's batches of step events (a tiny job runs steps in
  // milliseconds): scrape again until the step counter itself has moved on.
  const double first_seen = FindMetric(first, "traind_train_steps_total", label);
  const double first_steps = std::isnan(first_seen) ? 0 : first_seen;
  std::string text;
  std::map<std::string, double> second;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);;) {
    text = HttpGet(d.metrics_port(), "/metrics");
    second = ParseMetrics(text);
    if (FindMetric(second, "traind_train_steps_total", label) >= first_steps + 5) break;
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the step counter did not move\n" << text;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const char* name : {"traind_offload_read_bytes_total", "traind_offload_written_bytes_total"}) {
    EXPECT_GT(FindMetric(second, name, label), FindMetric(first, name, label)) << name << "\n" << text;
  }
  EXPECT_GE(FindMetric(second, "traind_offload_io_seconds_total", label), 0);
  // The store's threads wrote every step behind the optimizer (write-behind, the commit).
  EXPECT_GT(FindMetric(second, "traind_offload_background_io_seconds_total", label),
            FindMetric(first, "traind_offload_background_io_seconds_total", label)) << text;
  EXPECT_GT(FindMetric(second, "traind_offload_store_bytes", label), 0) << text;
  // Each step writes the whole optimizer state (AdamW: 8 bytes per trainable parameter).
  const double steps = FindMetric(second, "traind_train_steps_total", label);
  const double written = FindMetric(second, "traind_offload_written_bytes_total", label);
  auto status = Trainctl({"--addr", d.addr(), "--token", d.token(), "-o", "json", "status", job->id()});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const auto j = nlohmann::json::parse(status.out);
  EXPECT_EQ(j["plan"]["offload"], "nvme");
  const double state = j["plan"]["offload_state_bytes"].get<double>();
  EXPECT_GT(state, 8.0 * 10000);
  EXPECT_LT(state * steps * 0.99, written * 1.3) << "written per step ~ the state";
  EXPECT_GT(state * steps * 1.01, written * 0.7);
  EXPECT_LT(j["plan"]["bytes"]["optimizer"].get<double>(), state) << "only a window on the device";
  EXPECT_GT(j["offload"]["written_bytes"].get<double>(), 0);
  EXPECT_GT(j["offload"]["background_io_seconds"].get<double>(), 0);
  auto text_status = Trainctl({"--addr", d.addr(), "--token", d.token(), "status", job->id()});
  EXPECT_THAT(text_status.out, ::testing::HasSubstr("offload:"));
  EXPECT_THAT(text_status.out, ::testing::HasSubstr("offload_io:"));
  EXPECT_THAT(text_status.out, ::testing::HasSubstr("behind compute"));
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 60));
}

// traind_tokenize_bytes_total counts the source bytes a job tokenized: a GPT-2 BPE job whose text
// misses the token cache counts the file's size; a second job on the same file hits the cache
// (under <state-dir>/token-cache) and counts 0. Both jobs' tokenization shows in `trainctl logs`
// and `trainctl status` (text and -o json).
TEST_F(MetricsTest, TokenizeBytesCountCacheMissesOnly) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!std::filesystem::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");  // the daemon's default: under its state dir
  std::filesystem::create_directories(dir_ + "/bpe");
  const std::string corpus = WriteTextData(dir_ + "/bpe", 200000);
  const auto corpus_bytes = static_cast<double>(std::filesystem::file_size(corpus));
  auto spec = [&](const std::string& name) {
    const std::string path = dir_ + "/" + name + ".yaml";
    WriteAll(path, "name: " + name + "\nmodel:\n  arch: gpt2\n  config: {vocab_size: 50257, n_positions: 16, "
                   "n_embd: 16, n_layer: 1, n_head: 2}\ndata:\n  train_file: " + corpus + "\n  tokenizer: " + gpt2 +
                   "\n  seq_len: 16\n  validation_split: 0.05\ntraining: {max_steps: 100000, "
                   "per_device_train_batch_size: 2, logging_steps: 10, save_steps: 0}\noutput_dir: " + dir_ +
                   "/runs/" + name + "\n");
    return path;
  };
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  const std::vector<std::string> ctl = {"--addr", d.addr(), "--token", d.token()};
  auto trainctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), ctl.begin(), ctl.end());
    return Trainctl(args);
  };
  double counted[2] = {0, 0};
  std::string logs[2];
  for (int run = 0; run < 2; ++run) {
    auto job = c->SubmitFile(spec(run == 0 ? "tokenize-miss" : "tokenize-hit"));
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    // Tokenization ends before the first step, so a step means its count is final.
    v1::Job last;
    ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 2 || IsDone(j); }, 120, &last));
    ASSERT_EQ(last.state(), v1::JOB_STATE_RUNNING) << last.error();
    const std::string label = "job_id=\"" + job->id() + "\"";
    const std::string text = HttpGet(d.metrics_port(), "/metrics");
    counted[run] = FindMetric(ParseMetrics(text), "traind_tokenize_bytes_total", label);
    ASSERT_FALSE(std::isnan(counted[run])) << "traind_tokenize_bytes_total missing\n" << text;
    // status: the last tokenization event, and the job no longer tokenizing.
    CmdResult st = trainctl({"-o", "json", "status", job->id()});
    ASSERT_EQ(st.exit_code, 0) << st.err;
    const auto j = nlohmann::json::parse(st.out);
    ASSERT_TRUE(j["tokenize"].is_object()) << st.out;
    EXPECT_EQ(j["tokenize"]["file"], corpus);
    EXPECT_EQ(j["tokenize"]["bytes_total"].get<double>(), corpus_bytes);
    EXPECT_EQ(j["tokenize"]["done"], true);
    EXPECT_EQ(j["tokenize"]["cache_hit"], run == 1);
    EXPECT_GT(j["tokenize"]["tokens"].get<int64_t>(), 0);
    EXPECT_EQ(j["tokenizing"], false);
    CmdResult st_text = trainctl({"status", job->id()});
    EXPECT_THAT(st_text.out, ::testing::ContainsRegex("phase: +training"));
    EXPECT_THAT(st_text.out, ::testing::HasSubstr(run == 0 ? "tokenized " + corpus : "tokens of " + corpus));
    ASSERT_TRUE(c->Cancel(job->id()).ok());
    ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 60));
    CmdResult lg = trainctl({"logs", job->id()});
    ASSERT_EQ(lg.exit_code, 0) << lg.err;
    logs[run] = lg.out;
  }
  EXPECT_EQ(counted[0], corpus_bytes) << "a cache miss counts the whole file";
  EXPECT_EQ(counted[1], 0) << "a cache hit tokenizes nothing";
  // The miss: a first progress line at 0%, then the final line; the hit: one cache line.
  EXPECT_THAT(logs[0], ::testing::HasSubstr("tokenizing " + corpus + ": 0% (0 B of "));
  EXPECT_THAT(logs[0], ::testing::ContainsRegex("tokenized " + corpus + ": [0-9.]+ KiB -> [0-9]+ tokens in"));
  EXPECT_THAT(logs[0], ::testing::Not(::testing::HasSubstr("from the cache")));
  EXPECT_THAT(logs[1], ::testing::HasSubstr("tokens of " + corpus + " from the cache ("));
  EXPECT_THAT(logs[1], ::testing::Not(::testing::HasSubstr("tokenizing ")));
  // The cache lives under the daemon's state dir.
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/state/token-cache"));
  EXPECT_FALSE(std::filesystem::is_empty(dir_ + "/state/token-cache"));
}

// While a job tokenizes a large file (16 MiB of random letter words, which BPE encodes at ~5 MB/s
// here: ~3 s), `trainctl status` says so (text: phase
// tokenizing; -o json: "tokenizing": true, bytes_done < bytes_total) and, once a progress event
// past the first has come (they come about once a second), traind_tokenize_bytes_total holds the
// partial count; `trainctl logs` then has the 0% line, at least one line in between, and the last.
TEST_F(MetricsTest, TokenizingShowsInStatusLogsAndMetricsWhileItRuns) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!std::filesystem::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
  const std::string corpus = dir_ + "/big.txt";
  {
    std::mt19937 rng(7);
    std::string text;
    text.reserve((size_t{16} << 20) + 16);
    while (text.size() < (size_t{16} << 20)) {
      for (uint32_t i = 0, n = 3 + rng() % 7; i < n; ++i) text += static_cast<char>('a' + rng() % 26);
      text += (rng() % 9 == 0) ? ".\n" : " ";
    }
    WriteAll(corpus, text);
  }
  const auto total = static_cast<double>(std::filesystem::file_size(corpus));
  const std::string spec = dir_ + "/big.yaml";
  WriteAll(spec, "name: big\nmodel:\n  arch: gpt2\n  config: {vocab_size: 50257, n_positions: 16, n_embd: 16, "
                 "n_layer: 1, n_head: 2}\ndata:\n  train_file: " + corpus + "\n  tokenizer: " + gpt2 +
                 "\n  seq_len: 16\n  validation_split: 0.01\ntraining: {max_steps: 100000, "
                 "per_device_train_batch_size: 2, logging_steps: 10, save_steps: 0}\noutput_dir: " + dir_ +
                 "/runs/big\n");
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  const std::vector<std::string> ctl = {"--addr", d.addr(), "--token", d.token()};
  auto trainctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), ctl.begin(), ctl.end());
    return Trainctl(args);
  };
  auto job = c->SubmitFile(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const std::string label = "job_id=\"" + job->id() + "\"";
  bool json_tokenizing = false, text_tokenizing = false;
  double partial_metric = 0;
  v1::Job last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (std::chrono::steady_clock::now() < deadline) {
    auto j = c->Get(job->id());
    ASSERT_TRUE(j.ok());
    last = *j;
    if (IsDone(last) || (last.has_tokenize() && last.tokenize().done())) break;
    if (!last.has_tokenize()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!json_tokenizing) {
      CmdResult st = trainctl({"-o", "json", "status", job->id()});
      const auto js = nlohmann::json::parse(st.out);
      if (js["tokenizing"] == true) {
        json_tokenizing = true;
        EXPECT_EQ(js["tokenize"]["done"], false);
        EXPECT_LT(js["tokenize"]["bytes_done"].get<double>(), total);
        EXPECT_EQ(js["tokenize"]["bytes_total"].get<double>(), total);
      }
    } else if (!text_tokenizing) {
      CmdResult st = trainctl({"status", job->id()});
      if (std::regex_search(st.out, std::regex("phase: +tokenizing"))) {
        text_tokenizing = true;
        EXPECT_THAT(st.out, ::testing::ContainsRegex("tokenizing " + corpus + ": [0-9]+% \\("));
      }
    }
    const double v = FindMetric(ParseMetrics(HttpGet(d.metrics_port(), "/metrics")), "traind_tokenize_bytes_total", label);
    if (v > 0 && v < total) partial_metric = v;
  }
  ASSERT_TRUE(last.has_tokenize() && last.tokenize().done()) << "tokenization did not finish: " << last.error();
  EXPECT_TRUE(json_tokenizing) << "status -o json never showed \"tokenizing\": true";
  EXPECT_TRUE(text_tokenizing) << "status never showed phase: tokenizing";
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 1 || IsDone(j); }, 120, &last));
  EXPECT_EQ(FindMetric(ParseMetrics(HttpGet(d.metrics_port(), "/metrics")), "traind_tokenize_bytes_total", label), total);
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 60, &last));
  const double seconds = last.tokenize().seconds();
  CmdResult lg = trainctl({"logs", job->id()});
  ASSERT_EQ(lg.exit_code, 0) << lg.err;
  EXPECT_THAT(lg.out, ::testing::HasSubstr("tokenizing " + corpus + ": 0% (0 B of 16.0 MiB)"));
  EXPECT_THAT(lg.out, ::testing::HasSubstr("tokenized " + corpus + ": 16.0 MiB -> "));
  if (seconds < 1.5) {
    GTEST_SKIP() << "tokenizing took " << seconds << " s: too fast for a progress event in between";
  }
  EXPECT_THAT(lg.out, ::testing::ContainsRegex("tokenizing " + corpus + ": [1-9][0-9]?% \\([0-9.]+ MiB of 16.0 MiB, "
                                               "[0-9.]+ MiB/s\\)"));
  EXPECT_GT(partial_metric, 0) << "no scrape saw a partial traind_tokenize_bytes_total";
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST_F(MetricsTest, RealPrometheusScrapesTraind) {
  const std::string prom = "/usr/bin/prometheus";
  if (!std::filesystem::exists(prom)) GTEST_SKIP() << "SKIPPED: " << prom << " is not installed (Debian package prometheus)";
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  const int port = FreePort();
  WriteAll(dir_ + "/prometheus.yml", "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                                     "scrape_configs:\n  - job_name: traind\n    static_configs:\n"
                                     "      - targets: ['127.0.0.1:" + std::to_string(d.metrics_port()) + "']\n");
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string log = dir_ + "/prometheus.log";
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    const std::string cfg = "--config.file=" + dir_ + "/prometheus.yml";
    const std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(port);
    const std::string data = "--storage.tsdb.path=" + dir_ + "/prom-data";
    ::execl(prom.c_str(), prom.c_str(), cfg.c_str(), listen.c_str(), data.c_str(), nullptr);
    _exit(127);
  }
  // Targets show up ~5 s after start (BUILD-NOTES section 7); allow 40 s.
  std::string value;
  for (int i = 0; i < 80 && value.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::string body = HttpGet(port, "/api/v1/query?query=traind_device_memory_total_bytes");
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || j["data"]["result"].empty()) continue;
    value = j["data"]["result"][0]["value"][1].get<std::string>();
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_FALSE(value.empty()) << "Prometheus never returned traind_device_memory_total_bytes; its log:\n"
                              << ReadAll(dir_ + "/prometheus.log");
  EXPECT_GT(std::stod(value), 1e8);
}

}  // namespace
}  // namespace traind::testing
