// Unit tests of offload's small pieces: CRC32C (RFC 3720 vectors, both code paths), the record
// encodings, and the one RocksDB → traind status mapping.
#include <gtest/gtest.h>

#include <random>

#include "crc32c.h"
#include "format.h"
#include "rocksdb_status.h"

namespace traind::offload {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(0, zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(0, ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(0, inc.data(), 32), 0x46DD794Eu);
}

TEST(Crc32cTest, HardwareMatchesTableAndExtends) {
  std::mt19937 rng(1);
  std::vector<char> data(400003);
  for (auto& c : data) c = static_cast<char>(rng());
  // Around the hardware path's three-lane blocks (3 x 32 KiB: 98304 bytes) and several of them.
  for (size_t n : {0, 1, 7, 8, 9, 63, 4096, 98303, 98304, 98305, 100003, 196608, 300007, 400003}) {
    EXPECT_EQ(Crc32c(0, data.data(), n), Crc32cPortable(0, data.data(), n)) << n;
    for (size_t split : {n / 2, n / 3 + 5, size_t{1}}) {
      if (split > n) continue;
      EXPECT_EQ(Crc32c(Crc32c(0, data.data(), split), data.data() + split, n - split),
                Crc32cPortable(0, data.data(), n))
          << n << " split at " << split;
    }
  }
}

TEST(FormatTest, KeysRoundTripAndOrderByEpoch) {
  const engine::StateKey k{"h.3.attn", 12, "exp_avg"};
  engine::StateKey back;
  uint64_t epoch = 0;
  ASSERT_TRUE(ParseRecordKey(IndexKey(k, 77), &back, &epoch));
  EXPECT_EQ(back, k);
  EXPECT_EQ(epoch, 77u);
  EXPECT_LT(IndexKey(k, 9), IndexKey(k, 10));  // big-endian: versions sort by epoch
  EXPECT_LT(IndexKey(k, 300), IndexKey({"h.3.attn", 13, "exp_avg"}, 1));
  EXPECT_FALSE(ParseRecordKey("c", &back, &epoch));
}

TEST(FormatTest, ValueChecksumCatchesFlipsAndMisplacedRecords) {
  const engine::StateKey k{"g", 1, "master"}, other{"g", 2, "master"};
  std::vector<char> v(kValueHeaderBytes + 1000);
  for (size_t i = 0; i < 1000; ++i) v[kValueHeaderBytes + i] = static_cast<char>(i * 7);
  EncodeValueHeader(KeyId(k), v.data(), 1000);
  const std::string_view sv(v.data(), v.size());
  EXPECT_TRUE(CheckValue(KeyId(k), sv, 1000, "t").ok());
  EXPECT_EQ(CheckValue(KeyId(other), sv, 1000, "t").code(), Status::Code::kDataLoss);  // wrong key
  EXPECT_EQ(CheckValue(KeyId(k), sv, 999, "t").code(), Status::Code::kDataLoss);       // wrong size
  v[kValueHeaderBytes + 500] ^= 1;
  EXPECT_EQ(CheckValue(KeyId(k), std::string_view(v.data(), v.size()), 1000, "t").code(), Status::Code::kDataLoss);
  uint64_t e = 0;
  int64_t step = 0;
  std::string c = EncodeCommit(5, 42);
  ASSERT_TRUE(DecodeCommit(c, &e, &step));
  EXPECT_EQ(e, 5u);
  EXPECT_EQ(step, 42);
  c[12] ^= 1;
  EXPECT_FALSE(DecodeCommit(c, &e, &step));
}

TEST(StatusMapTest, RocksDbCodes) {
  EXPECT_TRUE(FromRocksDb(rocksdb::Status::OK(), "x").ok());
  EXPECT_EQ(FromRocksDb(rocksdb::Status::NoSpace("disk"), "w /d").code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::IOError("While appending", "No space left on device"), "w").code(),
            Status::Code::kResourceExhausted);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::Corruption("blob"), "r").code(), Status::Code::kDataLoss);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::IOError("open", "Read-only file system"), "o").code(),
            Status::Code::kFailedPrecondition);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::IOError("pread", "Input/output error"), "r").code(),
            Status::Code::kUnavailable);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::NotFound(), "r").code(), Status::Code::kNotFound);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::InvalidArgument("x"), "r").code(), Status::Code::kInvalidArgument);
  Status s = FromRocksDb(rocksdb::Status::NoSpace("disk"), "committing step 3 in /nvme/o");
  EXPECT_NE(s.message().find("/nvme/o"), std::string::npos);
}

}  // namespace
}  // namespace traind::offload
