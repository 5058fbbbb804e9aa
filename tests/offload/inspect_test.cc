// offload_inspect (offload/README.md "Inspect") on both nvme layouts: it names the layout and the
// committed step, lists every committed chunk, and with --verify reads each one back and checks its
// CRC32C: exit 0 for a sound store, 1 and the damaged chunk named when a data file is damaged.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "offload_test_util.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

namespace fs = std::filesystem;
using engine::StateKey;
using testing::ChunkData;
using testing::TempDir;

struct ToolRun {
  int code = -1;
  std::string out;
};

ToolRun Inspect(const std::string& dir) {
  ToolRun r;
  const std::string cmd = std::string(OFFLOAD_INSPECT) + " " + dir + " --verify 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) r.out += buf;
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Two committed steps of three chunks, then the store closed.
void WriteTwoSteps(engine::OptimizerStateStore& s, const std::vector<StateKey>& keys) {
  for (int64_t step = 0; step < 2; ++step) {
    for (const StateKey& k : keys) {
      auto d = ChunkData(k, step, 16 << 10);
      ASSERT_TRUE(s.Write(k, d.data(), d.size()).ok());
    }
    ASSERT_TRUE(s.Commit(step).ok());
  }
}

// Overwrites bytes in place in every file of `dir` whose name ends with `ext`.
int DamageFiles(const std::string& dir, const std::string& ext) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ext) continue;
    const auto size = static_cast<std::streamoff>(fs::file_size(e.path()));
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (std::streamoff at = 64; at < size; at += 97) {
      f.seekp(at);
      f.put(static_cast<char>(0xA5));
    }
    ++n;
  }
  return n;
}

class InspectTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InspectTest, NamesTheStepVerifiesEveryChunkAndFindsDamage) {
  TempDir tmp;
  const std::string dir = tmp.Sub("store");
  const std::vector<StateKey> keys = {{"0 wte", 0, "exp_avg"}, {"0 wte", 0, "exp_avg_sq"}, {"1 h.0", 3, "state"}};
  {
    auto s = MakeNvmeStore(dir, GetParam());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    WriteTwoSteps(**s, keys);
  }
  const ToolRun sound = Inspect(dir);
  std::printf("%s", sound.out.c_str());
  EXPECT_EQ(sound.code, 0) << sound.out;
  EXPECT_NE(sound.out.find(GetParam() == "rocksdb" ? "layout: RocksDB store" : "layout: value log"),
            std::string::npos) << sound.out;
  EXPECT_NE(sound.out.find("commit record: step 1,"), std::string::npos) << sound.out;
  for (const StateKey& k : keys) EXPECT_NE(sound.out.find(k.ToString()), std::string::npos) << k.ToString();
  EXPECT_NE(sound.out.find("verify: 3 committed chunks read, 0 damaged"), std::string::npos) << sound.out;

  ASSERT_GT(DamageFiles(dir, GetParam() == "rocksdb" ? ".blob" : ".vlog"), 0) << "no data files";
  const ToolRun damaged = Inspect(dir);
  EXPECT_EQ(damaged.code, 1) << damaged.out;
  // The value log checks the CRC32C itself; RocksDB finds a damaged blob file first (its footer).
  EXPECT_TRUE(damaged.out.find("crc32c mismatch") != std::string::npos ||
              damaged.out.find("verify: DATA_LOSS") != std::string::npos) << damaged.out;
  EXPECT_EQ(damaged.out.find(", 0 damaged"), std::string::npos) << damaged.out;
}

INSTANTIATE_TEST_SUITE_P(Stores, InspectTest, ::testing::Values("rocksdb", "valuelog"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace traind::offload
