// Bad input at submit: malformed YAML, unknown field, negative batch size, missing data file, too
// big for the budget → INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION naming the field, and
// trainctl exit 2 with one line on stderr. Then a fuzz-style run of a few thousand random and
// mutated specs: traind stays up and the stored jobs are intact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("traind-badinput"));
    data_ = new std::string(WriteTextData(*dir_, 20000));
    daemon_ = new Daemon(*dir_ + "/state");
    ASSERT_TRUE(daemon_->Start({"--memory-budget", "64MiB"}));
  }
  static void TearDownTestSuite() {
    daemon_->Stop();
    delete daemon_;
    std::filesystem::remove_all(*dir_);
  }
  static std::string Good() {
    SpecOptions o;
    o.train_file = *data_;
    o.output_dir = *dir_ + "/runs/good";
    o.max_steps = 2;
    return TinySpec(o);
  }
  static std::string Replace(std::string s, const std::string& from, const std::string& to) {
    const auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
    return s;
  }
  Status Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_base_dir(*dir_);
    return daemon_->Connect()->Submit(req).status();
  }
  CmdResult CtlSubmit(const std::string& yaml) {
    const std::string path = *dir_ + "/bad.yaml";
    WriteAll(path, yaml);
    return Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "submit", path});
  }
  static std::string* dir_;
  static std::string* data_;
  static Daemon* daemon_;
};
std::string* BadInputTest::dir_;
std::string* BadInputTest::data_;
Daemon* BadInputTest::daemon_;

TEST_F(BadInputTest, EachBadSpecIsRejectedWithItsFieldPath) {
  struct Case {
    std::string yaml;
    Status::Code code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"name: [unclosed\n  model: {", Status::Code::kInvalidArgument, ""},
      {Replace(Good(), "learning_rate:", "lerning_rate:"), Status::Code::kInvalidArgument, "training.lerning_rate"},
      {Replace(Good(), "per_device_train_batch_size: 4", "per_device_train_batch_size: -8"),
       Status::Code::kInvalidArgument, "training.per_device_train_batch_size"},
      {Replace(Good(), *data_, *dir_ + "/no-such-file.txt"), Status::Code::kNotFound, "no-such-file.txt"},
      // Data parallel through the daemon (trainctl submit --hosts, docs/distributed.md): the rank
      // must be in the spec (a daemon's environment is not a rank's).
      {Good() + "distributed: {world_size: 2}\n", Status::Code::kInvalidArgument, "distributed.rank: must be set"},
      {Replace(Replace(Good(), "n_embd: 32", "n_embd: 2048"), "n_layer: 2", "n_layer: 24"),
       Status::Code::kFailedPrecondition, ""},
  };
  for (const auto& c : cases) {
    Status s = Submit(c.yaml);
    ASSERT_FALSE(s.ok()) << c.yaml;
    if (c.code == Status::Code::kNotFound) {
      EXPECT_TRUE(s.code() == Status::Code::kNotFound || s.code() == Status::Code::kFailedPrecondition)
          << s.ToString();
    } else {
      EXPECT_EQ(s.code(), c.code) << s.ToString();
    }
    EXPECT_THAT(s.message(), ::testing::HasSubstr(c.needle));
    CmdResult r = CtlSubmit(c.yaml);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("trainctl: "));
    EXPECT_THAT(r.err, ::testing::HasSubstr(c.needle));
    EXPECT_TRUE(r.out.empty());
  }
  // The budget case says what would make it fit.
  Status big = Submit(cases.back().yaml);
  EXPECT_THAT(big.message(), ::testing::HasSubstr("budget"));
  // A usage error is exit 2 too.
  EXPECT_EQ(Trainctl({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Trainctl({"submit"}).exit_code, 2);
}

TEST_F(BadInputTest, FuzzedSpecsNeverHurtTheDaemon) {
  auto c = daemon_->Connect();
  auto keep = c->SubmitFile([&] {
    const std::string p = *dir_ + "/keep.yaml";
    WriteAll(p, Good());
    return p;
  }());
  ASSERT_TRUE(keep.ok()) << keep.status().ToString();
  std::mt19937 rng(7);
  const std::string good = Good();
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz_:{}[]-,.0123456789 \n\t\"'#&*!|>%@`\\";
  int accepted = 0, rejected = 0;
  const int kCases = 3000;
  for (int i = 0; i < kCases; ++i) {
    std::string s;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // random bytes
      s.resize(rng() % 200);
      for (auto& ch : s) ch = static_cast<char>(rng() % 256);
    } else if (kind == 1) {  // random YAML-ish characters
      s.resize(rng() % 300);
      for (auto& ch : s) ch = alphabet[rng() % alphabet.size()];
    } else {  // a valid spec with a few mutations
      s = good;
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        const size_t p = rng() % s.size();
        switch (rng() % 4) {
          case 0: s[p] = alphabet[rng() % alphabet.size()]; break;
          case 1: s.erase(p, 1 + rng() % 8); break;
          case 2: s.insert(p, 1, alphabet[rng() % alphabet.size()]); break;
          default: s.insert(p, s.substr(rng() % s.size(), rng() % 16)); break;
        }
        if (s.empty()) s = "x";
      }
    }
    v1::SubmitJobRequest req;
    req.set_spec_yaml(s);
    req.set_base_dir(*dir_);
    auto r = c->Submit(req);
    if (r.ok()) {
      ++accepted;
      c->Cancel(r->id());
    } else {
      ++rejected;
      ASSERT_NE(r.status().code(), Status::Code::kUnavailable) << "daemon died on case " << i << ":\n" << s;
      ASSERT_NE(r.status().code(), Status::Code::kInternal) << s;
    }
  }
  std::printf("fuzz: %d accepted, %d rejected of %d\n", accepted, rejected, kCases);
  EXPECT_GT(rejected, kCases / 2);
  EXPECT_TRUE(daemon_->Alive());
  EXPECT_TRUE(c->Health().ok());
  auto still = c->Get(keep->id());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->spec_yaml(), Good());
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, keep->id(), IsDone, 120, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
}

}  // namespace
}  // namespace traind::testing
