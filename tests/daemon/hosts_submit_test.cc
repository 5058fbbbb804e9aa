// trainctl submit JOB.yaml --hosts A,B: one data-parallel run, one rank per traind daemon (cpu,
// Gloo on loopback; docs/distributed.md). Rank 0's final weights equal one `traind run` with the
// same global batch (accumulation doubled); a host that refuses cancels the ranks already submitted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

using Tensors = std::map<std::string, std::vector<float>>;

// The fp32 tensors of a safetensors file.
Tensors LoadSafetensors(const std::string& path) {
  Tensors out;
  const std::string b = ReadAll(path);
  if (b.size() < 8) return out;
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  auto h = nlohmann::json::parse(b.substr(8, n));
  const char* data = b.data() + 8 + n;
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__" || v["dtype"] != "F32") continue;
    const size_t s = v["data_offsets"][0], e = v["data_offsets"][1];
    std::vector<float> t((e - s) / 4);
    std::memcpy(t.data(), data + s, e - s);
    out[k] = std::move(t);
  }
  return out;
}

// Relative L2 distance of model `a`'s fp32 tensors from model `b`'s (all tensors as one vector);
// infinity when the files do not hold the same tensors.
double ModelRelL2(const std::string& a, const std::string& b) {
  Tensors ta = LoadSafetensors(a);
  Tensors tb = LoadSafetensors(b);
  if (ta.empty() || ta.size() != tb.size()) return INFINITY;
  double num = 0, den = 0;
  for (const auto& [k, v] : tb) {
    if (ta[k].size() != v.size()) return INFINITY;
    for (size_t i = 0; i < v.size(); ++i) {
      num += (double(ta[k][i]) - v[i]) * (double(ta[k][i]) - v[i]);
      den += double(v[i]) * v[i];
    }
  }
  return std::sqrt(num / den);
}

class HostsSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("hosts_submit");
    data_ = WriteTextData(dir_);
    a_ = std::make_unique<Daemon>(dir_ + "/state-a");
    ASSERT_TRUE(a_->Start({"--device", "cpu", "--threads", "1"}));
    token_ = a_->token();
    while (!token_.empty() && (token_.back() == '\n' || token_.back() == ' ')) token_.pop_back();
    // Daemon B serves the same token (the one trainctl sends to every host).
    std::filesystem::create_directories(dir_ + "/state-b");
    WriteAll(dir_ + "/state-b/token", token_ + "\n");
    ::chmod((dir_ + "/state-b/token").c_str(), 0600);
    b_ = std::make_unique<Daemon>(dir_ + "/state-b");
    ASSERT_TRUE(b_->Start({"--device", "cpu", "--threads", "1"}));
  }

  SpecOptions Spec() const {
    SpecOptions o;
    o.train_file = data_;
    o.max_steps = 10;
    o.batch = 2;
    o.logging_steps = 1;
    o.seed = 7;
    return o;
  }

  std::string dir_, data_, token_;
  std::unique_ptr<Daemon> a_, b_;
};

TEST_F(HostsSubmitTest, TwoDaemonsTrainOneRunLikeOneProcessWithTheGlobalBatch) {
  const std::string spec = WriteJobSpec(dir_, "dp", Spec());
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = Trainctl({"--token", token_, "submit", spec, "--hosts", a_->addr() + "," + b_->addr(), "--wait"});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::printf("submit --hosts --wait: %.2f s\n", secs);
  // One "host job-id" line per rank, in rank order.
  std::istringstream lines(r.out);
  std::string host0, id0, host1, id1;
  lines >> host0 >> id0 >> host1 >> id1;
  EXPECT_EQ(host0, a_->addr());
  EXPECT_EQ(host1, b_->addr());
  auto ca = a_->Connect();
  auto cb = b_->Connect();
  auto j0 = ca->Get(id0);
  auto j1 = cb->Get(id1);
  ASSERT_TRUE(j0.ok() && j1.ok());
  EXPECT_EQ(j0->state(), v1::JOB_STATE_SUCCEEDED) << j0->error();
  EXPECT_EQ(j1->state(), v1::JOB_STATE_SUCCEEDED) << j1->error();
  EXPECT_EQ(j0->rank(), 0);
  EXPECT_EQ(j1->rank(), 1);
  EXPECT_EQ(j1->world_size(), 2);
  EXPECT_FALSE(j0->run_id().empty());
  EXPECT_EQ(j0->run_id(), j1->run_id());
  CmdResult st = Trainctl({"--token", token_, "--addr", b_->addr(), "status", id1});
  EXPECT_THAT(st.out, ::testing::HasSubstr("rank 1 of 2"));
  CmdResult sj = Trainctl({"--token", token_, "--addr", b_->addr(), "-o", "json", "status", id1});
  auto js = nlohmann::json::parse(sj.out, nullptr, false);
  ASSERT_FALSE(js.is_discarded()) << sj.out;
  EXPECT_EQ(js["distributed"]["world_size"], 2);
  EXPECT_EQ(js["distributed"]["rank"], 1);

  // The same run in one process: global batch 2 ranks x 2 = micro-batch 2 x accumulation 2.
  SpecOptions one = Spec();
  one.training_extra = "  gradient_accumulation_steps: 2\n";
  const std::string ref = WriteJobSpec(dir_, "one", one);
  CmdResult rr = RunCommand({TRAIND_BIN, "run", ref, "--device", "cpu", "--threads", "1"});
  ASSERT_EQ(rr.exit_code, 0) << rr.out << rr.err;
  const double rel = ModelRelL2(dir_ + "/runs/dp/model.safetensors", dir_ + "/runs/one/model.safetensors");
  std::printf("rank 0's weights vs one process x accumulation 2: model rel L2 %.3g\n", rel);
  EXPECT_LT(rel, 1e-6);
}

// Each rank's daemon serves traind_comm_seconds_total / traind_comm_bytes_total {job, rank} and
// traind_world_size while the run trains; status shows the totals. Bytes: every step all-reduces
// the fp32 gradient buffer (2 (W-1)/W x 4 x trainable = 4 x trainable bytes at W = 2), plus small
// collectives (the loss, start-up checks, evaluation sums).
TEST_F(HostsSubmitTest, EachRanksDaemonServesItsCommunication) {
  SpecOptions o = Spec();
  o.max_steps = 300;
  o.logging_steps = 50;
  const std::string spec = WriteJobSpec(dir_, "comm", o);
  CmdResult r = Trainctl({"--token", token_, "submit", spec, "--hosts", a_->addr() + "," + b_->addr()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::istringstream lines(r.out);
  std::string host0, id0, host1, id1;
  lines >> host0 >> id0 >> host1 >> id1;
  // While it trains: both daemons' series, with the rank label, growing.
  const Daemon* daemons[2] = {a_.get(), b_.get()};
  double seen[2] = {0, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((seen[0] <= 0 || seen[1] <= 0) && std::chrono::steady_clock::now() < deadline) {
    for (int rank = 0; rank < 2; ++rank) {
      const auto m = ParseMetrics(HttpGet(daemons[rank]->metrics_port(), "/metrics"));
      const std::string label = "rank=\"" + std::to_string(rank) + "\"";
      const double bytes = FindMetric(m, "traind_comm_bytes_total", label);
      if (!(bytes > 0)) continue;
      EXPECT_GE(FindMetric(m, "traind_comm_seconds_total", label), 0.0);
      EXPECT_GE(FindMetric(m, "traind_comm_hidden_seconds_total", label), 0.0);
      EXPECT_EQ(FindMetric(m, "traind_world_size", "job_name=\"comm\""), 2.0);
      seen[rank] = bytes;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(seen[0], 0) << "rank 0's daemon never served traind_comm_bytes_total";
  EXPECT_GT(seen[1], 0) << "rank 1's daemon never served traind_comm_bytes_total";
  auto ca = a_->Connect();
  auto cb = b_->Connect();
  v1::Job last0, last1;
  ASSERT_TRUE(WaitFor(*ca, id0, IsDone, 300, &last0));
  ASSERT_TRUE(WaitFor(*cb, id1, IsDone, 300, &last1));
  ASSERT_EQ(last1.state(), v1::JOB_STATE_SUCCEEDED) << last1.error();
  CmdResult sj = Trainctl({"--token", token_, "--addr", b_->addr(), "-o", "json", "status", id1});
  auto js = nlohmann::json::parse(sj.out, nullptr, false);
  ASSERT_FALSE(js.is_discarded()) << sj.out;
  const double trainable = js["trainable_params"].get<double>();
  const double bytes = js["distributed"]["comm_bytes"].get<double>();
  const double grads = 300 * 4 * trainable;
  std::printf("rank 1: %.0f bytes sent in %.3f s of collectives; gradient all-reduces %.0f bytes\n", bytes,
              js["distributed"]["comm_seconds"].get<double>(), grads);
  EXPECT_GE(bytes, grads);
  EXPECT_LT(bytes, grads + (1 << 20));
  EXPECT_GT(js["distributed"]["comm_seconds"].get<double>(), 0.0);
  CmdResult st = Trainctl({"--token", token_, "--addr", b_->addr(), "status", id1});
  EXPECT_THAT(st.out, ::testing::ContainsRegex("communication: +[0-9.]+ s in collectives"));
}

// kill -9 of rank 1's job runner mid-run: rank 0's collective fails at once (UNAVAILABLE), both
// daemons start attempt 2 of their rank, the ranks meet under attempt 2's rendezvous keys and resume
// from the last checkpoint; the run ends where the same run uninterrupted ends.
TEST_F(HostsSubmitTest, ARankKilledMidRunRestartsEveryRankFromTheCheckpoint) {
  SpecOptions o = Spec();
  o.max_steps = 400;
  o.save_steps = 50;
  o.logging_steps = 50;
  const std::string spec = WriteJobSpec(dir_, "killed", o);
  CmdResult r = Trainctl({"--token", token_, "submit", spec, "--hosts", a_->addr() + "," + b_->addr()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::istringstream lines(r.out);
  std::string host0, id0, host1, id1;
  lines >> host0 >> id0 >> host1 >> id1;
  auto ca = a_->Connect();
  auto cb = b_->Connect();
  v1::Job before;
  ASSERT_TRUE(WaitFor(*cb, id1, [](const v1::Job& j) { return j.step() >= 60 || IsDone(j); }, 120, &before));
  ASSERT_FALSE(IsDone(before)) << "the run ended before it could be killed";
  const pid_t runner = b_->RunnerPid();
  ASSERT_GT(runner, 0);
  ASSERT_EQ(::kill(runner, SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  v1::Job last0, last1;
  ASSERT_TRUE(WaitFor(*ca, id0, IsDone, 300, &last0));
  ASSERT_TRUE(WaitFor(*cb, id1, IsDone, 300, &last1));
  std::printf("killed rank 1 at step %lld; both ranks done %.2f s later\n", static_cast<long long>(before.step()),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  EXPECT_EQ(last0.state(), v1::JOB_STATE_SUCCEEDED) << last0.error();
  EXPECT_EQ(last1.state(), v1::JOB_STATE_SUCCEEDED) << last1.error();
  EXPECT_EQ(last0.attempts(), 2);
  EXPECT_EQ(last1.attempts(), 2);
  EXPECT_EQ(last0.step(), 400);
  // Rank 0's first attempt ended on its collective, and said so.
  CmdResult lg = Trainctl({"--token", token_, "--addr", a_->addr(), "logs", id0});
  EXPECT_THAT(lg.out, ::testing::ContainsRegex("attempt 1 failed: UNAVAILABLE"));

  // The same run, not interrupted.
  const std::string whole = WriteJobSpec(dir_, "whole", o);
  CmdResult w = Trainctl({"--token", token_, "submit", whole, "--hosts", a_->addr() + "," + b_->addr(), "--wait"});
  ASSERT_EQ(w.exit_code, 0) << w.out << w.err;
  const double rel = ModelRelL2(dir_ + "/runs/killed/model.safetensors", dir_ + "/runs/whole/model.safetensors");
  std::printf("killed and restarted vs uninterrupted, 400 steps: model rel L2 %.3g\n", rel);
  // Resume is exact (fp32 weights and optimizer state in the checkpoint, the loader position, a
  // fixed all-reduce order, one thread per rank): the same bits.
  EXPECT_EQ(rel, 0.0);
}

TEST_F(HostsSubmitTest, AHostThatRefusesCancelsTheRanksAlreadySubmitted) {
  const std::string spec = WriteJobSpec(dir_, "refused", Spec());
  // Port 1 on loopback: nothing listens there.
  CmdResult r = Trainctl({"--token", token_, "--timeout", "5", "submit", spec, "--hosts",
                          a_->addr() + ",127.0.0.1:1", "--wait"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, ::testing::StartsWith("trainctl: rank 1 of 2 (127.0.0.1:1): cannot reach traind"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("; cancelled rank 0 (job-000001 at " + a_->addr() + ")"));
  auto ca = a_->Connect();
  v1::Job last;
  EXPECT_TRUE(WaitFor(*ca, "job-000001", IsDone, 30, &last));
  EXPECT_EQ(last.state(), v1::JOB_STATE_CANCELLED) << last.error();
  // --addr does not combine with --hosts.
  CmdResult u = Trainctl({"--token", token_, "--addr", a_->addr(), "submit", spec, "--hosts", a_->addr() + "," + b_->addr()});
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_THAT(u.err, ::testing::HasSubstr("--addr and --hosts do not combine"));
}

}  // namespace
}  // namespace traind::testing
