// Security: bearer tokens (none / wrong → UNAUTHENTICATED, trainctl exit 3), per-user isolation
// (another user's job is NOT_FOUND for get, watch and cancel), the token file's 0600 mode, TLS
// (a plaintext client fails against a TLS traind; a TLS client with the CA succeeds), and the
// refusal to serve plaintext on a non-loopback address.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-security");
    data_ = WriteTextData(dir_, 20000);
    SpecOptions o;
    o.train_file = data_;
    o.output_dir = dir_ + "/runs/a";
    o.max_steps = 3;
    spec_ = dir_ + "/job.yaml";
    WriteAll(spec_, TinySpec(o));
    tokens_ = dir_ + "/tokens";
    WriteAll(tokens_, "# users\nalice alice-secret-token\nbob bob-secret-token\n");
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string dir_, data_, spec_, tokens_;
};

TEST_F(SecurityTest, TokensAndOwnership) {
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start({"--tokens-file", tokens_}));
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/state/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(d.token().size(), 40u);

  // No token and a wrong token.
  for (const std::string& tok : {std::string(), std::string("not-a-token")}) {
    auto c = d.Connect(tok);
    auto r = c->List();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kUnauthenticated) << r.status().ToString();
    EXPECT_EQ(c->SubmitFile(spec_).status().code(), Status::Code::kUnauthenticated);
  }
  // Health needs no token.
  EXPECT_TRUE(d.Connect("")->Health().ok());
  CmdResult r = Trainctl({"--addr", d.addr(), "--token", "wrong", "list"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, ::testing::HasSubstr("token"));
  r = Trainctl({"--addr", d.addr(), "--token-file", dir_ + "/missing-token", "list"});
  EXPECT_EQ(r.exit_code, 3);

  // Alice's job is invisible to Bob.
  auto alice = d.Connect("alice-secret-token");
  auto bob = d.Connect("bob-secret-token");
  auto job = alice->SubmitFile(spec_);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->owner(), "alice");
  EXPECT_EQ(bob->Get(job->id()).status().code(), Status::Code::kNotFound);
  EXPECT_EQ(bob->Cancel(job->id()).status().code(), Status::Code::kNotFound);
  EXPECT_EQ(bob->Watch(job->id(), 1, false, [](const v1::JobEvent&) { return true; }).code(),
            Status::Code::kNotFound);
  EXPECT_TRUE(bob->List()->empty());
  EXPECT_EQ(alice->List()->size(), 1u);
  r = Trainctl({"--addr", d.addr(), "--token", "bob-secret-token", "status", job->id()});
  EXPECT_EQ(r.exit_code, 2);
  v1::Job done;
  ASSERT_TRUE(WaitFor(*alice, job->id(), IsDone, 60, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << "Bob's cancel must not have touched it";
  // The local token (trainctl's default through --state-dir) is user `local`: sees nothing of Alice's.
  r = Trainctl({"--addr", d.addr(), "--state-dir", d.state_dir(), "-o", "json", "list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["jobs"].empty());
}

TEST_F(SecurityTest, TlsRefusesPlaintextClients) {
  const std::string key = dir_ + "/key.pem", cert = dir_ + "/cert.pem";
  CmdResult gen = RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                              "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                              "subjectAltName=DNS:localhost,IP:127.0.0.1"});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start({"--tls-cert", cert, "--tls-key", key}));
  client::ClientOptions plain;
  plain.addr = d.addr();
  plain.token = d.token();
  plain.timeout_seconds = 3;
  auto pc = client::Client::Create(plain);
  ASSERT_TRUE(pc.ok());
  auto r = (*pc)->List();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kUnavailable) << r.status().ToString();

  client::ClientOptions tls = plain;
  tls.tls = true;
  tls.tls_ca_file = cert;
  auto tc = client::Client::Create(tls);
  ASSERT_TRUE(tc.ok());
  auto ok = (*tc)->List();
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  CmdResult ctl = Trainctl({"--addr", d.addr(), "--state-dir", d.state_dir(), "--tls-ca", cert, "list"});
  EXPECT_EQ(ctl.exit_code, 0) << ctl.err;
  ctl = Trainctl({"--addr", d.addr(), "--state-dir", d.state_dir(), "--timeout", "3", "list"});
  EXPECT_EQ(ctl.exit_code, 3);
}

TEST_F(SecurityTest, ConfigFileKeysActLikeFlags) {
  const std::string cfg = dir_ + "/traind.yaml";
  WriteAll(cfg, "tokens-file: " + tokens_ + "\nmax_attempts: 2\nlog-level: warn\n");
  Daemon d(dir_ + "/state");
  ASSERT_TRUE(d.Start({"--config", cfg}));
  EXPECT_TRUE(d.Connect("alice-secret-token")->List().ok());
  WriteAll(cfg, "no-such-key: 1\n");
  CmdResult r = RunCommand({TRAIND_BIN, "--config", cfg, "--state-dir", dir_ + "/state2"}, 20);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, ::testing::HasSubstr("no-such-key: unknown key"));
}

TEST_F(SecurityTest, RefusesPlaintextOnNonLoopbackAddress) {
  CmdResult r = RunCommand({TRAIND_BIN, "--state-dir", dir_ + "/state", "--listen", "0.0.0.0:0",
                            "--metrics-listen", "127.0.0.1:0"}, 20);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, ::testing::HasSubstr("non-loopback"));
}

}  // namespace
}  // namespace traind::testing
