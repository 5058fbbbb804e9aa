// What the crash test's child writes: 12 chunks, some rewritten every step and some only on some
// steps (so a committed step mixes chunk versions of different ages).
#pragma once

#include "offload_test_util.h"
#include "traind/offload/offload.h"

namespace traind::offload::testing {

constexpr size_t kCrashChunkBytes = 96 << 10;

inline StoreOptions CrashStoreOptions() {
  StoreOptions o;
  o.write_buffer_bytes = 1 << 20;  // several flushes per step: kills land inside flushes too
  o.blob_file_bytes = 1 << 20;
  o.max_pending_write_bytes = 512 << 10;
  return o;
}

// The store under test by name: "rocksdb" (MakeRocksDbStore), "valuelog" (MakeValueLogStore) or
// "valuelog_direct" (the same with 1 MiB chunks: O_DIRECT-sized slots, a segment file per slot).
inline Result<std::unique_ptr<engine::OptimizerStateStore>> OpenCrashStore(const std::string& kind,
                                                                          const std::string& dir) {
  if (kind == "valuelog" || kind == "valuelog_direct") return MakeValueLogStore(dir, CrashStoreOptions());
  if (kind == "rocksdb") return MakeRocksDbStore(dir, CrashStoreOptions());
  return Status::InvalidArgument("unknown store kind " + kind);
}

inline size_t CrashChunkBytes(const std::string& kind) {
  return kind == "valuelog_direct" ? size_t{1} << 20 : kCrashChunkBytes;
}

inline std::vector<engine::StateKey> CrashKeys() {
  std::vector<engine::StateKey> keys;
  for (int c = 0; c < 4; ++c)
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) keys.push_back({"g0", c, kind});
  return keys;
}

// exp_avg_sq chunk c is written only on steps where (step + c) % 3 == 0; step 0 writes everything.
inline bool WrittenAt(const engine::StateKey& key, int64_t step) {
  return step == 0 || key.kind != "exp_avg_sq" || (step + key.chunk) % 3 == 0;
}

// The step whose data `key` holds once `step` is committed.
inline int64_t LastWrite(const engine::StateKey& key, int64_t step) {
  while (!WrittenAt(key, step)) --step;
  return step;
}

}  // namespace traind::offload::testing
