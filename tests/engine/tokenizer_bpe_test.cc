// Byte-level BPE tokenizers against Hugging Face tokenizers (Node bindings) on the same files:
// GPT-2 (vocab.json + merges.txt and tokenizer.json) on tinyshakespeare and generated Unicode
// text, the LLaMA-3 pre-tokenizer, added/special tokens; decode(encode(s)) == s; bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tokenizer_test_util.h"

namespace traind::engine::testing {
namespace {

using ::testing::HasSubstr;

class Gpt2Bpe : public ::testing::Test {
 protected:
  void SetUp() override {
    gpt2_dir_ = SharedData("gpt2");
    if (!FileExists(gpt2_dir_ + "/vocab.json") || !FileExists(gpt2_dir_ + "/merges.txt")) {
      GTEST_SKIP() << "GPT-2 vocab.json/merges.txt not found in " << gpt2_dir_
                   << " (../shared/data is the project's test data; see its README)";
    }
    dir_ = TempDir("traind-bpe");
    json_path_ = dir_ + "/tokenizer.json";
    WriteAll(json_path_, Gpt2TokenizerJson(gpt2_dir_).dump());
  }
  std::unique_ptr<Tokenizer> Open(const std::string& what) {
    auto t = DefaultTokenizerFactory().Open(what, "");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::string gpt2_dir_, dir_, json_path_;
};

TEST_F(Gpt2Bpe, TinyShakespeareMatchesReference) {
  const std::string path = SharedData("tinyshakespeare.txt");
  ASSERT_TRUE(FileExists(path)) << path;
  const std::string text = ReadAll(path);
  ReferenceResult ref;
  ASSERT_TRUE(RunReference(json_path_, {text}, false, {}, false, &ref));
  ASSERT_EQ(ref.ids.size(), 1u);
  auto folder = Open(gpt2_dir_);
  auto file = Open(json_path_);
  ASSERT_TRUE(folder && file);
  EXPECT_EQ(folder->kind(), "bpe");
  EXPECT_EQ(folder->vocab_size(), 50257);
  EXPECT_EQ(folder->eos_id(), std::optional<int32_t>(50256));
  auto a = folder->Encode(text);
  auto b = file->Encode(text);
  auto c = file->EncodeLarge(text, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_GT(a->size(), 300000u);
  EXPECT_TRUE(*a == ref.ids[0]) << "vocab.json + merges.txt: ids differ from the reference";
  EXPECT_TRUE(*b == ref.ids[0]) << "tokenizer.json: ids differ from the reference";
  EXPECT_TRUE(*c == ref.ids[0]) << "EncodeLarge (2 threads): ids differ from the reference";
  auto back = file->Decode(*a);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == text);
}

TEST_F(Gpt2Bpe, GeneratedUnicodeMatchesReferenceAndRoundTrips) {
  const std::vector<std::string> texts = GeneratedStrings(3000, 12);
  ReferenceResult ref;
  ASSERT_TRUE(RunReference(json_path_, texts, false, {}, false, &ref));
  ASSERT_EQ(ref.ids.size(), texts.size());
  auto tok = Open(json_path_);
  ASSERT_TRUE(tok);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok->Encode(texts[i]);
    ASSERT_TRUE(ids.ok());
    if (*ids != ref.ids[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << i << " '" << texts[i] << "': ids differ from the reference "
                    << ::testing::PrintToString(*ids) << " vs "
                    << ::testing::PrintToString(ref.ids[i]);
    }
    auto back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, texts[i]) << "text " << i;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Gpt2Bpe, DecodingArbitraryIdsMatchesReference) {
  // Random id sequences cut UTF-8 characters anywhere: invalid sequences must become U+FFFD
  // exactly as HF's from_utf8_lossy does.
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 400; ++i) {
    std::vector<int32_t> ids(1 + rng() % 12);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % (i % 2 ? 256 : 50257));
    seqs.push_back(ids);
  }
  ReferenceResult ref;
  ASSERT_TRUE(RunReference(json_path_, {}, false, seqs, false, &ref));
  auto tok = Open(json_path_);
  ASSERT_TRUE(tok);
  int bad = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto text = tok->Decode(seqs[i]);
    ASSERT_TRUE(text.ok());
    if (*text != ref.decoded[i] && ++bad <= 5) {
      ADD_FAILURE() << ::testing::PrintToString(seqs[i]) << ": '" << *text << "' vs '"
                    << ref.decoded[i] << "'";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(Gpt2Bpe, Llama3PreTokenizerMatchesReference) {
  // LLaMA-3's tokenizer.json shape (Split with its pattern, then ByteLevel without regex,
  // ignore_merges, <|begin_of_text|> added by a TemplateProcessing), on GPT-2's vocabulary.
  nlohmann::json j = Gpt2TokenizerJson(gpt2_dir_);
  const std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
         {"use_regex", false}}}}};
  j["model"]["ignore_merges"] = true;
  j["added_tokens"].push_back({{"id", 50257}, {"content", "<|begin_of_text|>"},
                               {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                               {"normalized", false}, {"special", true}});
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
         {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {50257}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const std::string path = dir_ + "/llama3.json";
  WriteAll(path, j.dump());
  std::vector<std::string> texts = GeneratedStrings(2000, 99);
  texts.push_back(ReadAll(SharedData("tinyshakespeare.txt")).substr(0, 200000));
  ReferenceResult ref;
  ASSERT_TRUE(RunReference(path, texts, true, {}, false, &ref));
  auto tok = Open(path);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 50258);
  EXPECT_EQ(tok->bos_id(), std::optional<int32_t>(50257));
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok->Encode(texts[i], /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok());
    ASSERT_FALSE(ids->empty());
    EXPECT_EQ((*ids)[0], 50257);
    if (*ids != ref.ids[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << i << " '" << texts[i].substr(0, 200) << "': "
                    << ::testing::PrintToString(*ids) << " vs reference "
                    << ::testing::PrintToString(ref.ids[i]);
    }
    auto back = tok->Decode(*ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, texts[i]);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Gpt2Bpe, AddPrefixSpaceMatchesReference) {
  // RoBERTa-style: ByteLevel with add_prefix_space (a space before each piece of plain text).
  nlohmann::json j = Gpt2TokenizerJson(gpt2_dir_);
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const std::string path = dir_ + "/prefix.json";
  WriteAll(path, j.dump());
  std::vector<std::string> texts = GeneratedStrings(1000, 41);
  texts.insert(texts.end(), {"Hello", " Hello", "a<|endoftext|>b", "<|endoftext|> x", ""});
  ReferenceResult ref;
  ASSERT_TRUE(RunReference(path, texts, false, {}, false, &ref));
  auto tok = Open(path);
  ASSERT_TRUE(tok);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok->Encode(texts[i]);
    ASSERT_TRUE(ids.ok());
    if (*ids != ref.ids[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "'" << texts[i] << "': " << ::testing::PrintToString(*ids) << " vs "
                    << ::testing::PrintToString(ref.ids[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(*tok->Encode("Hello"), (std::vector<int32_t>{18435}));  // "ĠHello"
}

TEST_F(Gpt2Bpe, AddedAndSpecialTokensAreNeverSplit) {
  nlohmann::json j = Gpt2TokenizerJson(gpt2_dir_);
  j["added_tokens"].push_back({{"id", 50257}, {"content", "<|im_start|>"}, {"single_word", false},
                               {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                               {"special", true}});
  j["added_tokens"].push_back({{"id", 50258}, {"content", "<|im_end|>"}, {"single_word", false},
                               {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                               {"special", true}});
  j["added_tokens"].push_back({{"id", 50259}, {"content", " [MASK]"}, {"single_word", false},
                               {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                               {"special", false}});
  const std::string path = dir_ + "/added.json";
  WriteAll(path, j.dump());
  const std::vector<std::string> texts = {
      "<|im_start|>user\nhello<|im_end|>",
      "a<|endoftext|>b<|endoftext|><|endoftext|>c",
      "x<|im_start|><|im_end|>y <|im_start|> z",
      "The [MASK] sat [MASK][MASK] on<|endoftext|>",
      "<|im_start<|im_start|>|>",
      "<|endoftext|",
  };
  std::vector<std::vector<int32_t>> decode_in;
  auto tok = Open(path);
  ASSERT_TRUE(tok);
  for (const auto& t : texts) decode_in.push_back(*tok->Encode(t));
  ReferenceResult ref, ref_skip;
  ASSERT_TRUE(RunReference(path, texts, false, decode_in, false, &ref));
  ASSERT_TRUE(RunReference(path, {}, false, decode_in, true, &ref_skip));
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(decode_in[i], ref.ids[i]) << texts[i];
    EXPECT_EQ(*tok->Decode(decode_in[i]), ref.decoded[i]) << texts[i];
    EXPECT_EQ(*tok->Decode(decode_in[i], true), ref_skip.decoded[i]) << texts[i];
  }
  // Our own check of the property: each written special token is exactly its one id.
  auto ids = *tok->Encode("a<|endoftext|>b<|im_start|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50257), 1);
  EXPECT_EQ(*tok->Decode(ids, true), "ab");
}

TEST_F(Gpt2Bpe, FolderOrderAndFingerprints) {
  // A folder with tokenizer.json wins over vocab.json + merges.txt.
  const std::string folder = dir_ + "/both";
  ASSERT_EQ(Shell("mkdir -p '" + folder + "' && cp '" + gpt2_dir_ + "/vocab.json' '" + gpt2_dir_ +
                  "/merges.txt' '" + folder + "/'"),
            0);
  auto vm = Open(folder);
  ASSERT_TRUE(vm);
  nlohmann::json j = Gpt2TokenizerJson(gpt2_dir_);
  j["added_tokens"].push_back({{"id", 50257}, {"content", "<|x|>"}, {"special", true}});
  WriteAll(folder + "/tokenizer.json", j.dump());
  auto tj = Open(folder);
  ASSERT_TRUE(tj);
  EXPECT_EQ(tj->vocab_size(), 50258);
  EXPECT_NE(tj->fingerprint(), vm->fingerprint());
  EXPECT_EQ(Open(folder)->fingerprint(), tj->fingerprint());  // stable
  EXPECT_EQ(tj->fingerprint().rfind("bpe:", 0), 0u);
  // init_from: its folder is the default when data.tokenizer is empty.
  auto from_init = DefaultTokenizerFactory().Open("", folder);
  ASSERT_TRUE(from_init.ok()) << from_init.status().ToString();
  EXPECT_EQ((*from_init)->fingerprint(), tj->fingerprint());
}

TEST_F(Gpt2Bpe, BadInputsSayWhatAndWhere) {
  // Malformed JSON: the file, the line and the column.
  WriteAll(dir_ + "/broken.json", "{\n  \"model\": {\n    \"type\": \"BPE\",\n    \"vocab\": {\"a\": 0,}\n");
  auto broken = DefaultTokenizerFactory().Open(dir_ + "/broken.json", "");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr(dir_ + "/broken.json: not valid JSON"));
  EXPECT_THAT(broken.status().message(), HasSubstr("line 4"));
  // Unsupported model type.
  WriteAll(dir_ + "/unigram.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  auto uni = DefaultTokenizerFactory().Open(dir_ + "/unigram.json", "");
  ASSERT_FALSE(uni.ok());
  EXPECT_EQ(uni.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(uni.status().message(),
              HasSubstr("data.tokenizer: model type Unigram in " + dir_ +
                        "/unigram.json is not supported"));
  // A merge that names a token missing from the vocabulary.
  nlohmann::json j = Gpt2TokenizerJson(gpt2_dir_);
  j["model"]["merges"].push_back("Ġzzzzqq Ġxxyyy");
  WriteAll(dir_ + "/badmerge.json", j.dump());
  auto bad_merge = DefaultTokenizerFactory().Open(dir_ + "/badmerge.json", "");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_THAT(bad_merge.status().message(), HasSubstr("merge 50000"));
  EXPECT_THAT(bad_merge.status().message(), HasSubstr("not in the vocabulary"));
  // Missing files.
  auto missing = DefaultTokenizerFactory().Open(dir_ + "/nope.json", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_ + "/nope.json: no such file"));
  ASSERT_EQ(Shell("mkdir -p '" + dir_ + "/empty'"), 0);
  auto empty = DefaultTokenizerFactory().Open(dir_ + "/empty", "");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("has no tokenizer files"));
  // Decoding an id beyond the vocabulary names the id and its position.
  auto tok = Open(json_path_);
  auto dec = tok->Decode({15496, 50257});
  ASSERT_FALSE(dec.ok());
  EXPECT_EQ(dec.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(dec.status().message(),
              HasSubstr("token id 50257 at position 1 is outside the vocabulary [0, 50257)"));
  EXPECT_FALSE(tok->Decode({-1}).ok());
}

TEST_F(Gpt2Bpe, ConcurrentEncodeAndDecodeAgreeWithSequential) {
  auto tok = Open(json_path_);
  ASSERT_TRUE(tok);
  const std::vector<std::string> texts = GeneratedStrings(800, 3);
  std::vector<std::vector<int32_t>> want;
  {
    auto fresh = Open(json_path_);  // its own (cold) cache
    for (const auto& t : texts) want.push_back(*fresh->Encode(t));
  }
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = static_cast<size_t>(th); i < texts.size(); i += 2) {
          auto ids = tok->Encode(texts[i]);
          auto back = tok->Decode(*ids);
          if (!ids.ok() || *ids != want[i] || !back.ok() || *back != texts[i]) ++bad;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ByteTokenizer, BytesAreIds) {
  auto tok = DefaultTokenizerFactory().Open("byte", "");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->kind(), "byte");
  EXPECT_EQ((*tok)->vocab_size(), 256);
  EXPECT_EQ(*(*tok)->Encode("Hi é"), (std::vector<int32_t>{72, 105, 32, 195, 169}));
  EXPECT_EQ(*(*tok)->Decode({72, 105, 32, 195, 169}), "Hi é");
  EXPECT_FALSE((*tok)->Decode({256}).ok());
  auto dflt = DefaultTokenizerFactory().Open("", "");  // no tokenizer, no init_from: byte
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ((*dflt)->kind(), "byte");
}

}  // namespace
}  // namespace traind::engine::testing
