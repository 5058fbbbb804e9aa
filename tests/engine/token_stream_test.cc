// Token streams (data/token_stream.h) and the memory-mapped data path of LoadTokenData:
// - TokenStream widens uint8/uint16/uint32 file elements to int32, slices share the storage, and a
//   mapping outlives the file's name and the views' creator;
// - a mapped stream gives bit-for-bit the batches (BatchLoader, shuffled, across epochs) and the
//   validation windows of an owned int32 vector of the same ids (what the loader held before the
//   streams were mapped): byte text, BPE text through the token cache (a miss, then a hit), jsonl,
//   and tokens files of both dtypes;
// - the resident-memory bound of issue 12: loading ~200 MB of byte text, a ~200 MB uint16 tokens
//   file and a ~200 MB token cache, and pulling batches from them, grows the process's anonymous
//   memory (RssAnon, /proc/self/status) by far less than the data (bound: < 10% of each file; the
//   mapped file pages are RssFile and may be dropped by the kernel).
#include "data/token_stream.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/token_cache.h"
#include "data/token_data.h"
#include "data/window_order.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TokenStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("traind_ts_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::setenv("TRAIND_TOKEN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
    fs::remove_all(dir_);
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

std::string LittleEndian(const std::vector<uint32_t>& ids, int width) {
  std::string s;
  for (uint32_t v : ids) {
    for (int b = 0; b < width; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
  }
  return s;
}

TEST_F(TokenStreamTest, WidensSlicesAndKeepsTheMappingAlive) {
  const std::string p = Write("ids.bin", LittleEndian({1, 0x0102, 0xFFFF, 3, 70000, 0}, 4));
  auto file = MappedFile::Open(p, "data.train_file");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->size(), 24u);

  auto u32 = TokenStream::OfFile(*file, 0, 6, 4);
  ASSERT_TRUE(u32.ok());
  EXPECT_TRUE(u32->mapped());
  EXPECT_EQ(u32->ToVector(), (std::vector<int32_t>{1, 0x0102, 0xFFFF, 3, 70000, 0}));
  auto u16 = TokenStream::OfFile(*file, 4, 4, 2);  // bytes 4..11: 0x0102, 0, 0xFFFF, 0
  ASSERT_TRUE(u16.ok());
  EXPECT_EQ(u16->ToVector(), (std::vector<int32_t>{0x0102, 0, 0xFFFF, 0}));
  auto u8 = TokenStream::OfFile(*file, 4, 4, 1);
  ASSERT_TRUE(u8.ok());
  EXPECT_EQ(u8->ToVector(), (std::vector<int32_t>{2, 1, 0, 0}));
  EXPECT_EQ((*u8)[0], 2);
  EXPECT_EQ((*u16)[2], 0xFFFF);

  // Slices are views; CopyWindow reads any range of one.
  const TokenStream tail = u32->Slice(2, 100);  // clamped to the 4 remaining elements
  EXPECT_EQ(tail.size(), 4);
  EXPECT_EQ(tail.ToVector(), (std::vector<int32_t>{0xFFFF, 3, 70000, 0}));
  int32_t w[2];
  tail.CopyWindow(1, 2, w);
  EXPECT_EQ(w[0], 3);
  EXPECT_EQ(w[1], 70000);
  EXPECT_EQ(u32->ScanIds().max_id, 70000);
  EXPECT_EQ(u32->ScanIds().first_too_large, -1);
  EXPECT_EQ(TokenStream().ScanIds().max_id, -1);

  // Out of range and bad widths are errors, not reads past the file.
  EXPECT_FALSE(TokenStream::OfFile(*file, 0, 7, 4).ok());
  EXPECT_FALSE(TokenStream::OfFile(*file, 25, 0, 1).ok());
  EXPECT_FALSE(TokenStream::OfFile(*file, 1, 2, 2).ok());  // misaligned
  EXPECT_THAT(TokenStream::OfFile(*file, 0, 1, 3).status().message(), HasSubstr("width 3"));

  // The views keep the mapping: drop every other handle and the file's name.
  file->reset();
  fs::remove(p);
  EXPECT_EQ(tail.ToVector(), (std::vector<int32_t>{0xFFFF, 3, 70000, 0}));

  // Owned vectors behave the same.
  const TokenStream owned(std::vector<int32_t>{5, 6, 7, 8});
  EXPECT_FALSE(owned.mapped());
  EXPECT_EQ(owned.Slice(1, 2).ToVector(), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(owned.ScanIds().max_id, 8);

  EXPECT_EQ(MappedFile::Open((dir_ / "none").string(), "x").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(MappedFile::Open(dir_.string(), "x").status().code(), Status::Code::kInvalidArgument);
  auto empty = MappedFile::Open(Write("empty", ""), "x");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(TokenStream::OfFile(*empty, 0, 0, 1)->size(), 0);
}

// The batches and validation windows of `d` equal those of owned int32 vectors holding `ids`
// split as LoadTokenData splits them (the pre-mapping loader), and the streams are mapped.
void ExpectSameBatchesAsVectors(const TokenData& d, const std::vector<int32_t>& ids,
                                double validation_split, int64_t T) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t n_train = TrainTokenCount(n, validation_split);
  ASSERT_EQ(d.train.size(), n_train);
  ASSERT_EQ(d.validation.size(), n - n_train);
  EXPECT_TRUE(d.train.mapped());
  EXPECT_TRUE(d.validation.mapped());
  const TokenStream want_train(std::vector<int32_t>(ids.begin(), ids.begin() + n_train));
  const TokenStream want_val(std::vector<int32_t>(ids.begin() + n_train, ids.end()));
  const int64_t B = 3;
  BatchLoader mapped(d.train, B, T, /*shuffle=*/true, /*seed=*/11, {}, 3);
  BatchLoader vec(want_train, B, T, true, 11, {}, 1);
  ASSERT_EQ(mapped.windows_per_epoch(), vec.windows_per_epoch());
  const int64_t batches = 2 * mapped.windows_per_epoch() / B + 2;  // past an epoch boundary
  std::vector<int32_t> in1(B * T), tg1(B * T), in2(B * T), tg2(B * T);
  for (int64_t k = 0; k < batches; ++k) {
    mapped.Next(in1.data(), tg1.data());
    vec.Next(in2.data(), tg2.data());
    ASSERT_EQ(in1, in2) << "batch " << k;
    ASSERT_EQ(tg1, tg2) << "batch " << k;
  }
  // Evaluation cuts windows from the validation stream with CopyWindow.
  std::vector<int32_t> a(T), b(T);
  for (int64_t s = 0; s + T + 1 <= d.validation.size(); s += T) {
    d.validation.CopyWindow(s + 1, T, a.data());
    want_val.CopyWindow(s + 1, T, b.data());
    ASSERT_EQ(a, b) << "validation window at " << s;
  }
}

TEST_F(TokenStreamTest, MappedStreamsGiveTheVectorBatches) {
  // Byte text: the file itself, uint8 ids (bytes above 127 are ids above 127).
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " \xc3\xa9\n";
  DataSpec spec;
  spec.train_file = Write("t.txt", text);
  spec.seq_len = 32;
  spec.validation_split = 0.1;
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.width(), 1);
  std::vector<int32_t> bytes(text.begin(), text.end());
  for (int32_t& b : bytes) b &= 0xFF;
  ExpectSameBatchesAsVectors(*d, bytes, 0.1, 32);
  EXPECT_EQ(d->vocab_size_needed, 0xc3 + 1);

  // Tokens files, both dtypes.
  std::vector<uint32_t> raw(20000);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint32_t>((i * 2654435761u) % 65536);
  std::vector<int32_t> ids(raw.begin(), raw.end());
  spec.format = "tokens";
  spec.token_dtype = "uint16";
  spec.train_file = Write("t16.bin", LittleEndian(raw, 2));
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.width(), 2);
  ExpectSameBatchesAsVectors(*d, ids, 0.1, 32);
  for (size_t i = 0; i < raw.size(); i += 3) raw[i] += 100000;  // beyond uint16
  ids.assign(raw.begin(), raw.end());
  spec.token_dtype = "uint32";
  spec.train_file = Write("t32.bin", LittleEndian(raw, 4));
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.width(), 4);
  ExpectSameBatchesAsVectors(*d, ids, 0.1, 32);
  EXPECT_EQ(d->vocab_size_needed, *std::max_element(ids.begin(), ids.end()) + 1);

  // BPE text through the token cache: the miss maps the cache it has just written (the encoded
  // vector is freed), the hit maps it again; both give Encode's ids.
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!fs::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  spec = DataSpec();
  spec.train_file = Write("bpe.txt", text);
  spec.tokenizer = gpt2;
  spec.seq_len = 16;
  spec.validation_split = 0.1;
  const std::vector<int32_t> want = *(*tok)->Encode(text);
  for (const char* pass : {"miss", "hit"}) {
    SCOPED_TRACE(pass);
    d = LoadTokenData(spec);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->train.width(), 2);  // GPT-2 ids fit uint16
    ExpectSameBatchesAsVectors(*d, want, 0.1, 16);
  }
  // jsonl through the cache: mapped too.
  spec.format = "jsonl";
  spec.train_file = Write("d.jsonl", "{\"text\": \"" + std::string(500, 'a') + " b c\"}\n{\"text\": \"d e f\"}\n");
  spec.seq_len = 4;
  spec.validation_split = 0;
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->train.mapped());

  // Without a writable cache folder the encoded ids stay in an owned vector: same ids.
  ::setenv("TRAIND_TOKEN_CACHE_DIR", "/dev/null/no-cache-here", 1);
  spec = DataSpec();
  spec.train_file = Write("bpe2.txt", text);
  spec.tokenizer = gpt2;
  spec.seq_len = 16;
  spec.validation_split = 0.1;
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_FALSE(d->train.mapped());
  const int64_t n_train = TrainTokenCount(static_cast<int64_t>(want.size()), 0.1);
  EXPECT_EQ(d->train.ToVector(), std::vector<int32_t>(want.begin(), want.begin() + n_train));
}

// ---- resident memory ----

// A field of /proc/self/status in bytes ("RssAnon", "RssFile", "VmRSS"); -1 when absent.
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream ss(line.substr(field.size() + 1));
      int64_t kb = -1;
      ss >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

// Writes `bytes` bytes made by `fill(offset, chunk, n)` in 1 MiB chunks (no copy of the file in RAM).
template <typename Fill>
void WriteChunked(const std::string& path, int64_t bytes, Fill fill, const std::string& header = "") {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(header.data(), 1, header.size(), f);
  std::vector<unsigned char> chunk(1 << 20);
  for (int64_t off = 0; off < bytes; off += static_cast<int64_t>(chunk.size())) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(chunk.size()), bytes - off));
    fill(off, chunk.data(), n);
    ASSERT_EQ(std::fwrite(chunk.data(), 1, n, f), n);
  }
  ASSERT_EQ(std::fclose(f), 0);
}

struct MemoryUse {
  int64_t anon = 0, file = 0;
};

// Loads `spec`, pulls `batches` shuffled batches (B 8, T seq_len) and every validation window, and
// returns how much RssAnon and RssFile grew meanwhile (the TokenData is still alive at the end).
MemoryUse LoadAndTrain(const DataSpec& spec, int batches, int expect_width) {
  MemoryUse m;
  const int64_t anon0 = StatusBytes("RssAnon"), file0 = StatusBytes("RssFile");
  Result<TokenData> d = LoadTokenData(spec);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return m;
  EXPECT_TRUE(d->train.mapped());
  EXPECT_EQ(d->train.width(), expect_width);
  const int64_t B = 8, T = spec.seq_len;
  {
    BatchLoader loader(d->train, B, T, /*shuffle=*/true, /*seed=*/1);
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int k = 0; k < batches; ++k) loader.Next(in.data(), tg.data());
    int64_t sum = 0;
    for (int64_t s = 0; s + T + 1 <= d->validation.size(); s += T) {
      d->validation.CopyWindow(s, T, in.data());
      sum += in[0];
    }
    EXPECT_GE(sum, 0);
    m.anon = StatusBytes("RssAnon") - anon0;  // while the loader and its prefetch thread run
  }
  m.file = StatusBytes("RssFile") - file0;
  return m;
}

TEST_F(TokenStreamTest, A200MbCorpusNeedsNoAnonymousMemoryForItsTokens) {
  if (StatusBytes("RssAnon") < 0) GTEST_SKIP() << "no RssAnon in /proc/self/status";
  constexpr int64_t kBytes = int64_t{200} << 20;  // each data file
  constexpr int64_t kBound = kBytes / 10;         // < 10% of the file's size in anonymous memory
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };

  // 1. Byte-tokenized text: the ids are the mapped file (the old path held 4 bytes per byte).
  DataSpec spec;
  spec.train_file = (dir_ / "corpus.txt").string();
  WriteChunked(spec.train_file, kBytes, [&](int64_t, unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(' ' + next() % 95);
  });
  spec.seq_len = 1024;
  spec.validation_split = 0.05;
  const MemoryUse text = LoadAndTrain(spec, 400, 1);
  std::printf("[ memory ] byte text %lld MiB: RssAnon %+.1f MiB, RssFile +%.1f MiB (bound %lld MiB)\n",
              static_cast<long long>(kBytes >> 20), text.anon / 1048576.0, text.file / 1048576.0,
              static_cast<long long>(kBound >> 20));
  EXPECT_LT(text.anon, kBound) << "anonymous memory grew with the byte text";

  // 2. A uint16 tokens file of 100M ids (the old path: 400 MB of int32).
  spec = DataSpec();
  spec.format = "tokens";
  spec.token_dtype = "uint16";
  spec.train_file = (dir_ / "corpus.u16").string();
  WriteChunked(spec.train_file, kBytes, [&](int64_t, unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; i += 2) {
      const uint16_t v = static_cast<uint16_t>(next() % 50257);
      std::memcpy(p + i, &v, 2);
    }
  });
  spec.seq_len = 1024;
  spec.validation_split = 0.05;
  const MemoryUse tokens = LoadAndTrain(spec, 400, 2);
  std::printf("[ memory ] uint16 tokens %lld MiB: RssAnon %+.1f MiB, RssFile +%.1f MiB\n",
              static_cast<long long>(kBytes >> 20), tokens.anon / 1048576.0, tokens.file / 1048576.0);
  EXPECT_LT(tokens.anon, kBound) << "anonymous memory grew with the tokens file";

  // 3. A token cache hit of 100M uint16 ids for a (small) text through the GPT-2 tokenizer: the
  // cache is written here in the documented format (token_cache.h) under the text's key.
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!fs::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  spec = DataSpec();
  spec.tokenizer = gpt2;
  spec.train_file = (dir_ / "small.txt").string();
  std::ofstream(spec.train_file) << "a small text whose cache claims 100M ids\n";
  auto key = TokenCacheKeyFor(spec.train_file, (*tok)->fingerprint());
  ASSERT_TRUE(key.ok());
  std::string header("TRDTOKC1", 8);
  auto put = [&header](const void* v, size_t n) { header.append(static_cast<const char*>(v), n); };
  const uint32_t width = 2, fp_len = static_cast<uint32_t>(key->fingerprint.size());
  const uint64_t count = static_cast<uint64_t>(kBytes / 2);
  put(&width, 4);
  put(&fp_len, 4);
  put(&key->source_size, 8);
  put(&key->source_mtime_ns, 8);
  put(&count, 8);
  header += key->fingerprint;
  header.append((8 - fp_len % 8) % 8, '\0');
  const std::string cache = TokenCachePath(spec.train_file, (*tok)->fingerprint());
  fs::create_directories(fs::path(cache).parent_path());
  WriteChunked(cache, kBytes, [&](int64_t, unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; i += 2) {
      const uint16_t v = static_cast<uint16_t>(next() % 50257);
      std::memcpy(p + i, &v, 2);
    }
  }, header);
  spec.seq_len = 1024;
  spec.validation_split = 0.05;
  const MemoryUse cached = LoadAndTrain(spec, 400, 2);
  std::printf("[ memory ] token cache hit %lld MiB: RssAnon %+.1f MiB, RssFile +%.1f MiB\n",
              static_cast<long long>(kBytes >> 20), cached.anon / 1048576.0, cached.file / 1048576.0);
  EXPECT_LT(cached.anon, kBound) << "anonymous memory grew with the token cache";

  // The meter sees what the old path held: 50M int32 ids (200 MB) in a vector.
  const int64_t before = StatusBytes("RssAnon");
  {
    std::vector<int32_t> held(static_cast<size_t>(kBytes / 4), 1);
    const int64_t grew = StatusBytes("RssAnon") - before;
    std::printf("[ memory ] control: a %lld MiB int32 vector: RssAnon %+.1f MiB\n",
                static_cast<long long>(kBytes >> 20), grew / 1048576.0);
    EXPECT_GT(grew, kBytes * 9 / 10) << "RssAnon does not measure anonymous memory";
  }
}

// A cache miss streams the tokenizer's parts into the cache in order (EncodeLargeTo) and maps the
// cache: the ids (~10M from ~32 MB of text, 40 MB as int32) are never all in memory, and the
// load ends holding only mapped pages. Bounds: the peak RSS during the load beyond the mapped text
// and the cache's pages (2 bytes an id) stays under 40 MiB (the tokenizer's tables and the parts
// in flight; the vector path that joined the parts needed ~87 MiB more), and RssAnon afterwards
// grows by less than half the int32 ids (glibc keeps a few MiB at the top of a thread's heap).
TEST_F(TokenStreamTest, ACacheMissFreesTheEncodedIds) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  const std::string shakespeare = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!fs::exists(gpt2 + "/vocab.json") || !fs::exists(shakespeare)) {
    GTEST_SKIP() << "no GPT-2 files or tinyshakespeare in " << TRAIND_SHARED_DATA;
  }
  if (StatusBytes("RssAnon") < 0) GTEST_SKIP() << "no RssAnon in /proc/self/status";
  DataSpec spec;
  spec.tokenizer = gpt2;
  spec.train_file = (dir_ / "corpus.txt").string();
  {
    std::stringstream one;
    one << std::ifstream(shakespeare, std::ios::binary).rdbuf();
    const std::string s = one.str();
    std::ofstream out(spec.train_file, std::ios::binary);
    for (int i = 0; i < 30; ++i) out << s;
  }
  spec.seq_len = 256;
  const int64_t anon0 = StatusBytes("RssAnon"), rss0 = StatusBytes("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM (the peak) to the current RSS
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const int64_t grew = StatusBytes("RssAnon") - anon0, peak = StatusBytes("VmHWM") - rss0;
  const int64_t ids = d->train.size() + d->validation.size();
  EXPECT_TRUE(d->train.mapped());
  const int64_t beyond_pages = peak - static_cast<int64_t>(fs::file_size(spec.train_file)) - ids * 2;
  std::printf("[ memory ] cache miss, %lld MiB text -> %lld ids (%.1f MiB as int32): peak RSS during "
              "the load +%.1f MiB (+%.1f MiB beyond the text's and the cache's pages), RssAnon %+.1f "
              "MiB after it\n",
              static_cast<long long>(fs::file_size(spec.train_file) >> 20),
              static_cast<long long>(ids), ids * 4 / 1048576.0, peak / 1048576.0,
              beyond_pages / 1048576.0, grew / 1048576.0);
  EXPECT_LT(grew, ids * 4 / 2) << "the encoded ids were not freed after the cache was mapped";
  EXPECT_LT(beyond_pages, int64_t{40} << 20) << "the ids were held in memory while tokenizing";
}

// EncodeLargeTo hands out EncodeLarge's ids in order, a part at a time (~4.4 MB: 16+ parts), and
// stops at an emit error; TokenCacheWriter streams ids into a cache ReadTokenCache accepts, and
// refuses an id its width cannot hold (leaving no file behind).
TEST_F(TokenStreamTest, PartsStreamInOrderIntoTheCacheWriter) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  const std::string shakespeare = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!fs::exists(gpt2 + "/vocab.json") || !fs::exists(shakespeare)) {
    GTEST_SKIP() << "no GPT-2 files or tinyshakespeare in " << TRAIND_SHARED_DATA;
  }
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  std::stringstream one;
  one << std::ifstream(shakespeare, std::ios::binary).rdbuf();
  std::string text;
  for (int i = 0; i < 4; ++i) text += one.str();
  const std::vector<int32_t> want = *(*tok)->EncodeLarge(text, 2);
  std::vector<int32_t> got;
  int emits = 0;
  std::atomic<int64_t> done{0};
  Status st = (*tok)->EncodeLargeTo(text, 2, &done, [&](const std::vector<int32_t>& part) {
    ++emits;
    got.insert(got.end(), part.begin(), part.end());
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(emits, 16);
  EXPECT_TRUE(got == want) << "the parts in order are not EncodeLarge's ids";
  EXPECT_EQ(done.load(), static_cast<int64_t>(text.size()));
  emits = 0;
  st = (*tok)->EncodeLargeTo(text, 2, nullptr, [&](const std::vector<int32_t>&) {
    return ++emits == 3 ? Status::ResourceExhausted("disk full") : Status::Ok();
  });
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(emits, 3);

  TokenCacheKey key;
  key.fingerprint = "test:fp";
  key.source_size = 12;
  key.source_mtime_ns = 34;
  const std::string path = (dir_ / "w" / "c.tokens").string();
  auto w = TokenCacheWriter::Create(path, key, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append(want.data(), want.size() / 2).ok());
  ASSERT_TRUE((*w)->Append(want.data() + want.size() / 2, want.size() - want.size() / 2).ok());
  EXPECT_FALSE(fs::exists(path)) << "visible before Commit";
  ASSERT_TRUE((*w)->Commit().ok());
  auto back = ReadTokenCache(path, key);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->width(), 2);
  EXPECT_TRUE(back->ToVector() == want);
  w = TokenCacheWriter::Create((dir_ / "w" / "big.tokens").string(), key, 2);
  ASSERT_TRUE(w.ok());
  const std::vector<int32_t> big = {1, 70000};
  EXPECT_THAT((*w)->Append(big.data(), big.size()).message(), HasSubstr("id 70000 does not fit 2"));
  EXPECT_FALSE((*w)->Commit().ok());
  w->reset();
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "w"), fs::directory_iterator()), 1)
      << "a failed writer left a file behind";
}

}  // namespace
}  // namespace traind::engine
