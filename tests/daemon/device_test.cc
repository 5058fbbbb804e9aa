// traind and its device: `--device cuda:0` on a machine without a GPU stops traind at start with
// one clear sentence (exit 2); the device probe runs in traind-job-runner, never in traind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

using ::testing::HasSubstr;

TEST(TraindDevice, CudaWithoutGpuIsAClearStartupError) {
  const std::string dir = MakeTempDir("traind-device");
  // The probe tells whether this machine has a GPU; this test is about machines without one.
  const std::string runner = std::string(TRAIND_BIN) + "-job-runner";
  CmdResult probe = RunCommand({runner, "query-device", "cuda:0"});
  if (probe.exit_code == 0) GTEST_SKIP() << "this machine has a CUDA device: " << probe.out;
  ASSERT_EQ(probe.exit_code, 2) << probe.out << probe.err;
  auto j = nlohmann::json::parse(probe.out);
  EXPECT_THAT(j.value("error", ""), HasSubstr("cuda:0"));

  CmdResult r = RunCommand({TRAIND_BIN, "--device", "cuda:0", "--state-dir", dir + "/state",
                            "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"},
                           30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--device cuda:0"));
  EXPECT_THAT(r.err, HasSubstr("no CUDA device"));
}

TEST(TraindDevice, ProbeDescribesTheCpuAndRejectsUnknownNames) {
  const std::string runner = std::string(TRAIND_BIN) + "-job-runner";
  CmdResult cpu = RunCommand({runner, "query-device", "cpu"});
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  auto j = nlohmann::json::parse(cpu.out);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_GT(j["total_bytes"].get<int64_t>(), 0);
  CmdResult bad = RunCommand({runner, "query-device", "tpu:0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(nlohmann::json::parse(bad.out).value("code", ""), "INVALID_ARGUMENT");
}

}  // namespace
}  // namespace traind::testing
