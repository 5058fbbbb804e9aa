// Unit tests of traind's pieces that need no running daemon: the status mappings (RocksDB → ours,
// ours → gRPC), option parsing (bytes, loopback check, --config), token auth, and the job store
// (round trip, event ranges, DATA_LOSS on a corrupt record).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <sys/stat.h>

#include <filesystem>

#include "auth.h"
#include "daemon_fixture.h"
#include "job_store.h"
#include "options.h"
#include "status_map.h"

namespace traind::server {
namespace {

TEST(StatusMap, RocksDbToOurs) {
  EXPECT_TRUE(FromRocksDb(rocksdb::Status::OK(), "x").ok());
  EXPECT_EQ(FromRocksDb(rocksdb::Status::NoSpace("disk"), "w").code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::Corruption("bad block"), "r").code(), Status::Code::kDataLoss);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::NotFound(), "r").code(), Status::Code::kNotFound);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::IOError("eio"), "r").code(), Status::Code::kUnavailable);
  EXPECT_THAT(FromRocksDb(rocksdb::Status::Corruption("bad block"), "reading job 7").message(),
              ::testing::HasSubstr("reading job 7"));
}

TEST(StatusMap, OursToGrpc) {
  EXPECT_EQ(ToGrpc(Status::InvalidArgument("a")).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpc(Status::FailedPrecondition("a")).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpc(Status::DataLoss("a")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpc(Status::Unauthenticated("a")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ToGrpc(Status::NotFound("job-1")).error_message(), "job-1");
  EXPECT_TRUE(ToGrpc(Status::Ok()).ok());
}

TEST(Options, BytesAndLoopback) {
  EXPECT_EQ(*ParseBytes("auto"), 0);
  EXPECT_EQ(*ParseBytes("8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*ParseBytes("1.5MiB"), int64_t{3} << 19);
  EXPECT_EQ(*ParseBytes("1000"), 1000);
  EXPECT_FALSE(ParseBytes("-5").ok());
  EXPECT_FALSE(ParseBytes("8 parsecs").ok());
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3:50051"));
}

TEST(Options, ConfigFileAndFlagsWin) {
  const std::string dir = traind::testing::MakeTempDir("traind-options");
  traind::testing::WriteAll(dir + "/c.yaml", "state-dir: /from/config\nmax_attempts: 5\nmemory-budget: 1GiB\n");
  std::vector<std::string> args = {"traind", "--config", dir + "/c.yaml", "--max-attempts", "2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  auto o = ParseServerOptions(static_cast<int>(argv.size()), argv.data(), &help);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->state_dir, "/from/config");
  EXPECT_EQ(o->max_attempts, 2);  // the flag wins
  EXPECT_EQ(o->memory_budget_bytes, int64_t{1} << 30);
  std::vector<std::string> bad = {"traind", "--tls-cert", "only-cert.pem"};
  argv.clear();
  for (auto& a : bad) argv.push_back(a.data());
  auto r = ParseServerOptions(static_cast<int>(argv.size()), argv.data(), &help);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

// --http-listen (CLI.md): default 127.0.0.1:8080 (not "given", so a taken default only warns),
// "off", from the config file, and the same loopback/TLS rule as --listen.
TEST(Options, HttpListen) {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "traind");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    bool help = false;
    return ParseServerOptions(static_cast<int>(argv.size()), argv.data(), &help);
  };
  auto d = parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->http_listen, "127.0.0.1:8080");
  EXPECT_FALSE(d->http_listen_given);
  auto off = parse({"--http-listen", "off"});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->http_listen, "off");
  auto given = parse({"--http-listen", "127.0.0.1:0"});
  ASSERT_TRUE(given.ok());
  EXPECT_TRUE(given->http_listen_given);
  const std::string dir = traind::testing::MakeTempDir("traind-options-http");
  traind::testing::WriteAll(dir + "/c.yaml", "http_listen: 127.0.0.1:9999\n");
  auto cfg = parse({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->http_listen, "127.0.0.1:9999");
  EXPECT_TRUE(cfg->http_listen_given);
  auto remote = parse({"--http-listen", "0.0.0.0:8080"});
  EXPECT_EQ(remote.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(remote.status().message().find("non-loopback"), std::string::npos);
  auto remote_ok = parse({"--http-listen", "0.0.0.0:8080", "--allow-insecure-remote"});
  EXPECT_TRUE(remote_ok.ok());
  std::filesystem::remove_all(dir);
}

TEST(TokenAuth, CreatesTokenFile0600AndChecksTokens) {
  const std::string dir = traind::testing::MakeTempDir("traind-auth");
  traind::testing::WriteAll(dir + "/users", "carol c-token\n\n# comment\n");
  auto auth = TokenAuth::Load(dir, dir + "/users");
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string local = traind::testing::ReadAll(dir + "/token");
  local.pop_back();
  EXPECT_EQ(*auth->Authenticate("Bearer " + local), "local");
  EXPECT_EQ(*auth->Authenticate("Bearer c-token"), "carol");
  EXPECT_EQ(auth->Authenticate("Bearer nope").status().code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(auth->Authenticate("").status().code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(auth->Authenticate("Basic c-token").status().code(), Status::Code::kUnauthenticated);
  // The same token comes back at the next start.
  auto again = TokenAuth::Load(dir, "");
  EXPECT_EQ(*again->Authenticate("Bearer " + local), "local");
  traind::testing::WriteAll(dir + "/broken", "just-one-word\n");
  EXPECT_EQ(TokenAuth::Load(dir, dir + "/broken").status().code(), Status::Code::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(JobStore, RoundTripEventsAndCorruption) {
  const std::string dir = traind::testing::MakeTempDir("traind-store");
  {
    auto store = JobStore::Open(dir + "/db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    v1::Job job;
    job.set_id("job-000001");
    job.set_owner("local");
    for (int64_t seq = 1; seq <= 5; ++seq) {
      v1::JobEvent ev;
      ev.set_sequence(seq);
      ev.set_message("event " + std::to_string(seq));
      job.set_last_sequence(seq);
      ASSERT_TRUE((*store)->Write(job, &ev, seq == 1, seq == 1 ? 1 : 0).ok());
    }
    auto events = (*store)->ReadEvents("job-000001", 3, 0);
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), 3u);
    EXPECT_EQ((*events)[0].message(), "event 3");
    EXPECT_EQ((*(*store)->ReadEvents("job-000001", 1, 2)).size(), 2u);
    EXPECT_TRUE((*(*store)->ReadEvents("job-000002", 1, 0)).empty());
    EXPECT_EQ(*(*store)->LastSubmitOrder(), 1);
    auto jobs = (*store)->LoadJobs();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].last_sequence(), 5);
  }
  {
    // A record that does not parse is DATA_LOSS at open, not a crash (store_repair_test: the
    // daemon's message and `traind --repair-store`).
    rocksdb::DB* raw = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir + "/db", &raw).ok());
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), "job/job-000009", std::string("\xff\xff\xff", 3)).ok());
    delete raw;
    auto store = JobStore::Open(dir + "/db");
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), Status::Code::kDataLoss);
    EXPECT_THAT(store.status().message(), ::testing::HasSubstr("job/job-000009 does not parse"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace traind::server
