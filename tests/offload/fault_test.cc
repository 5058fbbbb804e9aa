// Faults of the nvme stores (RocksDB and value log): missing, unwritable and read-only directories,
// a disk that fills up in the middle of a step, a damaged blob or segment file. Errors must name
// the directory (or key) and keep the last committed step intact; damaged data must never be
// returned as data.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "offload_test_util.h"
#include "traind/offload/offload.h"

namespace traind::offload {
namespace {

namespace fs = std::filesystem;
using engine::StateKey;
using testing::ChunkData;
using testing::TempDir;

std::vector<StateKey> Keys(int n, const std::string& kind = "master") {
  std::vector<StateKey> keys;
  for (int c = 0; c < n; ++c) keys.push_back({"g0", c, kind});
  return keys;
}

Status WriteStep(engine::OptimizerStateStore& s, int64_t step, const std::vector<StateKey>& keys, size_t bytes) {
  for (const auto& k : keys) {
    auto d = ChunkData(k, step, bytes);
    TRAIND_RETURN_IF_ERROR(s.Write(k, d.data(), d.size()));
  }
  return s.Commit(step);
}

// Writes tmp/filler until about `left` bytes of the file system under `tmp` stay free (the operator
// frees space by removing it).
void FillLeaving(TempDir& tmp, uint64_t left) {
  const auto space = fs::space(tmp.path());
  const uint64_t fill = space.available > left ? space.available - left : 0;
  std::ofstream filler(tmp.Sub("filler"), std::ios::binary);
  std::vector<char> ones(1 << 20, 1);
  for (uint64_t done = 0; done < fill; done += ones.size())
    filler.write(ones.data(), static_cast<std::streamsize>(std::min<uint64_t>(ones.size(), fill - done)));
}

void ExpectStep(engine::OptimizerStateStore& s, int64_t step, const std::vector<StateKey>& keys, size_t bytes) {
  std::vector<char> got(bytes);
  for (const auto& k : keys) {
    Status st = s.Read(k, got.data(), bytes);
    ASSERT_TRUE(st.ok()) << k.ToString() << ": " << st.ToString();
    ASSERT_TRUE(got == ChunkData(k, step, bytes)) << k.ToString();
  }
}

// The tests below run on both nvme stores (parameter "rocksdb": MakeRocksDbStore, "valuelog":
// MakeValueLogStore).
class StoreFaultTest : public ::testing::TestWithParam<std::string> {
 protected:
  static Result<std::unique_ptr<engine::OptimizerStateStore>> Open(const std::string& dir,
                                                                  const StoreOptions& o = {}) {
    return GetParam() == "valuelog" ? MakeValueLogStore(dir, o) : MakeRocksDbStore(dir, o);
  }
};

TEST_P(StoreFaultTest, MissingDirectories) {
  TempDir tmp;
  auto r = Open(tmp.Sub("no/such/parent"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find(tmp.Sub("no/such/parent")), std::string::npos) << r.status().message();
  StoreOptions o;
  o.create_if_missing = false;
  r = Open(tmp.Sub("missing"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_FALSE(fs::exists(tmp.Sub("missing")));
}

// Unwritable paths that stay unwritable for root too: a regular file where the directory should
// be, and a directory below a regular file (ENOTDIR).
TEST_P(StoreFaultTest, PathsThatCannotBeDirectories) {
  TempDir tmp;
  std::ofstream(tmp.Sub("file")) << "x";
  auto r = Open(tmp.Sub("file"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().message();
  r = Open(tmp.Sub("file/store"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(tmp.Sub("file/store")), std::string::npos) << r.status().message();
}

TEST_P(StoreFaultTest, SecondOpenOfTheSameDirectoryIsRefused) {
  TempDir tmp;
  auto a = Open(tmp.Sub("store"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Open(tmp.Sub("store"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Status::Code::kFailedPrecondition) << b.status().ToString();
}

// Root ignores mode bits, so chmod alone proves nothing here: the directory is a tmpfs remounted
// read-only (root or CAP_SYS_ADMIN). As a non-root user chmod 0555 is used instead.
TEST_P(StoreFaultTest, ReadOnlyDirectory) {
  TempDir tmp;
  const bool root = ::geteuid() == 0;
  if (root && !tmp.MountTmpfs(16 << 20)) {
    GTEST_SKIP() << "running as root without mount permission (" << std::strerror(errno)
                 << "): root bypasses chmod, so no read-only directory can be made here";
  }
  const std::string dir = tmp.Sub("store");
  const auto keys = Keys(4);
  {
    auto s = Open(dir);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(WriteStep(**s, 0, keys, 8192).ok());
  }
  if (root) {
    ASSERT_TRUE(tmp.RemountReadOnly()) << std::strerror(errno);
  } else {
    ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  }
  auto r = Open(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(dir), std::string::npos) << r.status().message();
  if (root) {
    EXPECT_NE(r.status().message().find("read-only"), std::string::npos) << r.status().message();
  }
  std::printf("[ ro ] %s\n", r.status().ToString().c_str());
  if (!root) ::chmod(dir.c_str(), 0755);
}

// A 40 MiB tmpfs: step 0 (2 MiB) commits, a filler file leaves about 14 MiB free, step 1 (16 MiB)
// runs out of room part way. The error is RESOURCE_EXHAUSTED naming the directory (the store checks
// free space before RocksDB would hit ENOSPC: offload/README.md "Errors"); step 0 stays readable;
// once the filler is removed (the operator frees space) a reopen finds step 0 and step 1 commits.
TEST_P(StoreFaultTest, DiskFullMidStep) {
  TempDir tmp;
  if (!tmp.MountTmpfs(40 << 20)) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN): the disk-full path is not exercised";
  }
  const std::string dir = tmp.Sub("store");
  StoreOptions o;
  o.write_buffer_bytes = 2 << 20;
  o.blob_file_bytes = 2 << 20;
  o.max_pending_write_bytes = 1 << 20;
  const auto keys0 = Keys(8);
  const size_t bytes = 256 << 10;
  auto s = Open(dir, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(WriteStep(**s, 0, keys0, bytes).ok());
  FillLeaving(tmp, 14 << 20);
  const auto keys1 = Keys(64);  // 16 MiB
  Status st;
  int written = 0;
  for (const auto& k : keys1) {
    auto d = ChunkData(k, 1, bytes);
    st = (*s)->Write(k, d.data(), d.size());
    if (!st.ok()) break;
    ++written;
  }
  if (st.ok()) st = (*s)->Commit(1);
  ASSERT_FALSE(st.ok()) << "16 MiB fit into about 14 MiB of free space?";
  EXPECT_GT(written, 0) << "the disk was full before the step began, not in the middle of it";
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
  std::printf("[ full ] %s\n", st.ToString().c_str());
  EXPECT_EQ((*s)->CommittedStep(), 0);
  ExpectStep(**s, 0, keys0, bytes);
  EXPECT_FALSE((*s)->Commit(1).ok()) << "a failed store must keep failing until reopened";
  s = Status::Internal("closed");
  fs::remove(tmp.Sub("filler"));
  auto again = Open(dir, o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->CommittedStep(), 0);
  ExpectStep(**again, 0, keys0, bytes);
  ASSERT_TRUE(WriteStep(**again, 1, Keys(16), bytes).ok());
  ExpectStep(**again, 1, Keys(16), bytes);
}

// The disk fills between a step's writes and its commit, and the commit runs in the background
// (CommitInBackground, as the optimizer does it): AwaitCommit reports RESOURCE_EXHAUSTED naming the
// directory, step 0 stays the committed step and readable, nothing of step 1 becomes visible.
TEST_P(StoreFaultTest, DiskFullDuringABackgroundCommit) {
  TempDir tmp;
  if (!tmp.MountTmpfs(40 << 20)) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN): the disk-full path is not exercised";
  }
  const std::string dir = tmp.Sub("store");
  StoreOptions o;
  o.write_buffer_bytes = 8 << 20;
  o.blob_file_bytes = 2 << 20;
  o.max_pending_write_bytes = 1 << 20;
  const auto keys = Keys(8);
  const size_t bytes = 256 << 10;
  auto s = Open(dir, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(WriteStep(**s, 0, keys, bytes).ok());
  for (const auto& k : keys) {  // step 1's data: in the memtable, not flushed yet
    auto d = ChunkData(k, 1, bytes);
    ASSERT_TRUE((*s)->Write(k, d.data(), d.size()).ok());
  }
  FillLeaving(tmp, 4 << 20);  // less than the commit's flush needs with its margin
  (*s)->CommitInBackground(1, keys);
  const Status st = (*s)->AwaitCommit();
  ASSERT_FALSE(st.ok()) << "the commit fit into 4 MiB with its 8 MiB margin?";
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find(dir), std::string::npos) << st.message();
  std::printf("[ full, background commit ] %s\n", st.ToString().c_str());
  EXPECT_EQ((*s)->CommittedStep(), 0);
  ExpectStep(**s, 0, keys, bytes);
  EXPECT_FALSE((*s)->Commit(1).ok()) << "a failed store must keep failing until reopened";
  s = Status::Internal("closed");
  fs::remove(tmp.Sub("filler"));
  auto again = Open(dir, o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->CommittedStep(), 0);
  ExpectStep(**again, 0, keys, bytes);
}

// Bytes overwritten in the middle of a blob file: every read of a damaged chunk is DATA_LOSS naming
// the key, undamaged chunks still read back exactly, nothing wrong is ever returned as data.
TEST(FaultTest, DamagedBlobFileIsDataLossNeverWrongData) {
  TempDir tmp;
  const std::string dir = tmp.Sub("store");
  const auto keys = Keys(8);
  const size_t bytes = 64 << 10;
  {
    auto s = MakeRocksDbStore(dir);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(WriteStep(**s, 0, keys, bytes).ok());
  }
  std::string blob;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".blob") blob = e.path().string();
  ASSERT_FALSE(blob.empty()) << "no .blob file in " << dir;
  const auto size = fs::file_size(blob);
  ASSERT_GT(size, keys.size() * bytes);
  {
    const int fd = ::open(blob.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    std::vector<char> junk(4096, '\x5a');
    ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(size / 2)), 4096);
    // And 64 bytes well inside an earlier record's payload: only a payload checksum sees that.
    ASSERT_EQ(::pwrite(fd, junk.data(), 64, static_cast<off_t>(size / 4 + 20000)), 64);
    ::close(fd);
  }
  auto s = MakeRocksDbStore(dir);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  int damaged = 0, intact = 0, crc_mismatches = 0;
  std::vector<char> got(bytes);
  for (const auto& k : keys) {
    std::fill(got.begin(), got.end(), 0);
    Status st = (*s)->Read(k, got.data(), bytes);
    if (st.ok()) {
      ASSERT_TRUE(got == ChunkData(k, 0, bytes)) << k.ToString() << ": wrong data returned as OK";
      ++intact;
    } else {
      EXPECT_EQ(st.code(), Status::Code::kDataLoss) << st.ToString();
      EXPECT_NE(st.message().find(k.ToString()), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(blob), std::string::npos) << "names the damaged file: " << st.message();
      std::printf("[ damaged ] %s\n", st.ToString().c_str());
      if (st.message().find("crc32c mismatch") != std::string::npos) ++crc_mismatches;
      ++damaged;
    }
  }
  EXPECT_GE(damaged, 2);
  EXPECT_GE(crc_mismatches, 1) << "the payload damage was not caught by the chunk checksum";
  EXPECT_GE(intact, 1);
}

// The value-log store's segment file damaged in the committed slots of two chunks (64 bytes inside
// one payload, a 4 KiB block of another) and in the spare slot of a third: the two reads are
// DATA_LOSS naming the key and the segment file, never wrong data; everything else reads back exactly.
TEST(FaultTest, DamagedSegmentFileIsDataLossNeverWrongData) {
  TempDir tmp;
  const std::string dir = tmp.Sub("store");
  const auto keys = Keys(8);
  const size_t bytes = 64 << 10;
  {
    auto s = MakeValueLogStore(dir);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(WriteStep(**s, 0, keys, bytes).ok());
  }
  std::string seg;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".vlog") seg = e.path().string();
  ASSERT_FALSE(seg.empty()) << "no .vlog segment file in " << dir;
  // Slots are allocated in Write order, A then B, each 64 KiB: chunk i's committed slot A is at
  // i * 128 KiB (offload/README.md "The value-log store").
  ASSERT_EQ(fs::file_size(seg), keys.size() * 2 * bytes);
  {
    const int fd = ::open(seg.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    std::vector<char> junk(4096, '\x5a');
    ASSERT_EQ(::pwrite(fd, junk.data(), 64, static_cast<off_t>(2 * 2 * bytes + 20000)), 64);
    ASSERT_EQ(::pwrite(fd, junk.data(), 4096, static_cast<off_t>(5 * 2 * bytes + 8192)), 4096);
    ASSERT_EQ(::pwrite(fd, junk.data(), 4096, static_cast<off_t>(6 * 2 * bytes + bytes)), 4096);  // slot B
    ::close(fd);
  }
  auto s = MakeValueLogStore(dir);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<char> got(bytes);
  for (const auto& k : keys) {
    for (int pass = 0; pass < 2; ++pass) {  // a plain read, then one served by a read-ahead
      std::fill(got.begin(), got.end(), 0);
      if (pass == 1) (*s)->Prefetch(k);
      Status st = (*s)->Read(k, got.data(), bytes);
      if (k.chunk == 2 || k.chunk == 5) {
        ASSERT_FALSE(st.ok()) << k.ToString() << ": damaged data returned as OK";
        EXPECT_EQ(st.code(), Status::Code::kDataLoss) << st.ToString();
        EXPECT_NE(st.message().find(k.ToString()), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(seg), std::string::npos) << "names the damaged file: " << st.message();
        EXPECT_NE(st.message().find("crc32c mismatch"), std::string::npos) << st.message();
        if (pass == 0) std::printf("[ damaged ] %s\n", st.ToString().c_str());
      } else {
        ASSERT_TRUE(st.ok()) << k.ToString() << ": " << st.ToString();
        ASSERT_TRUE(got == ChunkData(k, 0, bytes)) << k.ToString() << ": wrong data returned as OK";
      }
    }
  }
}

// A segment file the index refers to is gone: the open fails with DATA_LOSS naming it.
TEST(FaultTest, MissingSegmentFileIsDataLoss) {
  TempDir tmp;
  const std::string dir = tmp.Sub("store");
  {
    auto s = MakeValueLogStore(dir);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(WriteStep(**s, 0, Keys(2), 4096).ok());
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".vlog") fs::remove(e.path());
  auto s = MakeValueLogStore(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kDataLoss) << s.status().ToString();
  EXPECT_NE(s.status().message().find("seg-000001.vlog"), std::string::npos) << s.status().message();
}

// A file system that refuses O_DIRECT (ramfs: EINVAL on open; this kernel's tmpfs allows it): the
// value-log store says so once on stderr and works with buffered I/O, large (direct-size) and
// small chunks, across a reopen.
TEST(FaultTest, ValueLogFallsBackToBufferedIoWhereODirectIsRefused) {
  TempDir tmp;
  const std::string mnt = tmp.Sub("ramfs");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("ramfs", mnt.c_str(), "ramfs", 0, "mode=0755") != 0) {
    GTEST_SKIP() << "cannot mount a ramfs here (" << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN): the buffered fallback is not exercised";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string dir = mnt + "/store";
  const auto big = Keys(3, "master");     // 2 MiB: O_DIRECT-sized slots
  const auto small = Keys(3, "exp_avg");  // 8 KiB: buffered anyway
  ::testing::internal::CaptureStderr();
  {
    auto s = MakeValueLogStore(dir);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (const auto& k : small) {
      auto d = ChunkData(k, 0, 8192);
      Status st = (*s)->Write(k, d.data(), d.size());
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    ASSERT_TRUE(WriteStep(**s, 0, big, 2 << 20).ok());
    ASSERT_TRUE(WriteStep(**s, 1, big, 2 << 20).ok());
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("O_DIRECT refused"), std::string::npos) << log;
  EXPECT_NE(log.find(dir), std::string::npos) << log;
  std::printf("[ fallback ] %s", log.c_str());
  auto s = MakeValueLogStore(dir);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->CommittedStep(), 1);
  ExpectStep(**s, 1, big, 2 << 20);
  ExpectStep(**s, 0, small, 8192);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreFaultTest, ::testing::Values("rocksdb", "valuelog"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace traind::offload
