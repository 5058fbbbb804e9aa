// Path confinement of submitted jobs (server/path_policy.h, CLI.md "Paths") and the refusal of a
// second job on a busy output_dir: the policy alone (resolution through `..` and symlinks, roots per
// user), its inputs (flags, config, tokens-file lines), then a real traind + trainctl end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "auth.h"
#include "daemon_fixture.h"
#include "options.h"
#include "path_policy.h"

namespace traind::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using traind::testing::MakeTempDir;
using traind::testing::WriteAll;
namespace fs = std::filesystem;

// A temp tree: data/ (with train.txt), out/, elsewhere/ (with secret.txt), all resolved.
class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = *ResolvePath(MakeTempDir("traind-paths"));
    data_ = root_ + "/data";
    out_ = root_ + "/out";
    elsewhere_ = root_ + "/elsewhere";
    for (const auto& d : {data_, out_, elsewhere_}) fs::create_directories(d);
    WriteAll(data_ + "/train.txt", "hello");
    WriteAll(elsewhere_ + "/secret.txt", "secret");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }
  engine::JobSpec Spec(const std::string& train, const std::string& output) const {
    engine::JobSpec s;
    s.data.train_file = train;
    s.output_dir = output;
    return s;
  }
  PathPolicy Global() const { return *PathPolicy::Create({data_}, {out_}, {}); }

  std::string root_, data_, out_, elsewhere_;
};

TEST_F(PathPolicyTest, NoRootsConfinesNobody) {
  PathPolicy none;
  EXPECT_FALSE(none.Confines("alice"));
  EXPECT_TRUE(none.CheckSpec("alice", Spec("/etc/passwd", "/tmp/anywhere")).ok());
  auto empty = PathPolicy::Create({}, {}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->Confines("local"));
}

TEST_F(PathPolicyTest, InsideRootsIsAccepted) {
  const PathPolicy p = Global();
  EXPECT_TRUE(p.Confines("local"));
  Status s = p.CheckSpec("local", Spec(data_ + "/train.txt", out_ + "/run/not-yet"));
  EXPECT_TRUE(s.ok()) << s.ToString();
  // A data file inside an output root (a previous job's output) is an allowed input.
  WriteAll(out_ + "/made-by-a-job.txt", "x");
  s = p.CheckSpec("local", Spec(out_ + "/made-by-a-job.txt", out_ + "/run"));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(PathPolicyTest, OutsideRootsNamesTheField) {
  const PathPolicy p = Global();
  Status s = p.CheckSpec("alice", Spec("/etc/passwd", out_ + "/run"));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "data.train_file: /etc/passwd is outside the data and output roots of user alice (" + data_ +
                             ", " + out_ + ")");
  // A root is a directory, not a string prefix: data2 is not inside data.
  fs::create_directories(root_ + "/data2");
  WriteAll(root_ + "/data2/t.txt", "x");
  EXPECT_FALSE(p.CheckSpec("alice", Spec(root_ + "/data2/t.txt", out_ + "/run")).ok());
}

TEST_F(PathPolicyTest, DotDotIsResolved) {
  const PathPolicy p = Global();
  Status s = p.CheckSpec("alice", Spec(data_ + "/../elsewhere/secret.txt", out_ + "/run"));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(s.message(), StartsWith("data.train_file: " + data_ + "/../elsewhere/secret.txt (resolves to " +
                                      elsewhere_ + "/secret.txt) is outside"));
  // Through a directory that does not exist yet, for an output: lexically.
  s = p.CheckSpec("alice", Spec(data_ + "/train.txt", out_ + "/new/../../elsewhere/run"));
  EXPECT_THAT(s.message(), StartsWith("output_dir: "));
}

TEST_F(PathPolicyTest, SymlinkOutIsRefused) {
  const PathPolicy p = Global();
  ASSERT_EQ(::symlink((elsewhere_ + "/secret.txt").c_str(), (data_ + "/innocent.txt").c_str()), 0);
  Status s = p.CheckSpec("alice", Spec(data_ + "/innocent.txt", out_ + "/run"));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(s.message(), StartsWith("data.train_file: " + data_ + "/innocent.txt (resolves to " + elsewhere_ +
                                      "/secret.txt) is outside"));
  // A symlinked directory, and `..` after it (the parent of the target, as the kernel walks it).
  ASSERT_EQ(::symlink(elsewhere_.c_str(), (out_ + "/link").c_str()), 0);
  EXPECT_THAT(p.CheckSpec("alice", Spec(data_ + "/train.txt", out_ + "/link/run")).message(),
              StartsWith("output_dir: " + out_ + "/link/run (resolves to " + elsewhere_ + "/run) is outside"));
  fs::create_directories(elsewhere_ + "/sub");
  ASSERT_EQ(::symlink((elsewhere_ + "/sub").c_str(), (data_ + "/sub").c_str()), 0);
  EXPECT_THAT(p.CheckSpec("alice", Spec(data_ + "/sub/../secret.txt", out_ + "/run")).message(),
              HasSubstr("(resolves to " + elsewhere_ + "/secret.txt)"));
  // A dangling symlink still leads where a write through it would go.
  ASSERT_EQ(::symlink((elsewhere_ + "/not-yet").c_str(), (out_ + "/dangling").c_str()), 0);
  EXPECT_THAT(p.CheckSpec("alice", Spec(data_ + "/train.txt", out_ + "/dangling")).message(),
              StartsWith("output_dir: " + out_ + "/dangling (resolves to " + elsewhere_ + "/not-yet) is outside"));
  // A symlink inside a folder input (init_from) or an existing output_dir.
  fs::create_directories(data_ + "/model");
  ASSERT_EQ(::symlink((elsewhere_ + "/secret.txt").c_str(), (data_ + "/model/model.safetensors").c_str()), 0);
  engine::JobSpec spec = Spec(data_ + "/train.txt", out_ + "/run");
  spec.model.init_from = data_ + "/model";
  EXPECT_THAT(p.CheckSpec("alice", spec).message(),
              StartsWith("model.init_from: " + data_ + "/model/model.safetensors (resolves to " + elsewhere_ +
                         "/secret.txt) is outside"));
  fs::create_directories(out_ + "/old/checkpoint-10");
  ASSERT_EQ(::symlink(elsewhere_.c_str(), (out_ + "/old/checkpoint-10/x").c_str()), 0);
  EXPECT_THAT(p.CheckSpec("alice", Spec(data_ + "/train.txt", out_ + "/old")).message(), StartsWith("output_dir: "));
}

TEST_F(PathPolicyTest, OutputsOnlyInOutputRoots) {
  const PathPolicy p = Global();
  Status s = p.CheckSpec("alice", Spec(data_ + "/train.txt", data_ + "/run"));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "output_dir: " + data_ + "/run is outside the output roots of user alice (" + out_ + ")");
  engine::JobSpec spec = Spec(data_ + "/train.txt", out_ + "/run");
  spec.training.offload_dir = elsewhere_ + "/offload";
  EXPECT_THAT(p.CheckSpec("alice", spec).message(),
              StartsWith("training.offload_dir: " + elsewhere_ + "/offload is outside the output roots"));
  spec.training.offload_dir = out_ + "/offload";
  EXPECT_TRUE(p.CheckSpec("alice", spec).ok());
  // The tokenizer when it is a path; "byte" is none.
  spec.data.tokenizer = elsewhere_ + "/tokenizer.json";
  EXPECT_THAT(p.CheckSpec("alice", spec).message(), StartsWith("data.tokenizer: "));
  // resume_from_checkpoint is an input: in a data or output root.
  spec.data.tokenizer = "byte";
  spec.training.resume_from_checkpoint = elsewhere_ + "/checkpoint-4";
  EXPECT_THAT(p.CheckSpec("alice", spec).message(),
              StartsWith("training.resume_from_checkpoint: " + elsewhere_ + "/checkpoint-4 is outside the data and "
                         "output roots"));
  spec.training.resume_from_checkpoint = out_ + "/run/checkpoint-4";
  EXPECT_TRUE(p.CheckSpec("alice", spec).ok());
}

TEST_F(PathPolicyTest, PerUserRootsReplaceTheGlobalOnesForThatUserOnly) {
  const std::string alice_data = root_ + "/alice-data", alice_out = root_ + "/alice-out";
  fs::create_directories(alice_data);
  fs::create_directories(alice_out);
  WriteAll(alice_data + "/a.txt", "a");
  std::map<std::string, UserRoots> per_user;
  per_user["alice"] = UserRoots{RootList{alice_data}, RootList{alice_out}};
  // Without global roots: alice is confined, bob is not.
  auto only_alice = PathPolicy::Create({}, {}, per_user);
  ASSERT_TRUE(only_alice.ok()) << only_alice.status().ToString();
  EXPECT_TRUE(only_alice->Confines("alice"));
  EXPECT_FALSE(only_alice->Confines("bob"));
  EXPECT_TRUE(only_alice->CheckSpec("alice", Spec(alice_data + "/a.txt", alice_out + "/run")).ok());
  EXPECT_THAT(only_alice->CheckSpec("alice", Spec("/etc/passwd", alice_out + "/run")).message(),
              HasSubstr("outside the data and output roots of user alice (" + alice_data + ", " + alice_out + ")"));
  EXPECT_TRUE(only_alice->CheckSpec("bob", Spec("/etc/passwd", "/tmp/bob-run")).ok());
  // With global roots: bob gets the global ones and never alice's; alice's replace the global ones.
  auto both = PathPolicy::Create({data_}, {out_}, per_user);
  ASSERT_TRUE(both.ok());
  EXPECT_THAT(both->CheckSpec("bob", Spec(alice_data + "/a.txt", out_ + "/run")).message(),
              StartsWith("data.train_file: " + alice_data + "/a.txt is outside the data and output roots of user bob"));
  EXPECT_THAT(both->CheckSpec("bob", Spec(data_ + "/train.txt", alice_out + "/run")).message(),
              StartsWith("output_dir: "));
  EXPECT_TRUE(both->CheckSpec("bob", Spec(data_ + "/train.txt", out_ + "/run")).ok());
  EXPECT_FALSE(both->CheckSpec("alice", Spec(data_ + "/train.txt", alice_out + "/run")).ok());
  // A line naming only data= keeps the global output roots.
  per_user["carol"] = UserRoots{RootList{alice_data}, std::nullopt};
  auto mixed = PathPolicy::Create({}, {out_}, per_user);
  ASSERT_TRUE(mixed.ok());
  EXPECT_TRUE(mixed->CheckSpec("carol", Spec(alice_data + "/a.txt", out_ + "/run")).ok());
  // ... and without global output roots, carol could write nowhere: refused at start.
  auto nowhere = PathPolicy::Create({}, {}, per_user);
  EXPECT_EQ(nowhere.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(nowhere.status().message(), HasSubstr("user carol"));
  EXPECT_FALSE(PathPolicy::Create({data_}, {}, {}).ok());
}

TEST_F(PathPolicyTest, ResolveAndWithin) {
  EXPECT_EQ(*ResolvePath(data_ + "/./x/../y/"), data_ + "/y");
  EXPECT_TRUE(IsWithin(data_, data_));
  EXPECT_TRUE(IsWithin(data_ + "/a/b", data_));
  EXPECT_FALSE(IsWithin(data_ + "2", data_));
  EXPECT_TRUE(IsWithin("/anything", "/"));
  auto roots = ParseRoots(data_ + ", " + out_ + "," + data_, "--data-roots", true);
  ASSERT_TRUE(roots.ok()) << roots.status().ToString();
  EXPECT_EQ(*roots, (RootList{data_, out_}));
  EXPECT_THAT(ParseRoots(root_ + "/missing", "--data-roots", true).status().message(),
              HasSubstr("--data-roots: " + root_ + "/missing is not an existing directory"));
  EXPECT_FALSE(ParseRoots(data_ + ",", "--data-roots", true).ok());
  EXPECT_THAT(ParseRoots("relative", "data=", false).status().message(), HasSubstr("not an absolute path"));
}

Result<ServerOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "traind");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return ParseServerOptions(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST_F(PathPolicyTest, FlagsAndConfigKeys) {
  auto o = Parse({"--data-roots", data_ + "," + elsewhere_, "--output-roots", out_});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->data_root_dirs, (RootList{data_, elsewhere_}));
  EXPECT_EQ(o->output_root_dirs, (RootList{out_}));
  EXPECT_TRUE(Parse({})->data_root_dirs.empty());
  auto missing = Parse({"--data-roots", data_});
  EXPECT_THAT(missing.status().message(), HasSubstr("--data-roots needs --output-roots"));
  EXPECT_THAT(Parse({"--output-roots", root_ + "/nope"}).status().message(), HasSubstr("--output-roots: "));
  WriteAll(root_ + "/c.yaml", "data-roots: [" + data_ + ", " + elsewhere_ + "]\noutput_roots: " + out_ + "\n");
  auto c = Parse({"--config", root_ + "/c.yaml"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->data_root_dirs, (RootList{data_, elsewhere_}));
  EXPECT_EQ(c->output_root_dirs, (RootList{out_}));
}

TEST_F(PathPolicyTest, TokensFileRoots) {
  const std::string state = root_ + "/state";
  fs::create_directories(state);
  WriteAll(root_ + "/tokens", "# users\nalice a-token data=" + data_ + "," + elsewhere_ + " output=" + out_ +
                                  "\nbob b-token\ncarol c-token output=" + out_ + "\nalice a-second-token\n");
  auto auth = TokenAuth::Load(state, root_ + "/tokens");
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  EXPECT_EQ(*auth->Authenticate("Bearer a-token"), "alice");
  EXPECT_EQ(*auth->Authenticate("Bearer a-second-token"), "alice");
  EXPECT_EQ(*auth->Authenticate("Bearer b-token"), "bob");
  ASSERT_EQ(auth->user_roots().size(), 2u);
  EXPECT_EQ(*auth->user_roots().at("alice").data, (RootList{data_, elsewhere_}));
  EXPECT_EQ(*auth->user_roots().at("alice").output, (RootList{out_}));
  EXPECT_FALSE(auth->user_roots().at("carol").data.has_value());

  // Each malformed line is an error with its line number.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"alice a-token data=", ":2: data=: an empty directory name"},
      {"alice a-token data=relative/dir", ":2: data=: relative/dir is not an absolute path"},
      {"alice a-token output=" + root_ + "/missing", ":2: output=: " + root_ + "/missing is not an existing"},
      {"alice a-token write=" + out_, ":2: unexpected 'write="},
      {"alice a-token " + out_, ":2: unexpected '"},
      {"alice a-token data=" + data_ + " data=" + data_, ":2: data= given twice"},
      {"alice data=" + data_, ":2: expected `user token"},
      {"alice a-token output=" + out_ + "\nalice a2 output=" + data_,
       ":3: user alice already has other roots on line 2"},
  };
  for (const auto& [line, needle] : bad) {
    WriteAll(root_ + "/bad", "# users\n" + line + "\n");
    auto r = TokenAuth::Load(state, root_ + "/bad");
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << line;
    EXPECT_THAT(r.status().message(), HasSubstr(root_ + "/bad" + needle)) << line;
  }
}

}  // namespace
}  // namespace traind::server

namespace traind::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A real traind with global roots and per-user roots for alice; trainctl as the client.
class ConfinedDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-confined");
    for (const char* d : {"data", "out", "alice-data", "alice-out"}) fs::create_directories(dir_ + "/" + d);
    data_ = WriteTextData(dir_ + "/data", 20000);
    WriteAll(dir_ + "/tokens", "alice alice-token data=" + dir_ + "/alice-data output=" + dir_ +
                                   "/alice-out\nbob bob-token\n");
    daemon_ = std::make_unique<Daemon>(dir_ + "/state");
    ASSERT_TRUE(daemon_->Start({"--tokens-file", dir_ + "/tokens", "--data-roots", dir_ + "/data", "--output-roots",
                                dir_ + "/out", "--memory-budget", "64MiB"}));
  }
  void TearDown() override {
    daemon_->Stop();
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Writes a spec to <dir>/specs/<name>.yaml and submits it with trainctl as `token` ("" = local).
  CmdResult Submit(const std::string& name, const std::string& train, const std::string& out,
                   const std::string& token = "", int64_t steps = 2, const std::string& training_extra = "",
                   int64_t save_steps = 0) {
    SpecOptions o;
    o.training_extra = training_extra;
    o.save_steps = save_steps;
    o.name = name;
    o.train_file = train;
    o.output_dir = out;
    o.max_steps = steps;
    fs::create_directories(dir_ + "/specs");
    const std::string path = dir_ + "/specs/" + name + ".yaml";
    WriteAll(path, TinySpec(o));
    std::vector<std::string> args = {"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir()};
    if (!token.empty()) args.insert(args.end(), {"--token", token});
    args.insert(args.end(), {"submit", path});
    return Trainctl(args);
  }
  std::string dir_, data_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(ConfinedDaemonTest, SubmitOutsideTheRootsExits2WithTheField) {
  CmdResult r = Submit("passwd", "/etc/passwd", dir_ + "/out/run");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "trainctl: data.train_file: /etc/passwd is outside the data and output roots of user local (" +
                       *server::ResolvePath(dir_ + "/data") + ", " + *server::ResolvePath(dir_ + "/out") + ")\n");
  EXPECT_TRUE(r.out.empty());
  // Through `..`, and an output_dir outside the output roots.
  r = Submit("dotdot", dir_ + "/data/../tokens", dir_ + "/out/run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("data.train_file: " + dir_ + "/data/../tokens (resolves to " +
                               *server::ResolvePath(dir_ + "/tokens") + ") is outside"));
  r = Submit("outside", data_, dir_ + "/data/run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("output_dir: "));
  // Estimate is confined the same way.
  r = Trainctl({"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir(), "estimate",
                dir_ + "/specs/passwd.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("data.train_file: /etc/passwd is outside"));
  // Alice's roots are hers: bob (global roots) cannot use them, alice cannot use the global ones.
  WriteAll(dir_ + "/alice-data/a.txt", ReadAll(data_));
  r = Submit("bob-in-alice", dir_ + "/alice-data/a.txt", dir_ + "/out/bob", "bob-token");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("of user bob"));
  r = Submit("alice-in-global", data_, dir_ + "/alice-out/run", "alice-token");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("of user alice"));
  // Inside the roots: accepted.
  r = Submit("alice-ok", dir_ + "/alice-data/a.txt", dir_ + "/alice-out/run", "alice-token");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Submit("local-ok", data_, dir_ + "/out/run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ConfinedDaemonTest, BusyOutputDirIsRefusedWithTheFirstJobId) {
  CmdResult first = Submit("long", data_, dir_ + "/out/shared", "", 1000000);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string id = first.out.substr(0, first.out.find('\n'));
  auto c = daemon_->Connect();
  ASSERT_TRUE(WaitFor(*c, id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; }, 60));
  // The same directory, spelled differently, from another user with the same roots.
  CmdResult second = Submit("second", data_, dir_ + "/out/../out/shared/", "bob-token");
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.err, HasSubstr("output_dir: " + *server::ResolvePath(dir_ + "/out/shared") +
                                    " is the output_dir of " + id + " (RUNNING)"));
  // Inside it, or holding it: refused too.
  second = Submit("inside", data_, dir_ + "/out/shared/sub");
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.err, HasSubstr("is inside"));
  // Another directory is fine (queued behind the first).
  CmdResult other = Submit("other", data_, dir_ + "/out/other");
  EXPECT_EQ(other.exit_code, 0) << other.err;
  const std::string other_id = other.out.substr(0, other.out.find('\n'));
  // A queued job's output_dir is taken too; a folder holding it is refused.
  second = Submit("holder", data_, dir_ + "/out/other/..//other");
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.err, HasSubstr(" is the output_dir of " + other_id + " (QUEUED)"));
  second = Submit("holder", data_, dir_ + "/out");
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.err, HasSubstr(" holds "));
  // After the first ended, its output_dir is free again.
  ASSERT_TRUE(c->Cancel(id).ok());
  ASSERT_TRUE(WaitFor(*c, id, IsDone, 60));
  second = Submit("again", data_, dir_ + "/out/shared");
  EXPECT_EQ(second.exit_code, 0) << second.err;
}

// JOBSPEC.md: a new job refuses an output_dir holding another run's results (exit 2, the files
// named, nothing touched) unless training.overwrite_output_dir; resume_from_checkpoint continues.
TEST_F(ConfinedDaemonTest, FinishedRunsOutputDirIsRefusedUnlessOverwriteOrResume) {
  auto c = daemon_->Connect();
  CmdResult first = Submit("first", data_, dir_ + "/out/kept", "", 4, "", 2);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string id = first.out.substr(0, first.out.find('\n'));
  v1::Job done;
  ASSERT_TRUE(WaitFor(*c, id, IsDone, 120, &done));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  const std::string weights = ReadAll(dir_ + "/out/kept/model.safetensors");
  ASSERT_FALSE(weights.empty());

  CmdResult again = Submit("again", data_, dir_ + "/out/kept");
  EXPECT_EQ(again.exit_code, 2) << again.out;
  EXPECT_EQ(again.err, "trainctl: output_dir: " + *server::ResolvePath(dir_ + "/out/kept") +
                           " holds another run's files (checkpoint-2, checkpoint-4, model.safetensors and 1 more); "
                           "set training.overwrite_output_dir: true to replace them, "
                           "training.resume_from_checkpoint: true to continue that run, or choose another "
                           "output_dir\n");
  EXPECT_TRUE(again.out.empty()) << "nothing was queued";
  EXPECT_EQ(ReadAll(dir_ + "/out/kept/model.safetensors"), weights);

  // Continuing it to 6 steps from its newest checkpoint: accepted, ends at step 6.
  CmdResult more = Submit("more", data_, dir_ + "/out/kept", "", 6, "  resume_from_checkpoint: true\n", 2);
  ASSERT_EQ(more.exit_code, 0) << more.err;
  const std::string more_id = more.out.substr(0, more.out.find('\n'));
  ASSERT_TRUE(WaitFor(*c, more_id, IsDone, 120, &done));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.summary().global_step(), 6);
  bool resumed = false;
  ASSERT_TRUE(c->Watch(more_id, 1, false, [&](const v1::JobEvent& ev) {
    if (ev.has_message() && ev.message().find("resuming from") != std::string::npos &&
        ev.message().find("checkpoint-4") != std::string::npos) resumed = true;
    return true;
  }).ok());
  EXPECT_TRUE(resumed) << "the run continued from checkpoint-4";

  // Replacing it: accepted.
  CmdResult replace = Submit("replace", data_, dir_ + "/out/kept", "", 2, "  overwrite_output_dir: true\n");
  ASSERT_EQ(replace.exit_code, 0) << replace.err;
  const std::string replace_id = replace.out.substr(0, replace.out.find('\n'));
  ASSERT_TRUE(WaitFor(*c, replace_id, IsDone, 120, &done));
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_FALSE(fs::exists(dir_ + "/out/kept/checkpoint-6")) << "the replaced run's checkpoints are gone";

  // resume_from_checkpoint: true where there is nothing to continue: exit 2, named.
  CmdResult nothing = Submit("nothing", data_, dir_ + "/out/empty", "", 2, "  resume_from_checkpoint: true\n");
  EXPECT_EQ(nothing.exit_code, 2);
  EXPECT_THAT(nothing.err, HasSubstr("training.resume_from_checkpoint: true, but output_dir"));
}

}  // namespace
}  // namespace traind::testing
