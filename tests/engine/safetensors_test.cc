// safetensors reader/writer tests: round trips (byte-identical), a numpy cross-check of what we
// write, every lying-header case as DATA_LOSS, sharded HF folders, disk-full behaviour, and the
// fp32 <-> bf16/f16 conversions against independent references.
#include "core/safetensors.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("traind_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A file with the given header text and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s + header + std::string(data_bytes, '\0');
}

SafetensorsFile Sample() {
  SafetensorsFile f;
  std::vector<float> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  f.tensors["transformer.wte.weight"] = HostTensor::FromF32(w.data(), {3, 4});
  std::vector<float> b = {1.5f, -2.0f, 3.25f};
  f.tensors["transformer.ln_f.bias"] = CastTensor(HostTensor::FromF32(b.data(), {3}), "BF16").value();
  HostTensor ids;
  ids.dtype = "I64";
  ids.shape = {2};
  ids.data = {7, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};  // 7, -1
  f.tensors["step"] = ids;
  HostTensor empty;
  empty.shape = {0, 5};
  f.tensors["empty"] = empty;
  f.metadata["format"] = "pt";
  return f;
}

TEST_F(SafetensorsTest, RoundTripIsByteIdenticalAndAligned) {
  const SafetensorsFile f = Sample();
  ASSERT_TRUE(WriteSafetensors(P("a.safetensors"), f).ok());
  EXPECT_FALSE(fs::exists(P("a.safetensors.tmp")));
  Result<SafetensorsFile> r = ReadSafetensors(P("a.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->metadata, f.metadata);
  ASSERT_EQ(r->tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const HostTensor& u = r->tensors.at(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.data, t.data) << name;
  }
  ASSERT_TRUE(WriteSafetensors(P("b.safetensors"), *r).ok());
  const std::string a = ReadBytes(P("a.safetensors")), b = ReadBytes(P("b.safetensors"));
  EXPECT_EQ(a, b);
  // Header length: a multiple of 8, padded with spaces; tensors sorted by name in the data.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(a[i]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = a.substr(8, n);
  EXPECT_EQ(header.find("{\"__metadata__\":{\"format\":\"pt\"},\"empty\":"), 0u) << header;
  EXPECT_LT(header.find("\"step\""), header.find("\"transformer.ln_f.bias\""));
  EXPECT_EQ(a.size(), 8 + n + 48 + 6 + 16);
}

TEST_F(SafetensorsTest, NumpyReadsWhatWeWrite) {
  const std::string py = TRAIND_TEST_PYTHON;
  if (!fs::exists(py)) GTEST_SKIP() << "no " << py << " for the numpy cross-check";
  ASSERT_TRUE(WriteSafetensors(P("x.safetensors"), Sample()).ok());
  const std::string script = std::string(TRAIND_TESTS_DIR) + "/reference/safetensors_check.py";
  const std::string cmd = py + " " + script + " " + P("x.safetensors") + " > " + P("out.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json j = nlohmann::json::parse(ReadBytes(P("out.json")));
  EXPECT_EQ(j["metadata"]["format"], "pt");
  const auto& w = j["tensors"]["transformer.wte.weight"];
  EXPECT_EQ(w["shape"], nlohmann::json({3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_DOUBLE_EQ(w["values"][i].get<double>(), 0.25 * i - 1.0);
  const auto& b = j["tensors"]["transformer.ln_f.bias"];
  EXPECT_EQ(b["dtype"], "BF16");
  EXPECT_EQ(b["values"], nlohmann::json({1.5, -2.0, 3.25}));
  EXPECT_EQ(j["tensors"]["step"]["values"], nlohmann::json({7, -1}));
  EXPECT_EQ(j["tensors"]["empty"]["shape"], nlohmann::json({0, 5}));
  EXPECT_EQ(j["data_start_aligned"], true);
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  Result<SafetensorsFile> r = ReadSafetensors(P("nope.safetensors"));
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("nope.safetensors"));
}

struct BadCase {
  const char* label;
  std::string bytes;
  const char* want;  // substring of the message (besides the file name)
};

TEST_F(SafetensorsTest, LyingHeadersAreDataLoss) {
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& off) {
    return "{\"t\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + off +
           "}}";
  };
  std::string huge_len(8, '\0');
  huge_len[3] = 0x10;  // 0x10000000 = 256 MB
  std::string lying_len(8, '\0');
  lying_len[0] = 100;  // 100 bytes of header promised, 4 present
  const std::vector<BadCase> cases = {
      {"short", std::string(5, '\0'), "truncated"},
      {"header beyond file", lying_len + "{}  ", "larger than the rest of the file"},
      {"absurd header", huge_len + "{}", "exceeds the 100 MB limit"},
      {"not json", RawFile("{\"t\": [1, 2", 0), "not valid JSON"},
      {"not object", RawFile("[1, 2, 3]", 0), "not a JSON object"},
      {"entry not object", RawFile("{\"t\": 5}", 0), "tensor 't': header entry is not an object"},
      {"missing dtype", RawFile("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
       "tensor 't': missing or non-string dtype"},
      {"missing offsets", RawFile("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4),
       "tensor 't': missing data_offsets"},
      {"missing shape", RawFile("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
       "tensor 't': missing or non-array shape"},
      {"unknown dtype", RawFile(entry("F33", "[1]", "[0,4]"), 4), "tensor 't': unknown dtype 'F33'"},
      {"offsets beyond data", RawFile(entry("F32", "[2]", "[0,8]"), 4),
       "tensor 't': data_offsets [0,8] are not within the data section of 4 bytes"},
      {"reversed offsets", RawFile(entry("F32", "[1]", "[4,0]"), 4), "not within the data section"},
      {"size mismatch", RawFile(entry("F32", "[3]", "[0,8]"), 8), "span 8 bytes but shape [3]"},
      {"negative dim", RawFile(entry("F32", "[-1]", "[0,4]"), 4), "negative dimension -1"},
      {"non-integer dim", RawFile(entry("F32", "[1.5]", "[0,4]"), 4), "non-integer dimension"},
      {"numel overflow", RawFile(entry("F32", "[4294967296,4294967296]", "[0,4]"), 4),
       "overflows the element count"},
      {"byte overflow", RawFile(entry("F64", "[4611686018427387904]", "[0,8]"), 8),
       "overflows the byte count"},
      {"negative offset", RawFile(entry("F32", "[1]", "[-4,0]"), 4), "not non-negative integers"},
      {"overlap",
       RawFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12),
       "tensor 'b' overlaps tensor 'a'"},
      {"bad metadata", RawFile("{\"__metadata__\":{\"format\":1}}", 0), "__metadata__['format']"},
      {"unknown entry key",
       RawFile("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4),
       "unknown key 'x'"},
  };
  for (const BadCase& c : cases) {
    const std::string path = P("bad.safetensors");
    WriteBytes(path, c.bytes);
    Result<SafetensorsFile> r = ReadSafetensors(path);
    ASSERT_FALSE(r.ok()) << c.label;
    EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << c.label << ": " << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(path)) << c.label;
    EXPECT_THAT(r.status().message(), HasSubstr(c.want)) << c.label;
  }
}

// Random corruption of a valid file (header bytes, length field, truncation) must give OK or
// DATA_LOSS, never a crash or another code. Run under ASan/UBSan this is a small fuzzer.
TEST_F(SafetensorsTest, RandomCorruptionsNeverCrash) {
  ASSERT_TRUE(WriteSafetensors(P("good.safetensors"), Sample()).ok());
  const std::string good = ReadBytes(P("good.safetensors"));
  std::mt19937 rng(123);
  int data_loss = 0;
  // /dev/shm when there is one: 1500 file rewrites on a slow disk would take seconds.
  const std::string fuzz = fs::is_directory("/dev/shm")
                               ? "/dev/shm/traind_st_fuzz_" + std::to_string(::getpid())
                               : P("fuzz.safetensors");
  for (int iter = 0; iter < 1500; ++iter) {
    std::string bad = good;
    const int kind = iter % 3;
    if (kind == 0) {  // flip a few header bytes
      for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
        bad[8 + rng() % (bad.size() - 8) % 200] = static_cast<char>(rng() & 0xFF);
      }
    } else if (kind == 1) {  // a lying length field
      bad[rng() % 8] = static_cast<char>(rng() & 0xFF);
    } else {  // truncation
      bad.resize(rng() % bad.size());
    }
    WriteBytes(fuzz, bad);
    Result<SafetensorsFile> r = ReadSafetensors(fuzz);
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
      ++data_loss;
    }
  }
  fs::remove(fuzz);
  EXPECT_GT(data_loss, 1000);  // most corruptions are detected (some hit only tensor data)
}

TEST_F(SafetensorsTest, ReadsShardedHfFolder) {
  SafetensorsFile all = Sample();
  SafetensorsFile s1, s2;
  nlohmann::json map = nlohmann::json::object();
  bool first = true;
  for (const auto& [name, t] : all.tensors) {
    (first ? s1 : s2).tensors[name] = t;
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    first = !first;
  }
  ASSERT_TRUE(WriteSafetensors(P("model-00001-of-00002.safetensors"), s1).ok());
  ASSERT_TRUE(WriteSafetensors(P("model-00002-of-00002.safetensors"), s2).ok());
  nlohmann::json index = {{"metadata", {{"total_size", 70}}}, {"weight_map", map}};
  WriteBytes(P("model.safetensors.index.json"), index.dump());
  Result<SafetensorsFile> r = ReadHfWeights(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), all.tensors.size());
  for (const auto& [name, t] : all.tensors) EXPECT_EQ(r->tensors.at(name).data, t.data) << name;

  // A name the index promises but the shard lacks.
  map["lm_head.weight"] = "model-00001-of-00002.safetensors";
  WriteBytes(P("model.safetensors.index.json"), nlohmann::json({{"weight_map", map}}).dump());
  r = ReadHfWeights(dir_.string());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("tensor 'lm_head.weight' is listed in"));
  // A shard path escaping the folder.
  map.erase("lm_head.weight");
  map["step"] = "../model-00001-of-00002.safetensors";
  WriteBytes(P("model.safetensors.index.json"), nlohmann::json({{"weight_map", map}}).dump());
  r = ReadHfWeights(dir_.string());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("is not a file name in the folder"));
  // A single model.safetensors wins over the index.
  ASSERT_TRUE(WriteSafetensors(P("model.safetensors"), all).ok());
  r = ReadHfWeights(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), all.tensors.size());
}

TEST_F(SafetensorsTest, HfFolderWithoutWeightsIsNotFound) {
  Result<SafetensorsFile> r = ReadHfWeights(dir_.string());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("model.safetensors.index.json"));
}

// A full disk, simulated with RLIMIT_FSIZE (EFBIG, mapped like ENOSPC): RESOURCE_EXHAUSTED, the
// old file intact and no temporary left behind.
TEST_F(SafetensorsTest, DiskFullKeepsTheOldFile) {
  ASSERT_TRUE(WriteSafetensors(P("m.safetensors"), Sample()).ok());
  const std::string before = ReadBytes(P("m.safetensors"));
  SafetensorsFile big;
  std::vector<float> w(1 << 16, 1.0f);
  big.tensors["w"] = HostTensor::FromF32(w.data(), {1 << 16});
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old_limit;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const Status st = WriteSafetensors(P("m.safetensors"), big);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("m.safetensors"));
  EXPECT_EQ(ReadBytes(P("m.safetensors")), before);
  EXPECT_FALSE(fs::exists(P("m.safetensors.tmp")));
}

TEST_F(SafetensorsTest, WriteFileAtomicReplacesContent) {
  ASSERT_TRUE(WriteFileAtomic(P("s.json"), "{\"a\":1}").ok());
  ASSERT_TRUE(WriteFileAtomic(P("s.json"), "{}").ok());
  EXPECT_EQ(ReadBytes(P("s.json")), "{}");
  EXPECT_FALSE(fs::exists(P("s.json.tmp")));
  const Status st = WriteFileAtomic(P("no/such/dir/s.json"), "x");
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  SafetensorsFile f;
  HostTensor t;
  t.shape = {3};
  t.data.resize(8);
  f.tensors["t"] = t;
  Status st = WriteSafetensors(P("w.safetensors"), f);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("tensor 't'"));
  EXPECT_FALSE(fs::exists(P("w.safetensors")));
}

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent bf16 reference: the two bf16 neighbours of x by truncation, pick the nearer in
// double arithmetic, ties to the even mantissa.
uint16_t RefBF16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next in magnitude (same sign)
  const double dl = std::fabs(static_cast<double>(x) - BF16ToF32(lo));
  const double dh = std::fabs(static_cast<double>(BF16ToF32(hi)) - x);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(HalfConversion, BF16MatchesNearestEvenReference) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    if ((u & 0x7F800000u) == 0x7F800000u) continue;  // inf/NaN handled below
    const float x = Bits(u);
    if (std::fabs(x) > 3.38e38f) continue;  // the reference's "hi" would be inf
    ASSERT_EQ(F32ToBF16(x), RefBF16(x)) << std::hex << u;
  }
  // Exact ties: 1 + 2^-8 (lower even -> down), 1 + 3*2^-8 (upper even -> up).
  EXPECT_EQ(F32ToBF16(Bits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(F32ToBF16(Bits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(F32ToBF16(INFINITY), 0x7F80);
  EXPECT_EQ(F32ToBF16(-INFINITY), 0xFF80);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
  EXPECT_EQ(F32ToBF16(Bits(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to inf
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BF16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBF16(f), h);
    }
  }
}

TEST(HalfConversion, F16MatchesCompilerFloat16) {
  for (uint32_t h = 0; h < 65536; ++h) {  // every f16 survives f16 -> f32 -> f16
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0);
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << h;
  }
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: 0
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: tie to even 2
#if defined(__FLT16_MAX__)
  // GCC's _Float16 conversion (libgcc, round to nearest even) as the reference.
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    if ((u & 0x7F800000u) == 0x7F800000u) continue;
    // Bias exponents into the f16 range so most samples are interesting.
    u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 50u) << 23);
    const float x = Bits(u);
    const _Float16 ref = static_cast<_Float16>(x);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(F32ToF16(x), rb) << std::hex << u;
  }
#else
  ADD_FAILURE() << "this compiler has no _Float16; the f16 reference comparison did not run";
#endif
}

TEST(HostTensorTest, ToF32ConvertsAndRejectsIntegers) {
  std::vector<float> v = {0.1f, -3.0f, 1e-3f};
  HostTensor f32 = HostTensor::FromF32(v.data(), {3});
  EXPECT_EQ(f32.numel(), 3);
  Result<HostTensor> f16 = CastTensor(f32, "F16");
  ASSERT_TRUE(f16.ok());
  Result<std::vector<float>> back = f16->ToF32();
  ASSERT_TRUE(back.ok());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR((*back)[i], v[i], std::fabs(v[i]) * 1e-3);
  HostTensor ints;
  ints.dtype = "I32";
  ints.shape = {1};
  ints.data.resize(4);
  EXPECT_EQ(ints.ToF32().status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(CastTensor(f32, "I8").status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace traind::engine
