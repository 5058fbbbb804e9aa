// Token data tests: loading text/tokens files and their errors, the train/validation split, and the
// exact batching semantics of JOBSPEC.md on a synthetic stream whose token i has id i (so every
// window is identified by its first token): order, wrap, shuffle, and position save/restore;
// text through a BPE tokenizer and the token cache (hits, staleness, corruption).
#include "data/token_data.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "data/token_cache.h"
#include "data/window_order.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("traind_td_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

TEST_F(TokenDataTest, TextIsBytesSplitAsPython) {
  std::string text(1000, 'a');
  text[3] = '\xff';   // a byte above 127 is token 255, not a negative char
  text[950] = 'z';
  DataSpec spec;
  spec.train_file = Write("t.txt", text);
  spec.seq_len = 16;
  spec.validation_split = 0.1;
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.size(), 900);  // int(1000 * 0.9)
  EXPECT_EQ(d->validation.size(), 100);
  EXPECT_EQ(d->train[3], 255);
  EXPECT_EQ(d->train[0], 'a');
  EXPECT_EQ(d->validation[50], 'z');
  EXPECT_EQ(d->vocab_size_needed, 256);
  // int(n * (1 - vs)) with Python's double arithmetic: int(10 * 0.7) == 7, int(100 * 0.71) == 71,
  // int(1000003 * 0.9) == 900002.
  EXPECT_EQ(TrainTokenCount(10, 0.3), 7);
  EXPECT_EQ(TrainTokenCount(100, 0.29), 71);
  EXPECT_EQ(TrainTokenCount(1000003, 0.1), 900002);
  EXPECT_EQ(TrainTokenCount(5, 0.0), 5);
}

TEST_F(TokenDataTest, TokensFilesAreLittleEndian) {
  DataSpec spec;
  spec.format = "tokens";
  spec.token_dtype = "uint16";
  spec.seq_len = 2;
  spec.validation_split = 0.0;
  spec.train_file = Write("t16.bin", std::string("\x01\x00\x02\x01\xff\xff\x03\x00", 8));
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.ToVector(), (std::vector<int32_t>{1, 0x0102, 0xFFFF, 3}));
  EXPECT_EQ(d->vocab_size_needed, 0x10000);
  spec.token_dtype = "uint32";
  spec.seq_len = 1;
  spec.train_file = Write("t32.bin", std::string("\x05\x00\x01\x00\x07\x00\x00\x00", 8));
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.ToVector(), (std::vector<int32_t>{0x10005, 7}));
}

TEST_F(TokenDataTest, BadFilesAreClearErrors) {
  DataSpec spec;
  spec.train_file = (dir_ / "missing.txt").string();
  Result<TokenData> d = LoadTokenData(spec);
  EXPECT_EQ(d.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr("data.train_file: " + spec.train_file + ": no such file"));

  spec.format = "tokens";
  spec.token_dtype = "uint16";
  spec.train_file = Write("odd.bin", std::string(301, '\0'));
  d = LoadTokenData(spec);
  EXPECT_EQ(d.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("301 bytes is not a multiple of 2"));

  spec.token_dtype = "uint32";
  spec.seq_len = 1;
  spec.validation_split = 0;
  spec.train_file = Write("big.bin", std::string("\x00\x00\x00\x80\x00\x00\x00\x00", 8));
  d = LoadTokenData(spec);
  EXPECT_EQ(d.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("id 2147483648"));

  spec.format = "text";
  spec.seq_len = 128;
  spec.validation_split = 0.1;
  spec.train_file = Write("short.txt", std::string(140, 'x'));  // 126 train tokens < 129
  d = LoadTokenData(spec);
  EXPECT_EQ(d.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("shorter than one window of seq_len + 1 = 129"));

  spec.train_file = Write("noval.txt", std::string(200, 'x'));  // 180 train, 20 validation
  d = LoadTokenData(spec);
  EXPECT_EQ(d.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("data.validation_split: the validation stream has 20"));
}

// The stream 0, 1, ..., n-1: window w's inputs start at token w*T.
TokenStream Iota(int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return TokenStream(std::move(v));
}

// Takes `count` batches and returns the window index of every row, checking each row is exactly
// that window (inputs = window[:-1], targets = window[1:]).
std::vector<int64_t> TakeWindows(BatchLoader* l, int64_t B, int64_t T, int count) {
  std::vector<int64_t> windows;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int k = 0; k < count; ++k) {
    EXPECT_GE(l->Next(in.data(), tg.data()), 0.0);
    for (int64_t r = 0; r < B; ++r) {
      const int32_t first = in[r * T];
      EXPECT_EQ(first % T, 0);
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(in[r * T + t], first + t);
        EXPECT_EQ(tg[r * T + t], first + t + 1);
      }
      windows.push_back(first / T);
    }
  }
  return windows;
}

TEST_F(TokenDataTest, TextThroughABpeTokenizerAndTheTokenCache) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!fs::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  ::setenv("TRAIND_TOKEN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "To be, or not to be, that is the question " + std::to_string(i) + ".\n";
  DataSpec spec;
  spec.train_file = Write("t.txt", text);
  spec.tokenizer = gpt2;
  spec.seq_len = 16;
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> want = *(*tok)->Encode(text);
  const int64_t n_train = TrainTokenCount(static_cast<int64_t>(want.size()), spec.validation_split);

  Result<TokenData> first = LoadTokenData(spec);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->train.ToVector(), std::vector<int32_t>(want.begin(), want.begin() + n_train));
  EXPECT_EQ(first->validation.ToVector(), std::vector<int32_t>(want.begin() + n_train, want.end()));
  EXPECT_EQ(first->vocab_size_needed, *std::max_element(want.begin(), want.end()) + 1);

  // The cache now holds the ids (uint16: GPT-2's ids are < 65536) under this file's key.
  const std::string cache = TokenCachePath(spec.train_file, (*tok)->fingerprint());
  ASSERT_TRUE(fs::exists(cache)) << cache;
  EXPECT_EQ(fs::file_size(cache), 40 + ((*tok)->fingerprint().size() + 7) / 8 * 8 + 2 * want.size());
  auto key = TokenCacheKeyFor(spec.train_file, (*tok)->fingerprint());
  ASSERT_TRUE(key.ok());
  auto cached = ReadTokenCache(cache, *key);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(cached->ToVector(), want);

  // A second load reads the cache: prove it by planting different ids under the same key.
  std::vector<int32_t> planted(want.size(), 7);
  ASSERT_TRUE(WriteTokenCache(cache, *key, planted).ok());
  Result<TokenData> second = LoadTokenData(spec);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->train.ToVector(), std::vector<int32_t>(n_train, 7));

  // Another key (fingerprint, size or mtime) misses; a truncated or garbage file misses.
  TokenCacheKey other = *key;
  other.fingerprint = "bpe:0000000000000000";
  EXPECT_FALSE(ReadTokenCache(cache, other).has_value());
  other = *key;
  other.source_mtime_ns += 1;
  EXPECT_FALSE(ReadTokenCache(cache, other).has_value());
  fs::resize_file(cache, fs::file_size(cache) - 1);
  EXPECT_FALSE(ReadTokenCache(cache, *key).has_value());
  std::ofstream(cache, std::ios::binary) << "garbage";
  EXPECT_FALSE(ReadTokenCache(cache, *key).has_value());
  // ... and the loader then tokenizes again and rewrites it.
  Result<TokenData> third = LoadTokenData(spec);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->train.ToVector(), first->train.ToVector());
  EXPECT_EQ(ReadTokenCache(cache, *key)->ToVector(), want);

  // Editing the data file changes its key: no stale ids.
  text += "Whether 'tis nobler in the mind to suffer\n";
  Write("t.txt", text);
  Result<TokenData> edited = LoadTokenData(spec);
  ASSERT_TRUE(edited.ok());
  const std::vector<int32_t> want2 = *(*tok)->Encode(text);
  EXPECT_EQ(static_cast<size_t>(edited->train.size() + edited->validation.size()), want2.size());

  // Large ids are stored as uint32.
  std::vector<int32_t> big = {1, 70000, 3};
  ASSERT_TRUE(WriteTokenCache((dir_ / "big.tokens").string(), *key, big).ok());
  EXPECT_EQ(ReadTokenCache((dir_ / "big.tokens").string(), *key)->ToVector(), big);

  // A tokenizer that cannot be opened is named.
  spec.tokenizer = (dir_ / "nope.json").string();
  Result<TokenData> bad = LoadTokenData(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("data.tokenizer: " + spec.tokenizer));
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
}

// Tokenizing into the cache reports progress on the calling thread: a first report (0 bytes), reports
// while the worker threads encode (interval 0: whenever the count moved), byte counts that only
// grow, and a last one with done, all bytes and the token count. A cache hit reports once with
// cache_hit; the byte tokenizer (ids are the bytes, no cache) reports nothing.
TEST_F(TokenDataTest, TokenizingReportsProgressAndCacheHits) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  const std::string shakespeare = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!fs::exists(gpt2 + "/vocab.json") || !fs::exists(shakespeare)) {
    GTEST_SKIP() << "no GPT-2 files or tinyshakespeare in " << TRAIND_SHARED_DATA;
  }
  ::setenv("TRAIND_TOKEN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  std::stringstream one;
  one << std::ifstream(shakespeare, std::ios::binary).rdbuf();
  std::string text;
  for (int i = 0; i < 4; ++i) text += one.str();  // ~4.4 MB: 16+ parts of at most 1 MiB
  DataSpec spec;
  spec.train_file = Write("corpus.txt", text);
  spec.tokenizer = gpt2;
  spec.seq_len = 64;
  std::vector<TokenizeReport> reports;
  std::vector<std::thread::id> threads;
  TokenizeProgress progress;
  progress.interval_seconds = 0;
  progress.report = [&](const TokenizeReport& r) {
    reports.push_back(r);
    threads.push_back(std::this_thread::get_id());
  };
  Result<TokenData> d = LoadTokenData(spec, progress);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const int64_t total = static_cast<int64_t>(text.size());
  const int64_t tokens = static_cast<int64_t>(d->train.size() + d->validation.size());
  ASSERT_GE(reports.size(), 3u) << "first, at least one in progress, last";
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_FALSE(reports.front().done);
  int in_between = 0;
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].file, spec.train_file);
    EXPECT_THAT(reports[i].tokenizer, ::testing::StartsWith("bpe:"));
    EXPECT_EQ(reports[i].bytes_total, total);
    EXPECT_FALSE(reports[i].cache_hit);
    EXPECT_EQ(threads[i], std::this_thread::get_id()) << "reports come on the loading thread";
    if (i > 0) {
      EXPECT_GE(reports[i].bytes_done, reports[i - 1].bytes_done) << "report " << i;
    }
    if (i + 1 < reports.size()) {
      EXPECT_FALSE(reports[i].done) << "report " << i;
    }
    if (reports[i].bytes_done > 0 && reports[i].bytes_done < total) ++in_between;
  }
  EXPECT_GE(in_between, 1) << "no report while the worker threads were encoding";
  EXPECT_TRUE(reports.back().done);
  EXPECT_EQ(reports.back().bytes_done, total);
  EXPECT_EQ(reports.back().tokens, tokens);
  EXPECT_GT(reports.back().seconds, 0);
  // The ids are Encode's; so are EncodeLarge's on one thread, which still cuts the ~4.4 MB into
  // 1 MiB parts (for progress), and it counts every byte.
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> want = *(*tok)->Encode(text);
  std::vector<int32_t> got = d->train.ToVector();
  const std::vector<int32_t> validation = d->validation.ToVector();
  got.insert(got.end(), validation.begin(), validation.end());
  EXPECT_TRUE(got == want) << "loader ids differ from Encode";
  std::atomic<int64_t> counted{0};
  auto one_thread = (*tok)->EncodeLarge(text, 1, &counted);
  ASSERT_TRUE(one_thread.ok());
  EXPECT_TRUE(*one_thread == want) << "EncodeLarge on 1 thread differs from Encode";
  EXPECT_EQ(counted.load(), total);

  // Again: the cache holds it; one report, nothing tokenized.
  reports.clear();
  d = LoadTokenData(spec, progress);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].cache_hit);
  EXPECT_TRUE(reports[0].done);
  EXPECT_EQ(reports[0].bytes_done, 0);
  EXPECT_EQ(reports[0].tokens, tokens);

  // jsonl tokenizes (and reports) too, ending at the file's size.
  reports.clear();
  spec.train_file = Write("docs.jsonl", "{\"text\": \"" + std::string(3000, 'a') + " b\"}\n{\"text\": \"c d e\"}\n");
  spec.format = "jsonl";
  spec.seq_len = 4;
  d = LoadTokenData(spec, progress);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_TRUE(reports.back().done);
  EXPECT_EQ(reports.back().bytes_done, static_cast<int64_t>(fs::file_size(spec.train_file)));

  // The byte tokenizer's ids are the bytes: nothing to tokenize, nothing reported.
  reports.clear();
  spec.format = "text";
  spec.tokenizer = "byte";
  spec.train_file = Write("bytes.txt", std::string(1000, 'x'));
  ASSERT_TRUE(LoadTokenData(spec, progress).ok());
  EXPECT_TRUE(reports.empty());
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
}

TEST_F(TokenDataTest, JsonlDocumentsEndWithEos) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  if (!fs::exists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2;
  ::setenv("TRAIND_TOKEN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  std::vector<std::string> docs;
  std::string file;
  for (int i = 0; i < 60; ++i) {
    docs.push_back("Document " + std::to_string(i) + ": caf\u00e9 \"quoted\"\nsecond line");
    file += "{\"id\": " + std::to_string(i) + ", \"body\": " + nlohmann::json(docs.back()).dump() + "}\n";
    if (i % 7 == 0) file += "\n";  // blank lines are skipped
  }
  DataSpec spec;
  spec.format = "jsonl";
  spec.text_field = "body";
  spec.tokenizer = gpt2;
  spec.seq_len = 8;
  spec.validation_split = 0;
  spec.train_file = Write("d.jsonl", file);
  auto tok = DefaultTokenizerFactory().Open(gpt2, "");
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> want;
  for (const auto& d : docs) {
    auto ids = *(*tok)->Encode(d);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(50256);  // <|endoftext|> after every document
  }
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.ToVector(), want);
  EXPECT_EQ(LoadTokenData(spec)->train.ToVector(), want);  // again, from the cache

  // byte: no eos, so documents end with a newline.
  spec.tokenizer = "byte";
  spec.text_field = "t";
  spec.train_file = Write("b.jsonl", "{\"t\": \"ab\"}\n{\"t\": \"cd\"}\n{\"t\": \"efgh\"}\n{\"t\": \"ijkl\"}\n");
  d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.ToVector(), (std::vector<int32_t>{'a', 'b', 10, 'c', 'd', 10, 'e', 'f', 'g', 'h', 10,
                                             'i', 'j', 'k', 'l', 10}));

  // Errors name the file and the line.
  spec.train_file = Write("bad.jsonl", "{\"t\": \"ok\"}\n{\"x\": 1}\n");
  d = LoadTokenData(spec);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr(spec.train_file + " line 2: expected an object with a "
                                              "string field 't' (data.text_field)"));
  spec.train_file = Write("broken.jsonl", "{\"t\": \"ok\"}\n\n{\"t\": \n");
  d = LoadTokenData(spec);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr(spec.train_file + " line 3: not valid JSON"));
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
}

TEST(BatchLoaderTest, InOrderWindowsWrapToWindowZero) {
  // 23 tokens, T = 4: windows = (23 - 1) / 4 = 5 (the last window is tokens 16..20).
  BatchLoader l(Iota(23), /*B=*/2, /*T=*/4, /*shuffle=*/false, /*seed=*/1);
  EXPECT_EQ(l.windows_per_epoch(), 5);
  const std::vector<int64_t> w = TakeWindows(&l, 2, 4, 4);
  EXPECT_EQ(w, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(l.position().epoch, 1);
  EXPECT_EQ(l.position().next_window, 3);
}

TEST(BatchLoaderTest, ExactWindowBoundary) {
  // 9 tokens, T = 4: windows = 2; window 1 = tokens 4..8 uses the very last token as a target.
  BatchLoader l(Iota(9), 1, 4, false, 0);
  EXPECT_EQ(l.windows_per_epoch(), 2);
  std::vector<int32_t> in(4), tg(4);
  l.Next(in.data(), tg.data());
  l.Next(in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(tg, (std::vector<int32_t>{5, 6, 7, 8}));
}

TEST(BatchLoaderTest, ShuffleIsAPermutationPerEpochFromSeed) {
  const int64_t W = 50, T = 3;
  BatchLoader a(Iota(W * T + 1), 5, T, true, 42);
  BatchLoader b(Iota(W * T + 1), 5, T, true, 42);
  BatchLoader c(Iota(W * T + 1), 5, T, true, 43);
  const std::vector<int64_t> wa = TakeWindows(&a, 5, T, 20);  // two epochs
  EXPECT_EQ(wa, TakeWindows(&b, 5, T, 20));
  const std::vector<int64_t> wc = TakeWindows(&c, 5, T, 20);
  const std::vector<int64_t> e0(wa.begin(), wa.begin() + W), e1(wa.begin() + W, wa.end());
  EXPECT_NE(e0, std::vector<int64_t>(wc.begin(), wc.begin() + W));  // seed matters
  EXPECT_NE(e0, e1);                                                  // epochs differ
  std::vector<int64_t> s0 = e0, s1 = e1, ident(W);
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  std::iota(ident.begin(), ident.end(), 0);
  EXPECT_EQ(s0, ident);
  EXPECT_EQ(s1, ident);
  EXPECT_NE(e0, ident);
  EXPECT_EQ(e0, WindowOrder(W, true, 42, 0));
  EXPECT_EQ(e1, WindowOrder(W, true, 42, 1));
}

// Pinned values: the permutation must not change across standard libraries or refactors
// (checkpoints resume with it). Cross-checked against a pure-Python mt19937_64 below.
TEST(BatchLoaderTest, WindowOrderIsPinned) {
  EXPECT_EQ(WindowOrder(10, true, 42, 0), (std::vector<int64_t>{2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
  EXPECT_EQ(WindowOrder(10, true, 42, 1), (std::vector<int64_t>{2, 8, 7, 3, 6, 4, 0, 9, 5, 1}));
  EXPECT_EQ(WindowOrder(4, false, 42, 3), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(WindowOrder(1, true, 42, 0), (std::vector<int64_t>{0}));
}

TEST(BatchLoaderTest, PythonReproducesWindowOrder) {
  const std::string py = TRAIND_TEST_PYTHON;
  if (!fs::exists(py)) GTEST_SKIP() << "no " << py << " for the Python cross-check";
  const std::string script = std::string(TRAIND_TESTS_DIR) + "/reference/window_order.py";
  for (const auto& [n, seed, epoch] : std::vector<std::tuple<int, uint64_t, int>>{
           {10, 42, 0}, {10, 42, 1}, {1000, 7, 5}, {3, 0, 0}}) {
    const std::string cmd = py + " " + script + " " + std::to_string(n) + " " +
                            std::to_string(seed) + " " + std::to_string(epoch);
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t r;
    while ((r = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, r);
    ASSERT_EQ(::pclose(p), 0) << cmd;
    std::istringstream ss(out);
    std::vector<int64_t> got;
    for (int64_t v; ss >> v;) got.push_back(v);
    EXPECT_EQ(got, WindowOrder(n, true, seed, epoch)) << cmd;
  }
}

TEST(BatchLoaderTest, PositionIsWhatTheCallerReceivesNext) {
  const int64_t B = 3, T = 2;
  auto tokens = Iota(7 * T + 1);  // 7 windows: batches straddle epochs
  BatchLoader full(tokens, B, T, true, 9, {}, /*prefetch=*/4);
  // Let the prefetcher run ahead; position() must still be the start.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(full.position().epoch, 0);
  EXPECT_EQ(full.position().next_window, 0);
  const std::vector<int64_t> first = TakeWindows(&full, B, T, 5);
  const LoaderPosition pos = full.position();
  EXPECT_EQ(pos.epoch, 2);  // 15 windows taken = 2 epochs + 1
  EXPECT_EQ(pos.next_window, 1);
  const std::vector<int64_t> rest = TakeWindows(&full, B, T, 6);
  BatchLoader resumed(tokens, B, T, true, 9, pos, /*prefetch=*/1);
  EXPECT_EQ(TakeWindows(&resumed, B, T, 6), rest);
  // A position at an epoch's end (next_window == W) is the next epoch's start.
  BatchLoader at_end(tokens, B, T, true, 9, {1, 7});
  EXPECT_EQ(at_end.position().epoch, 2);
  EXPECT_EQ(at_end.position().next_window, 0);
  const std::vector<int64_t> e2 = TakeWindows(&at_end, B, T, 1);
  EXPECT_EQ(e2.front(), first[14]);  // epoch 2 starts with the same window either way
}

TEST(BatchLoaderTest, DestroysCleanlyWithFullRingAndNeverStarted) {
  for (int i = 0; i < 20; ++i) {
    BatchLoader l(Iota(1000), 4, 8, true, static_cast<uint64_t>(i), {}, 3);
    if (i % 2) {
      std::vector<int32_t> in(32), tg(32);
      l.Next(in.data(), tg.data());
    }
  }
  // A stream shorter than one window breaks the precondition: all-ignored batches, no crash.
  BatchLoader empty(TokenStream(), 2, 4, true, 0);
  EXPECT_EQ(empty.windows_per_epoch(), 0);
  std::vector<int32_t> in(8, 5), tg(8, 5);
  empty.Next(in.data(), tg.data());
  EXPECT_EQ(tg, std::vector<int32_t>(8, -1));
}

TEST_F(TokenDataTest, LoadsTinyShakespeare) {
  const std::string path = std::string(TRAIND_SHARED_DATA) + "/tinyshakespeare.txt";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent: the real-data check did not run";
  DataSpec spec;
  spec.train_file = path;
  Result<TokenData> d = LoadTokenData(spec);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.size() + d->validation.size(), 1115394);
  EXPECT_EQ(d->train.size(), 1003854);  // int(1115394 * 0.9)
  EXPECT_LE(d->vocab_size_needed, 128);  // ASCII
}

}  // namespace
}  // namespace traind::engine
