// offload_inspect: prints what an nvme offload store holds (offload/README.md "Inspect"), either
// layout, opening its RocksDB database read-only (safe beside a running job):
//   offload_inspect DIR [--verify]
// The RocksDB store (a database in DIR): the commit record, every chunk version in the index
// (committed, replaced-not-yet-deleted, or left by an uncommitted step), the files on disk. The
// value-log store (DIR/index and DIR/seg-*.vlog): the commit record, every chunk's index record
// (its committed slot: segment file and offset), the files. --verify reads every committed chunk
// and checks its CRC32C. Exit status 0, or 1 when anything is damaged.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crc32c.h"
#include "format.h"
#include "value_log_format.h"

using namespace traind::offload;  // NOLINT: a tool

namespace {

// The commit record of `db`; prints it, returns false when it is damaged.
bool PrintCommit(rocksdb::DB* db, uint64_t* epoch, int64_t* step) {
  std::string v;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), kCommitKey, &v);
  if (s.ok() && DecodeCommit(v, epoch, step)) {
    std::printf("commit record: step %lld, epoch %llu\n", static_cast<long long>(*step),
                static_cast<unsigned long long>(*epoch));
    return true;
  }
  if (s.IsNotFound()) {
    std::printf("commit record: none (empty store, CommittedStep() == -1)\n");
    return true;
  }
  std::printf("commit record: DAMAGED (%s)\n", s.ok() ? "undecodable" : s.ToString().c_str());
  return false;
}

uint64_t PrintFiles(const std::string& dir, const std::string& prefix) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_directory(ec)) {
      total += PrintFiles(e.path().string(), prefix + e.path().filename().string() + "/");
      continue;
    }
    if (!e.is_regular_file(ec)) continue;
    total += e.file_size(ec);
    std::printf("  %-24s %12llu\n", (prefix + e.path().filename().string()).c_str(),
                static_cast<unsigned long long>(e.file_size(ec)));
  }
  return total;
}

// The value-log layout: index records in dir/index, payloads in dir/seg-*.vlog.
int InspectValueLog(const std::string& dir, bool verify) {
  rocksdb::Options options;
  options.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir + "/index", &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "offload_inspect: %s/index: %s\n", dir.c_str(), s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  std::printf("layout: value log (index in %s/index, payloads in seg-*.vlog)\n", dir.c_str());
  int bad = 0;
  uint64_t epoch = 0;
  int64_t step = -1;
  if (!PrintCommit(db.get(), &epoch, &step)) ++bad;
  std::printf("%-40s %12s %5s %-16s %12s %10s\n", "chunk (group/chunk/kind)", "bytes", "slot",
              "segment", "offset", "crc32c");
  size_t chunks = 0, checked = 0;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("i"); it->Valid() && it->key().starts_with("i"); it->Next()) {
    traind::engine::StateKey key;
    uint64_t unused_epoch = 0;
    Entry e;
    if (!ParseRecordKey(it->key().ToStringView(), &key, &unused_epoch) ||
        !DecodeEntry(it->value().ToStringView(), &e)) {
      std::printf("DAMAGED index record\n");
      ++bad;
      continue;
    }
    ++chunks;
    const Loc loc = e.slot[e.current];
    const std::string segment = SegmentName(loc.file);
    std::printf("%-40s %12llu %5s %-16s %12llu   %08x\n", key.ToString().c_str(),
                static_cast<unsigned long long>(e.bytes), e.current ? "B" : "A", segment.c_str(),
                static_cast<unsigned long long>(loc.offset), e.crc);
    if (!verify) continue;
    const std::string path = dir + "/" + segment;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<char> buf(e.bytes);
    size_t done = 0;
    while (fd >= 0 && done < buf.size()) {
      const ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(loc.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (fd >= 0) ::close(fd);
    const std::string id = KeyId(key);
    if (fd < 0 || done < buf.size()) {
      std::printf("verify: %s: %s at offset %llu cannot be read (%s)\n", key.ToString().c_str(),
                  path.c_str(), static_cast<unsigned long long>(loc.offset),
                  fd < 0 ? std::strerror(errno) : "the file ends early");
      ++bad;
    } else if (Crc32c(Crc32c(0, id.data(), id.size()), buf.data(), buf.size()) != e.crc) {
      std::printf("verify: %s: crc32c mismatch in %s at offset %llu\n", key.ToString().c_str(),
                  path.c_str(), static_cast<unsigned long long>(loc.offset));
      ++bad;
    }
    ++checked;
  }
  if (!it->status().ok()) {
    std::printf("index scan: %s\n", it->status().ToString().c_str());
    ++bad;
  }
  std::printf("%zu committed chunks\n", chunks);
  if (verify) std::printf("verify: %zu committed chunks read, %d damaged\n", checked, bad);
  std::printf("files:\n");
  const uint64_t total = PrintFiles(dir, "");
  std::printf("  %-24s %12llu bytes\n", "total", static_cast<unsigned long long>(total));
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--verify")) {
    std::fprintf(stderr, "usage: offload_inspect DIR [--verify]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const bool verify = argc == 3;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/index/CURRENT", ec)) return InspectValueLog(dir, verify);
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
  uint64_t epoch = 0;
  int64_t step = -1;
  std::printf("layout: RocksDB store\n");
  if (!PrintCommit(db.get(), &epoch, &step)) ++bad;
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
  std::printf("files:\n");
  const uint64_t total = PrintFiles(dir, "");
  std::printf("  %-24s %12llu bytes\n", "total", static_cast<unsigned long long>(total));
  return bad ? 1 : 0;
}
