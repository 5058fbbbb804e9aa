// Job lifecycle through a real traind: submit via trainctl and via the client library, follow to
// SUCCEEDED, `status -o json` fields, cancel a running job, queue order (FIFO and priority),
// resumable WatchJob.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "daemon_fixture.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace traind::testing {
namespace {

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-lifecycle");
    data_ = WriteTextData(dir_);
    daemon_ = std::make_unique<Daemon>(dir_ + "/state");
    ASSERT_TRUE(daemon_->Start());
    client_ = daemon_->Connect();
  }
  std::string Spec(const std::string& name, int64_t steps, int64_t save_steps = 0) {
    SpecOptions o;
    o.train_file = data_;
    o.max_steps = steps;
    o.save_steps = save_steps;
    return WriteJobSpec(dir_, name, o);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string dir_, data_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(LifecycleTest, TrainctlSubmitWaitAndStatusJson) {
  const std::string spec = Spec("viactl", 20);
  CmdResult r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "submit", spec, "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string id = r.out.substr(0, r.out.find('\n'));
  ASSERT_THAT(id, ::testing::StartsWith("job-"));
  EXPECT_EQ(r.out, id + "\n") << "stdout of submit --wait is the id alone";
  EXPECT_THAT(r.err, ::testing::HasSubstr("SUCCEEDED"));

  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "-o", "json", "status", id});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["id"], id);
  EXPECT_EQ(j["name"], "viactl");
  EXPECT_EQ(j["state"], "SUCCEEDED");
  EXPECT_EQ(j["step"], 20);
  EXPECT_EQ(j["max_steps"], 20);
  EXPECT_EQ(j["error"], "");
  EXPECT_EQ(j["output_dir"], dir_ + "/runs/viactl");
  for (const char* k : {"train_loss", "eval_loss", "train_runtime", "train_samples_per_second",
                        "train_tokens_per_second", "peak_memory_bytes"}) {
    ASSERT_TRUE(j["metrics"][k].is_number()) << k << " in " << r.out;
  }
  EXPECT_GT(j["metrics"]["train_loss"].get<double>(), 0.5);
  EXPECT_LT(j["metrics"]["train_loss"].get<double>(), 6.0);  // ln(256) = 5.55 at init
  EXPECT_GT(j["metrics"]["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["plan"]["micro_batch"], 4);
  EXPECT_EQ(j["plan"]["gradient_accumulation_steps"], 1);
  const auto& b = j["plan"]["bytes"];
  EXPECT_EQ(b["total"].get<int64_t>(), b["weights"].get<int64_t>() + b["gradients"].get<int64_t>() +
                                           b["optimizer"].get<int64_t>() + b["activations"].get<int64_t>() +
                                           b["temporary"].get<int64_t>());
  EXPECT_GT(b["weights"].get<int64_t>(), 0);
  // Parameter counts (issue 10): full fine-tuning trains every parameter.
  EXPECT_GT(j["total_params"].get<int64_t>(), 0) << r.out;
  EXPECT_EQ(j["trainable_params"], j["total_params"]);
  EXPECT_EQ(j["plan"]["trainable_params"], j["total_params"]);
  EXPECT_EQ(j["plan"]["total_params"], j["total_params"]);
  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "status", id});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string total = std::to_string(j["total_params"].get<int64_t>());
  EXPECT_THAT(r.out, ::testing::HasSubstr("trainable " + total + " of " + total + " total (100.00%)"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/runs/viactl/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/runs/viactl/trainer_state.json"));

  // logs: the state changes and step lines, in order.
  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "logs", id});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("state QUEUED"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("step 20/20"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("state SUCCEEDED"));
  EXPECT_LT(r.out.find("state RUNNING"), r.out.find("step 1/20"));
}

TEST_F(LifecycleTest, ClientLibrarySubmitFollowAndList) {
  auto job = client_->SubmitFile(Spec("vialib", 10));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  std::vector<int64_t> steps;
  int64_t last_seq = 0;
  Status s = client_->Watch(job->id(), 1, true, [&](const v1::JobEvent& ev) {
    EXPECT_EQ(ev.sequence(), last_seq + 1);  // dense sequence numbers
    last_seq = ev.sequence();
    if (ev.has_step()) steps.push_back(ev.step().step());
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(steps.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(steps[static_cast<size_t>(i)], i + 1);
  auto done = client_->Get(job->id());
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
  // Resumable: from a sequence in the middle gives exactly the tail.
  std::vector<int64_t> tail;
  ASSERT_TRUE(client_->Watch(job->id(), last_seq - 2, false, [&](const v1::JobEvent& ev) {
    tail.push_back(ev.sequence());
    return true;
  }).ok());
  EXPECT_EQ(tail, (std::vector<int64_t>{last_seq - 2, last_seq - 1, last_seq}));

  auto second = client_->SubmitFile(Spec("second", 2));
  ASSERT_TRUE(second.ok());
  auto list = client_->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id(), second->id());  // newest first
  EXPECT_EQ((*list)[1].id(), job->id());
}

TEST_F(LifecycleTest, SubmitAsJobSpecMessageAndEstimate) {
  v1::SubmitJobRequest req;
  auto* spec = req.mutable_spec();
  spec->set_name("message");
  spec->mutable_model()->set_arch("gpt2");
  auto* cfg = spec->mutable_model()->mutable_config();
  cfg->set_vocab_size(256);
  cfg->set_n_positions(32);
  cfg->set_n_embd(32);
  cfg->set_n_layer(1);
  cfg->set_n_head(2);
  spec->mutable_data()->set_train_file("data.txt");  // relative to base_dir
  spec->mutable_data()->set_seq_len(32);
  spec->mutable_training()->set_max_steps(3);
  spec->mutable_training()->set_per_device_train_batch_size(2);
  spec->set_output_dir("runs/message");
  req.set_base_dir(dir_);
  auto job = client_->Submit(req);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->output_dir(), dir_ + "/runs/message");
  EXPECT_EQ(job->plan().micro_batch(), 2);
  v1::Job done;
  ASSERT_TRUE(WaitFor(*client_, job->id(), IsDone, 60, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  // A relative base_dir is refused; an unknown arch names its field.
  req.set_base_dir("relative/dir");
  EXPECT_EQ(client_->Submit(req).status().code(), Status::Code::kInvalidArgument);
  req.set_base_dir(dir_);
  req.mutable_spec()->mutable_model()->set_arch("gpt5");
  auto bad = client_->Submit(req);
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("model.arch"));

  // estimate: the same plan object as status, plus a reason.
  CmdResult r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "-o", "json", "estimate",
                          Spec("est", 5)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["plan"]["micro_batch"], 4);
  EXPECT_GT(j["plan"]["bytes"]["total"].get<int64_t>(), 0);
  EXPECT_EQ(j["plan"]["optimizer"], "adamw");
  EXPECT_GT(j["plan"]["trainable_params"].get<int64_t>(), 0);
  EXPECT_EQ(j["plan"]["trainable_params"], j["plan"]["total_params"]) << "no LoRA: every parameter trains";
  EXPECT_TRUE(j["reason"].is_string());
  EXPECT_EQ(j["fits"], true);
  EXPECT_TRUE(j["levers"].empty());
  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "estimate", Spec("est", 5)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("activations"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("micro_batch 4"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("optimizer adamw"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("parameters: trainable " + std::to_string(j["plan"]["trainable_params"].get<int64_t>()) +
                                              " of " + std::to_string(j["plan"]["total_params"].get<int64_t>()) +
                                              " total (100.00%)"));
}

TEST_F(LifecycleTest, HealthAndReflection) {
  CmdResult r = Trainctl({"--addr", daemon_->addr(), "-o", "json", "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["status"], "SERVING");
  // Reflection through the Python gRPC client with raw bytes (list_services = "").
  const std::string py =
      "import grpc,sys\n"
      "ch = grpc.insecure_channel(sys.argv[1])\n"
      "call = ch.stream_stream('/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo',"
      " request_serializer=None, response_deserializer=None)\n"
      "for resp in call(iter([bytes([0x3a, 0x00])]), timeout=10):\n"
      "    sys.stdout.write(resp.decode('latin-1'))\n"
      "    break\n";
  if (!std::filesystem::exists(TRAIND_TEST_PYTHON)) GTEST_SKIP() << "SKIPPED: no " << TRAIND_TEST_PYTHON;
  WriteAll(dir_ + "/reflect.py", py);
  r = RunCommand({TRAIND_TEST_PYTHON, dir_ + "/reflect.py", daemon_->addr()}, 30);
  if (r.err.find("No module named 'grpc'") != std::string::npos)
    GTEST_SKIP() << "SKIPPED: python3-grpcio is not installed";
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("traind.v1.JobService"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("grpc.health.v1.Health"));
  // trainctl against nothing: exit 3.
  daemon_->Stop();
  r = Trainctl({"--addr", daemon_->addr(), "--timeout", "2", "health"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, ::testing::HasSubstr("cannot reach traind"));
}

// grpc.health.v1.Health as gRPC's own service answers: Check of "" SERVING, of an unknown service
// NOT_FOUND; Watch sends SERVING now, NOT_SERVING when traind shuts down, then ends.
TEST_F(LifecycleTest, HealthCheckAndWatchAsGrpcsService) {
  namespace health = grpc::health::v1;
  auto stub = health::Health::NewStub(
      grpc::CreateChannel(daemon_->addr(), grpc::InsecureChannelCredentials()));
  auto check = [&](const std::string& service, health::HealthCheckResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    health::HealthCheckRequest req;
    req.set_service(service);
    return stub->Check(&ctx, req, resp);
  };
  health::HealthCheckResponse resp;
  ASSERT_TRUE(check("", &resp).ok());
  EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVING);
  const grpc::Status unknown = check("no.such.Service", &resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();

  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  health::HealthCheckRequest req;
  auto reader = stub->Watch(&watch_ctx, req);
  std::vector<health::HealthCheckResponse::ServingStatus> seen;
  ASSERT_TRUE(reader->Read(&resp));
  seen.push_back(resp.status());
  std::thread stopper([&] { daemon_->Stop(); });
  while (reader->Read(&resp)) seen.push_back(resp.status());
  const grpc::Status end = reader->Finish();
  stopper.join();
  ASSERT_GE(seen.size(), 2u) << end.error_message();
  EXPECT_EQ(seen.front(), health::HealthCheckResponse::SERVING);
  EXPECT_EQ(seen.back(), health::HealthCheckResponse::NOT_SERVING);
}

TEST_F(LifecycleTest, CancelRunningJobStopsWithinASecond) {
  auto job = client_->SubmitFile(Spec("long", 100000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitFor(*client_, job->id(), [](const v1::Job& j) { return j.step() >= 3; }, 60));
  CmdResult r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "cancel", job->id()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto t0 = std::chrono::steady_clock::now();
  v1::Job last;
  ASSERT_TRUE(WaitFor(*client_, job->id(), IsDone, 30, &last));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(last.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_LT(last.step(), 100000);
  EXPECT_LT(seconds, 5.0) << "cancel should take effect within one step";
  // --wait on a cancelled job exits 1; a second cancel is a no-op.
  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "cancel", job->id()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(daemon_->RunnerPid(), 0) << "the runner child is gone";
}

TEST_F(LifecycleTest, JobsRunOneAtATimeInPriorityThenSubmitOrder) {
  // A blocker holds the device while three more queue: low(0), high(5), low2(0).
  auto blocker = client_->SubmitFile(Spec("blocker", 100000));
  ASSERT_TRUE(blocker.ok());
  ASSERT_TRUE(WaitFor(*client_, blocker->id(), [](const v1::Job& j) { return j.step() >= 1; }, 60));
  auto a = client_->SubmitFile(Spec("a", 3));
  auto b = client_->SubmitFile(Spec("b", 3), /*priority=*/5);
  auto c = client_->SubmitFile(Spec("c", 3));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto qa = client_->Get(a->id());
  EXPECT_EQ(qa->state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(client_->Cancel(blocker->id()).ok());
  for (const auto& id : {a->id(), b->id(), c->id()}) {
    v1::Job j;
    ASSERT_TRUE(WaitFor(*client_, id, IsDone, 120, &j));
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.error();
  }
  auto ja = client_->Get(a->id()), jb = client_->Get(b->id()), jc = client_->Get(c->id());
  // One at a time: each starts after the previous one finished.
  EXPECT_LE(jb->finished_unix_ms(), ja->started_unix_ms());
  EXPECT_LE(ja->finished_unix_ms(), jc->started_unix_ms());
}

}  // namespace
}  // namespace traind::testing
