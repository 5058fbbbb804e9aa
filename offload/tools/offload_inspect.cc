// offload_inspect: prints what an nvme offload store holds (offload/README.md "Inspect"), opening
// the RocksDB database read-only (safe beside a running job):
//   offload_inspect DIR [--verify]
// The commit record, every chunk version in the index (committed, replaced-not-yet-deleted, or
// left by an uncommitted step), the files on disk; --verify reads every committed chunk and
// checks its CRC32C. Exit status 0, or 1 when anything is damaged.
#include <rocksdb/db.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format.h"

using namespace traind::offload;  // NOLINT: a tool

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--verify")) {
    std::fprintf(stderr, "usage: offload_inspect DIR [--verify]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const bool verify = argc == 3;
  rocksdb::Options options;
  options.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "offload_inspect: %s: %s\n", dir.c_str(), s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  int bad = 0;
  std::string v;
  uint64_t epoch = 0;
  int64_t step = -1;
  s = db->Get(rocksdb::ReadOptions(), kCommitKey, &v);
  if (s.ok() && DecodeCommit(v, &epoch, &step)) {
    std::printf("commit record: step %lld, epoch %llu\n", static_cast<long long>(step),
                static_cast<unsigned long long>(epoch));
  } else if (s.IsNotFound()) {
    std::printf("commit record: none (empty store, CommittedStep() == -1)\n");
  } else {
    std::printf("commit record: DAMAGED (%s)\n", s.ToString().c_str());
    ++bad;
  }
  // Newest version <= epoch per key is the committed one.
  std::map<traind::engine::StateKey, uint64_t> committed;
  struct Row {
    traind::engine::StateKey key;
    uint64_t epoch, bytes;
    uint32_t crc;
  };
  std::vector<Row> rows;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  std::printf("%-40s %8s %12s %10s  %s\n", "chunk (group/chunk/kind)", "epoch", "bytes", "crc32c", "state");
  for (it->Seek("i"); it->Valid() && it->key().starts_with("i"); it->Next()) {
    traind::engine::StateKey key;
    uint64_t e = 0, bytes = 0;
    uint32_t crc = 0;
    if (!ParseRecordKey(it->key().ToStringView(), &key, &e) || !DecodeIndexValue(it->value().ToStringView(), &bytes, &crc)) {
      std::printf("DAMAGED index record\n");
      ++bad;
      continue;
    }
    if (e <= epoch) committed[key] = e;
    rows.push_back({key, e, bytes, crc});
  }
  for (const auto& r : rows) {
    const char* state = r.epoch > epoch                ? "uncommitted (removed on open)"
                        : committed[r.key] != r.epoch ? "replaced (removed on open)"
                                                      : "committed";
    std::printf("%-40s %8llu %12llu   %08x  %s\n", r.key.ToString().c_str(),
                static_cast<unsigned long long>(r.epoch), static_cast<unsigned long long>(r.bytes), r.crc, state);
  }
  if (!it->status().ok()) {
    std::printf("index scan: %s\n", it->status().ToString().c_str());
    ++bad;
  }
  if (verify) {
    for (const auto& [key, e] : committed) {
      rocksdb::PinnableSlice value;
      s = db->Get(rocksdb::ReadOptions(), db->DefaultColumnFamily(), DataKey(key, e), &value);
      std::string idx;
      uint64_t bytes = 0;
      uint32_t crc = 0;
      db->Get(rocksdb::ReadOptions(), IndexKey(key, e), &idx);
      DecodeIndexValue(idx, &bytes, &crc);
      traind::Status st = s.ok() ? CheckValue(KeyId(key), value.ToStringView(), bytes, key.ToString())
                                 : traind::Status::DataLoss(key.ToString() + ": " + s.ToString());
      if (!st.ok()) {
        std::printf("verify: %s\n", st.ToString().c_str());
        ++bad;
      }
    }
    std::printf("verify: %zu committed chunks read, %d damaged\n", committed.size(), bad);
  }
  uint64_t total = 0;
  std::printf("files:\n");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    total += e.file_size();
    std::printf("  %-24s %12llu\n", e.path().filename().c_str(), static_cast<unsigned long long>(e.file_size()));
  }
  std::printf("  %-24s %12llu bytes\n", "total", static_cast<unsigned long long>(total));
  return bad ? 1 : 0;
}
