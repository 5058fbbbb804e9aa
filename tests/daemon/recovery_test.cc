// Crash recovery: kill -9 of traind mid-job (the job resumes from its checkpoint after a restart and
// ends bit-identical to an uninterrupted run; queued jobs are not lost), kill -9 of the job-runner
// child (traind stays healthy, the attempt restarts from the checkpoint; bounded attempts, then
// FAILED with the reason, and the next job runs).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-recovery");
    data_ = WriteTextData(dir_);
  }
  std::string Spec(const std::string& name, int64_t steps) {
    SpecOptions o;
    o.train_file = data_;
    o.max_steps = steps;
    o.save_steps = 10;
    o.n_embd = 64;
    o.seq_len = 64;
    o.batch = 8;
    return WriteJobSpec(dir_, name, o);
  }
  // An in-memory reference job, then the same job with offload: nvme whose job runner is killed
  // twice mid-step: it ends bit-identical to the reference.
  void KillRunnerDuringOffloadWrites(const std::string& training);
  // The final numbers a run leaves in its output dir: weights, and trainer_state's last losses.
  struct Final {
    std::string weights;
    double last_loss = 0;
    int64_t global_step = 0;
  };
  Final ReadFinal(const std::string& name) {
    Final f;
    const std::string out = dir_ + "/runs/" + name;
    f.weights = ReadAll(out + "/model.safetensors");
    auto st = nlohmann::json::parse(ReadAll(out + "/trainer_state.json"), nullptr, false);
    if (st.is_discarded()) return f;
    f.global_step = st.value("global_step", 0);
    for (const auto& e : st["log_history"]) {
      if (e.contains("loss")) f.last_loss = e["loss"].get<double>();
    }
    return f;
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string dir_, data_;
};

TEST_F(RecoveryTest, KillDaemonMidJobResumesToIdenticalResultAndLosesNothing) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  // The reference: the same job, uninterrupted.
  auto ref = c->SubmitFile(Spec("ref", 60));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  v1::Job ref_done;
  ASSERT_TRUE(WaitFor(*c, ref->id(), IsDone, 180, &ref_done));
  ASSERT_EQ(ref_done.state(), v1::JOB_STATE_SUCCEEDED) << ref_done.error();

  auto crash = c->SubmitFile(Spec("crash", 60));
  ASSERT_TRUE(crash.ok());
  std::vector<std::string> queued;
  for (int i = 0; i < 3; ++i) {
    auto q = c->SubmitFile(Spec("queued" + std::to_string(i), 2));
    ASSERT_TRUE(q.ok());
    queued.push_back(q->id());
  }
  // A follower (what `trainctl logs -f` does) rides through the restart.
  std::vector<v1::JobEvent> seen;
  Status watch_status;
  client::ClientOptions wo;
  wo.addr = d.addr();
  wo.token = d.token();
  auto watcher_client = client::Client::Create(wo).value();
  std::thread watcher([&] {
    watch_status = watcher_client->Watch(crash->id(), 1, true, [&](const v1::JobEvent& ev) {
      seen.push_back(ev);
      return true;
    }, 60);
  });
  // Kill traind once the job is past its first checkpoint (step 10) and short of the end.
  ASSERT_TRUE(WaitFor(*c, crash->id(), [](const v1::Job& j) { return j.step() >= 15; }, 120));
  d.Kill9();
  ASSERT_TRUE(d.Start({"--listen", d.addr()}));
  {
    // A connection of its own: the process's shared one to this address may still be in
    // reconnect backoff from the killed daemon.
    client::ClientOptions o;
    o.addr = d.addr();
    o.token = d.token();
    o.own_connection = true;
    c = client::Client::Create(o).value();
  }
  auto after = c->Get(crash->id());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_LT(after->step(), 60) << "the kill landed after the end; make the job longer";
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, crash->id(), IsDone, 180, &done));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.ToString();
  ASSERT_FALSE(seen.empty());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i].sequence(), static_cast<int64_t>(i + 1));
  EXPECT_EQ(seen.back().state().state(), v1::JOB_STATE_SUCCEEDED);

  // It says it resumed.
  bool said_resumed = false;
  ASSERT_TRUE(c->Watch(crash->id(), 1, false, [&](const v1::JobEvent& ev) {
    if (ev.has_message() && ev.message().find("resumes from its last checkpoint") != std::string::npos)
      said_resumed = true;
    return true;
  }).ok());
  EXPECT_TRUE(said_resumed);

  const Final a = ReadFinal("ref"), b = ReadFinal("crash");
  ASSERT_FALSE(a.weights.empty());
  EXPECT_EQ(b.global_step, 60);
  EXPECT_TRUE(a.weights == b.weights) << "final weights differ from the uninterrupted run";
  EXPECT_DOUBLE_EQ(a.last_loss, b.last_loss);
  EXPECT_DOUBLE_EQ(ref_done.summary().eval_loss(), done.summary().eval_loss());

  // Nothing submitted is lost: all three queued jobs come back and run.
  for (const auto& id : queued) {
    v1::Job j;
    ASSERT_TRUE(WaitFor(*c, id, IsDone, 120, &j)) << id;
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << id << ": " << j.error();
  }
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 5u);
}

TEST_F(RecoveryTest, KillRunnerChildRestartsFromCheckpoint) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto ref = c->SubmitFile(Spec("ref", 40));
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE(WaitFor(*c, ref->id(), IsDone, 180));
  auto job = c->SubmitFile(Spec("crash", 40));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 15; }, 120));
  const pid_t runner = d.RunnerPid();
  ASSERT_GT(runner, 0);
  ASSERT_EQ(::kill(runner, SIGKILL), 0);
  EXPECT_TRUE(c->Health().ok()) << "traind stays up";
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 180, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.attempts(), 2);
  std::string crash_note;
  ASSERT_TRUE(c->Watch(job->id(), 1, false, [&](const v1::JobEvent& ev) {
    if (ev.has_message() && ev.message().find("attempt 1 failed") != std::string::npos) crash_note = ev.message();
    return true;
  }).ok());
  EXPECT_THAT(crash_note, ::testing::HasSubstr("signal 9"));
  EXPECT_TRUE(ReadFinal("ref").weights == ReadFinal("crash").weights);
}

// training.offload nvme: the job runner killed with SIGKILL at seeded random moments (mid-step,
// with optimizer-state writes and RocksDB commits in flight), twice (traind gives a job three
// attempts); each restart reopens the
// store in offload_dir and resumes from the newest checkpoint. The job ends with weights
// bit-identical to the same run without offload and without kills.
// `training` lines go into both jobs' training section.
void RecoveryTest::KillRunnerDuringOffloadWrites(const std::string& training) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto with = [&](const std::string& path, const std::string& lines) {
    std::string yaml = ReadAll(path);
    const size_t at = yaml.find("training:\n");
    ASSERT_NE(at, std::string::npos) << yaml;
    yaml.insert(at + 10, lines);
    WriteAll(path, yaml);
  };
  const std::string ref_path = Spec("ref-mem", 40);
  with(ref_path, training);
  auto ref = c->SubmitFile(ref_path);
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE(WaitFor(*c, ref->id(), IsDone, 180));
  const std::string path = Spec("crash-offload", 40);
  with(path, training + "  offload: nvme\n  offload_dir: " + dir_ + "/offload-store\n");
  auto job = c->SubmitFile(path);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  std::mt19937 rng(20261123);
  int kills = 0;
  for (int k = 0; k < 2; ++k) {
    const int64_t at_step = 8 + 14 * k + static_cast<int64_t>(rng() % 8);
    v1::Job seen;
    ASSERT_TRUE(WaitFor(*c, job->id(), [&](const v1::Job& j) { return j.step() >= at_step || IsDone(j); },
                        180, &seen));
    if (IsDone(seen)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));  // somewhere inside a step
    const pid_t runner = d.RunnerPid();
    if (runner <= 0) continue;
    if (::kill(runner, SIGKILL) == 0) ++kills;
    // Wait for the next attempt to be running before the next kill.
    ASSERT_TRUE(WaitFor(*c, job->id(), [&](const v1::Job& j) { return j.attempts() >= kills + 1 || IsDone(j); },
                        120));
  }
  EXPECT_EQ(kills, 2) << "the kills landed after the end; make the job longer";
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 300, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.attempts(), kills + 1);
  EXPECT_TRUE(ReadFinal("ref-mem").weights == ReadFinal("crash-offload").weights)
      << "offloaded, killed and resumed run differs from the uninterrupted in-memory run";
  EXPECT_EQ(ReadFinal("crash-offload").global_step, 40);
}

TEST_F(RecoveryTest, KillRunnerDuringOffloadWritesResumesBitIdentical) { KillRunnerDuringOffloadWrites(""); }

// The same with max_grad_norm 0: the offloaded update runs during backward (its writes land while
// backward computes, its commit after the step as before).
TEST_F(RecoveryTest, KillRunnerDuringOffloadUpdateInBackwardResumesBitIdentical) {
  KillRunnerDuringOffloadWrites("  max_grad_norm: 0\n");
}

TEST_F(RecoveryTest, RunnerKilledEveryAttemptFailsWithReasonAndNextJobRuns) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start({"--max-attempts", "2"}));
  auto c = d.Connect();
  auto doomed = c->SubmitFile(Spec("doomed", 100000));
  auto next = c->SubmitFile(Spec("next", 3));
  ASSERT_TRUE(doomed.ok() && next.ok());
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(WaitFor(*c, doomed->id(), [&](const v1::Job& j) {
      return j.attempts() == attempt && j.state() == v1::JOB_STATE_RUNNING;
    }, 60));
    pid_t runner = 0;
    for (int i = 0; i < 500 && runner == 0; ++i) {
      runner = d.RunnerPid();
      if (runner == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GT(runner, 0);
    ::kill(runner, SIGKILL);
    // Wait for the child to be reaped before looking for the next one.
    for (int i = 0; i < 500 && d.RunnerPid() == runner; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  v1::Job failed;
  ASSERT_TRUE(WaitFor(*c, doomed->id(), IsDone, 60, &failed));
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), ::testing::HasSubstr("signal 9"));
  EXPECT_THAT(failed.error(), ::testing::HasSubstr("2 attempts"));
  v1::Job n;
  ASSERT_TRUE(WaitFor(*c, next->id(), IsDone, 120, &n));
  EXPECT_EQ(n.state(), v1::JOB_STATE_SUCCEEDED) << n.error();
  EXPECT_TRUE(c->Health().ok());
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace traind::testing
