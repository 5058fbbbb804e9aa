// Preemption (CLI.md "SIGTERM"): SIGTERM to traind makes the running job write a checkpoint at its
// next step boundary within --shutdown-timeout-seconds; at the next start it resumes from that
// checkpoint and ends bit-identical to an uninterrupted run, with every step reported exactly once
// (nothing after the last reported step is lost, nothing is trained twice). SIGTERM to the job
// runner alone does the same and the job resumes at once. `traind run` stops the same way and
// continues with --resume. `trainctl status` shows the interruption.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

namespace fs = std::filesystem;

class PreemptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-preempt");
    data_ = WriteTextData(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // No periodic checkpoints: the only one before the end is the preemption's.
  std::string Spec(const std::string& name, int64_t steps) {
    SpecOptions o;
    o.train_file = data_;
    o.max_steps = steps;
    o.save_steps = 0;
    o.logging_steps = 7;
    o.n_embd = 64;
    o.seq_len = 64;
    o.batch = 8;
    return WriteJobSpec(dir_, name, o);
  }
  std::string Out(const std::string& name) const { return dir_ + "/runs/" + name; }
  std::string Weights(const std::string& name) const { return ReadAll(Out(name) + "/model.safetensors"); }
  // checkpoint-<step> folders in the run's output_dir.
  std::vector<int64_t> Checkpoints(const std::string& name) const {
    std::vector<int64_t> steps;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(Out(name), ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("checkpoint-", 0) == 0) steps.push_back(std::stoll(f.substr(11)));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  std::string dir_, data_;
};

// Every event of a job, in order.
std::vector<v1::JobEvent> Events(client::Client& c, const std::string& id) {
  std::vector<v1::JobEvent> out;
  EXPECT_TRUE(c.Watch(id, 1, false, [&](const v1::JobEvent& ev) {
    out.push_back(ev);
    return true;
  }).ok());
  return out;
}

// Step events 1..max_steps, each exactly once and in order: no step lost, none trained twice.
void ExpectEveryStepOnce(const std::vector<v1::JobEvent>& events, int64_t max_steps) {
  std::vector<int64_t> steps;
  for (const auto& ev : events) {
    if (ev.has_step()) steps.push_back(ev.step().step());
  }
  ASSERT_EQ(static_cast<int64_t>(steps.size()), max_steps);
  for (int64_t i = 0; i < max_steps; ++i) ASSERT_EQ(steps[static_cast<size_t>(i)], i + 1) << "event " << i;
}

TEST_F(PreemptionTest, SigtermToTraindCheckpointsAtStepBoundaryAndResumesBitIdentical) {
  constexpr int64_t kSteps = 160;
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto ref = c->SubmitFile(Spec("ref", kSteps));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  v1::Job ref_done;
  ASSERT_TRUE(WaitFor(*c, ref->id(), IsDone, 240, &ref_done));
  ASSERT_EQ(ref_done.state(), v1::JOB_STATE_SUCCEEDED) << ref_done.error();

  auto job = c->SubmitFile(Spec("pre", kSteps));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 10; }, 120));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.Stop(), 0) << "traind exits cleanly after a SIGTERM";
  const double stop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_seconds, 20.0) << "a tiny job checkpoints within a step, far inside the grace period";

  // The preemption checkpoint is the only one, at a step short of the end.
  const std::vector<int64_t> ckpts = Checkpoints("pre");
  ASSERT_EQ(ckpts.size(), 1u) << "save_steps 0: only the preemption's checkpoint";
  const int64_t at = ckpts[0];
  ASSERT_GE(at, 10);
  ASSERT_LT(at, kSteps) << "the SIGTERM landed after the end; make the job longer";
  EXPECT_FALSE(fs::exists(Out("pre") + "/model.safetensors")) << "no final model from an interrupted run";

  ASSERT_TRUE(d.Start({"--listen", d.addr()}));
  {
    client::ClientOptions o;
    o.addr = d.addr();
    o.token = d.token();
    o.own_connection = true;
    c = client::Client::Create(o).value();
  }
  // Before the restart's attempt reports a step, the record says where it stopped.
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 240, &done));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.interruptions(), 1);
  EXPECT_EQ(done.interrupted_step(), at);
  EXPECT_EQ(done.attempts(), 2);

  const std::vector<v1::JobEvent> events = Events(*c, job->id());
  ExpectEveryStepOnce(events, kSteps);
  // The last step reported before the stop is the checkpoint's: nothing after it was lost.
  int64_t last_before = 0;
  bool interrupted_note = false, restart_note = false;
  for (const auto& ev : events) {
    if (ev.has_message() && ev.message().find("interrupted by SIGTERM") != std::string::npos) {
      interrupted_note = true;
      EXPECT_THAT(ev.message(), ::testing::HasSubstr("checkpoint-" + std::to_string(at) + " written"));
      EXPECT_THAT(ev.message(), ::testing::HasSubstr("resumes from it at the next start"));
    }
    if (ev.has_message() && ev.message().find("interrupted at step " + std::to_string(at)) != std::string::npos)
      restart_note = true;
    if (ev.has_step() && !interrupted_note) last_before = ev.step().step();
  }
  EXPECT_TRUE(interrupted_note);
  EXPECT_TRUE(restart_note) << "the restart says where the job resumes";
  EXPECT_EQ(last_before, at);
  for (int64_t i = 1; i < static_cast<int64_t>(events.size()); ++i)
    EXPECT_EQ(events[static_cast<size_t>(i)].sequence(), i + 1);

  EXPECT_TRUE(Weights("ref") == Weights("pre")) << "final weights differ from the uninterrupted run";
  EXPECT_DOUBLE_EQ(ref_done.summary().train_loss(), done.summary().train_loss());
  EXPECT_DOUBLE_EQ(ref_done.summary().eval_loss(), done.summary().eval_loss());

  // trainctl shows it, in text and in JSON.
  CmdResult text = Trainctl({"--addr", d.addr(), "--token", d.token(), "status", job->id()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, ::testing::HasSubstr("interrupted:"));
  EXPECT_THAT(text.out, ::testing::HasSubstr("1 time by SIGTERM, last at step " + std::to_string(at)));
  CmdResult json = Trainctl({"--addr", d.addr(), "--token", d.token(), "-o", "json", "status", job->id()});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j.value("interruptions", -1), 1);
  EXPECT_EQ(j.value("interrupted_step", int64_t{-1}), at);
}

TEST_F(PreemptionTest, SigtermToTheJobRunnerAloneCheckpointsAndResumesAtOnce) {
  constexpr int64_t kSteps = 120;
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto ref = c->SubmitFile(Spec("ref", kSteps));
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE(WaitFor(*c, ref->id(), IsDone, 240));
  auto job = c->SubmitFile(Spec("pre", kSteps));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 10; }, 120));
  const pid_t runner = d.RunnerPid();
  ASSERT_GT(runner, 0);
  ASSERT_EQ(::kill(runner, SIGTERM), 0);
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 240, &done));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.interruptions(), 1);
  EXPECT_GE(done.interrupted_step(), 10);
  EXPECT_LT(done.interrupted_step(), kSteps) << "the SIGTERM landed after the end; make the job longer";
  EXPECT_EQ(done.attempts(), 2) << "a preemption is not a crash, and it resumes in a new attempt";
  const std::vector<v1::JobEvent> events = Events(*c, job->id());
  ExpectEveryStepOnce(events, kSteps);
  bool resumed_now = false;
  for (const auto& ev : events) {
    if (ev.has_message() && ev.message().find("resuming from it now") != std::string::npos) resumed_now = true;
  }
  EXPECT_TRUE(resumed_now);
  EXPECT_TRUE(Weights("ref") == Weights("pre")) << "final weights differ from the uninterrupted run";
  EXPECT_TRUE(c->Health().ok()) << "traind stays up";
}

// A cancel is not a preemption: the job ends CANCELLED, without a preemption checkpoint.
TEST_F(PreemptionTest, CancelStillEndsTheJobWithoutACheckpoint) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start());
  auto c = d.Connect();
  auto job = c->SubmitFile(Spec("cancel", 100000));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitFor(*c, job->id(), [](const v1::Job& j) { return j.step() >= 5; }, 120));
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, job->id(), IsDone, 60, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done.interruptions(), 0);
  EXPECT_TRUE(Checkpoints("cancel").empty());
}

// `traind run`: SIGTERM writes the checkpoint and says how to continue; --resume ends
// bit-identical to the uninterrupted run.
TEST_F(PreemptionTest, TraindRunStopsWithACheckpointAndResumes) {
  constexpr int64_t kSteps = 160;
  const std::string ref_spec = Spec("ref", kSteps), spec = Spec("local", kSteps);
  CmdResult ref = RunCommand({TRAIND_BIN, "run", ref_spec, "--device", "cpu"}, 240);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;

  const std::string out_path = dir_ + "/local.out", err_path = dir_ + "/local.err";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FILE* o = std::freopen(out_path.c_str(), "w", stdout);
    FILE* e = std::freopen(err_path.c_str(), "w", stderr);
    (void)o;
    (void)e;
    ::execl(TRAIND_BIN, TRAIND_BIN, "run", spec.c_str(), "--device", "cpu", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for the first logged window (step 7), then SIGTERM.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (ReadAll(out_path).find("step 7/") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(ReadAll(out_path).find("step 7/"), std::string::npos) << ReadAll(err_path);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "traind run ended by signal " << WTERMSIG(status)
                                 << "; its stderr:\n" << ReadAll(err_path);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string err = ReadAll(err_path);
  EXPECT_THAT(err, ::testing::HasSubstr("interrupted: preempted at step"));
  EXPECT_THAT(err, ::testing::HasSubstr("--resume"));
  const std::vector<int64_t> ckpts = Checkpoints("local");
  ASSERT_EQ(ckpts.size(), 1u);
  ASSERT_LT(ckpts[0], kSteps) << "the SIGTERM landed after the end; make the job longer";
  EXPECT_THAT(ReadAll(out_path), ::testing::HasSubstr("checkpoint " + Out("local") + "/checkpoint-" +
                                                          std::to_string(ckpts[0])));

  CmdResult resumed = RunCommand({TRAIND_BIN, "run", spec, "--device", "cpu", "--resume"}, 240);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(Weights("ref") == Weights("local")) << "final weights differ from the uninterrupted run";
}

}  // namespace
}  // namespace traind::testing
