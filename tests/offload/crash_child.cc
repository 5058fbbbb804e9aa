// The crash test's child process: opens the nvme store in argv[1] (argv[2]: "rocksdb", the
// default, "valuelog" or "valuelog_direct": crash_workload.h), then writes and commits steps
// CommittedStep()+1, +2, ... until it is killed, printing "committed <step>" after each Commit
// returns. Which chunks a step writes follows crash_workload.h, so the parent can recompute the
// expected contents of every chunk at any committed step.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crash_workload.h"
#include "traind/offload/offload.h"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: offload_crash_child DIR [rocksdb|valuelog|valuelog_direct]\n");
    return 2;
  }
  const std::string kind = argc == 3 ? argv[2] : "rocksdb";
  const size_t bytes = traind::offload::testing::CrashChunkBytes(kind);
  auto store = traind::offload::testing::OpenCrashStore(kind, argv[1]);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  for (int64_t step = (*store)->CommittedStep() + 1;; ++step) {
    for (const auto& key : traind::offload::testing::CrashKeys()) {
      if (!traind::offload::testing::WrittenAt(key, step)) continue;
      const auto data = traind::offload::testing::ChunkData(key, step, bytes);
      traind::Status st = (*store)->Write(key, data.data(), data.size());
      if (!st.ok()) {
        std::fprintf(stderr, "write: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    traind::Status st = (*store)->Commit(step);
    if (!st.ok()) {
      std::fprintf(stderr, "commit: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("committed %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}
