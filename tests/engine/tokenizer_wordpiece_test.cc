// WordPiece (BERT) tokenizer.json: ids against an independent Python reference written from the
// BERT algorithm (reference/tokenizer_wordpiece.py) and against Hugging Face tokenizers (Node), on
// generated Unicode strings and tinyshakespeare lines, with a vocabulary built here; [CLS]/[SEP]
// from TemplateProcessing and BertProcessing; decoding against HF; bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "tokenizer_test_util.h"

namespace traind::engine::testing {
namespace {

using ::testing::HasSubstr;

// A vocabulary: specials, frequent lowercase ASCII words of tinyshakespeare, suffix pieces, and
// most single characters of the test texts (every third CJK/Hangul one left out, so [UNK] occurs).
nlohmann::json BuildVocab(const std::vector<std::string>& texts, const std::string& shakespeare) {
  nlohmann::json v = nlohmann::json::object();
  int32_t next = 0;
  auto add = [&](const std::string& t) {
    if (!v.contains(t)) v[t] = next++;
  };
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) add(s);
  std::map<std::string, int> freq;
  std::string word;
  for (char ch : shakespeare) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (c >= 'a' && c <= 'z') {
      word += c;
    } else if (!word.empty()) {
      ++freq[word];
      word.clear();
    }
  }
  std::vector<std::pair<int, std::string>> by_freq;
  for (const auto& [w, n] : freq) by_freq.emplace_back(-n, w);
  std::sort(by_freq.begin(), by_freq.end());
  for (size_t i = 0; i < by_freq.size() && i < 3000; ++i) add(by_freq[i].second);
  for (const char* s : {"##s", "##ing", "##ed", "##er", "##ly", "##est", "##'s", "un", "re"}) add(s);
  for (const auto& t : texts) {
    size_t p = 0;
    while (p < t.size()) {
      const uint32_t cp = unicode::DecodeUtf8(t, &p);
      const bool cjk = (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
      if (cjk && cp % 3 == 0) continue;
      std::string ch = Utf8(cp);
      if (cp < 0x80) ch = std::string(1, static_cast<char>(std::tolower(static_cast<int>(cp))));
      add(ch);
      add("##" + ch);
    }
  }
  return v;
}

nlohmann::json BertTokenizerJson(const nlohmann::json& vocab, bool template_processing) {
  const int32_t cls = vocab["[CLS]"], sep = vocab["[SEP]"];
  nlohmann::json added = nlohmann::json::array();
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    added.push_back({{"id", vocab[s]}, {"content", s}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  nlohmann::json post;
  if (template_processing) {
    post = {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                        {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}},
            {"pair", {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                      {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}},
                      {{"Sequence", {{"id", "B"}, {"type_id", 1}}}},
                      {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 1}}}}}},
            {"special_tokens",
             {{"[CLS]", {{"id", "[CLS]"}, {"ids", {cls}}, {"tokens", {"[CLS]"}}}},
              {"[SEP]", {{"id", "[SEP]"}, {"ids", {sep}}, {"tokens", {"[SEP]"}}}}}}};
  } else {
    post = {{"type", "BertProcessing"}, {"sep", {"[SEP]", sep}}, {"cls", {"[CLS]", cls}}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true},
                          {"handle_chinese_chars", true}, {"strip_accents", nullptr},
                          {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor", post},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"},
                     {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", 20},
                     {"vocab", vocab}}}};
}

class WordPiece : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("traind-wordpiece");
    const std::string shakespeare_path = SharedData("tinyshakespeare.txt");
    const std::string shakespeare =
        FileExists(shakespeare_path) ? ReadAll(shakespeare_path).substr(0, 300000)
                                     : std::string("First Citizen:\nBefore we proceed any further, hear me speak.\n");
    texts_ = GeneratedStrings(2500, 7);
    // Shakespeare lines, some upper-cased, and edge cases.
    size_t p = 0;
    for (int i = 0; i < 300 && p < shakespeare.size(); ++i) {
      const size_t nl = shakespeare.find('\n', p);
      std::string line = shakespeare.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
      if (i % 3 == 0) std::transform(line.begin(), line.end(), line.begin(), ::toupper);
      texts_.push_back(line);
      p = nl == std::string::npos ? shakespeare.size() : nl + 1;
    }
    for (const char* s : {"", " ", "[CLS] hello [SEP]", "Héllo, WÖRLD!", "don't stop",
                          "aaaaaaaaaaaaaaaaaaaaaaaaa", "x\u0000y\ufffdz", "ﬁ ﬂ Ⅻ ²", "İ ΣΑΣ"}) {
      texts_.emplace_back(s);
    }
    vocab_ = BuildVocab(texts_, shakespeare);
    json_path_ = dir_ + "/tokenizer.json";
    WriteAll(json_path_, BertTokenizerJson(vocab_, true).dump());
  }

  std::vector<std::vector<int32_t>> PythonReference(bool add_special) {
    nlohmann::json req = {{"vocab", vocab_}, {"texts", texts_}, {"unk", "[UNK]"},
                          {"max_chars", 20}, {"lowercase", true}, {"cls", "[CLS]"},
                          {"sep", "[SEP]"}, {"add_special_tokens", add_special},
                          {"specials", {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}}};
    WriteAll(dir_ + "/req.json", req.dump());
    const std::string cmd = std::string(TRAIND_TEST_PYTHON) + " '" + TRAIND_TESTS_DIR +
                            "/reference/tokenizer_wordpiece.py' '" + dir_ + "/req.json' '" + dir_ +
                            "/out.json' 2>'" + dir_ + "/py.log'";
    if (Shell(cmd) != 0) {
      ADD_FAILURE() << cmd << " failed: " << ReadAll(dir_ + "/py.log");
      return {};
    }
    return nlohmann::json::parse(ReadAll(dir_ + "/out.json"))["ids"]
        .get<std::vector<std::vector<int32_t>>>();
  }

  std::string dir_, json_path_;
  std::vector<std::string> texts_;
  nlohmann::json vocab_;
};

TEST_F(WordPiece, MatchesBertReferenceAndHuggingFace) {
  auto tok = DefaultTokenizerFactory().Open(json_path_, "");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->kind(), "wordpiece");
  EXPECT_EQ((*tok)->vocab_size(), static_cast<int64_t>(vocab_.size()));
  EXPECT_EQ((*tok)->pad_id(), std::optional<int32_t>(0));
  for (bool special : {false, true}) {
    const auto py = PythonReference(special);
    ASSERT_EQ(py.size(), texts_.size());
    ReferenceResult hf;
    ASSERT_TRUE(RunReference(json_path_, texts_, special, {}, false, &hf));
    int bad_py = 0, bad_hf = 0, unk = 0;
    for (size_t i = 0; i < texts_.size(); ++i) {
      auto ids = (*tok)->Encode(texts_[i], special);
      ASSERT_TRUE(ids.ok());
      unk += static_cast<int>(std::count(ids->begin(), ids->end(), 1));
      if (special) {
        ASSERT_GE(ids->size(), 2u);
        EXPECT_EQ(ids->front(), vocab_["[CLS]"].get<int32_t>());
        EXPECT_EQ(ids->back(), vocab_["[SEP]"].get<int32_t>());
      }
      if (*ids != py[i] && ++bad_py <= 5) {
        ADD_FAILURE() << "text " << i << " '" << texts_[i] << "': " << ::testing::PrintToString(*ids)
                      << " vs Python BERT reference " << ::testing::PrintToString(py[i]);
      }
      if (*ids != hf.ids[i] && ++bad_hf <= 5) {
        ADD_FAILURE() << "text " << i << " '" << texts_[i] << "': " << ::testing::PrintToString(*ids)
                      << " vs HF tokenizers " << ::testing::PrintToString(hf.ids[i]);
      }
    }
    EXPECT_EQ(bad_py, 0);
    EXPECT_EQ(bad_hf, 0);
    EXPECT_GT(unk, 50);  // the vocabulary leaves some characters out on purpose
  }
}

TEST_F(WordPiece, BertProcessingAddsTheSameSpecials) {
  const std::string path = dir_ + "/bert_processing.json";
  WriteAll(path, BertTokenizerJson(vocab_, false).dump());
  auto a = DefaultTokenizerFactory().Open(json_path_, "");
  auto b = DefaultTokenizerFactory().Open(path, "");
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < 200; ++i) {
    EXPECT_EQ(*(*a)->Encode(texts_[i], true), *(*b)->Encode(texts_[i], true));
  }
  EXPECT_NE((*a)->fingerprint(), (*b)->fingerprint());
}

TEST_F(WordPiece, DecodeMatchesHuggingFace) {
  auto tok = DefaultTokenizerFactory().Open(json_path_, "");
  ASSERT_TRUE(tok.ok());
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < texts_.size(); i += 5) ids.push_back(*(*tok)->Encode(texts_[i], true));
  ReferenceResult keep, skip;
  ASSERT_TRUE(RunReference(json_path_, {}, false, ids, false, &keep));
  ASSERT_TRUE(RunReference(json_path_, {}, false, ids, true, &skip));
  int bad = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string k = *(*tok)->Decode(ids[i], false), s = *(*tok)->Decode(ids[i], true);
    if ((k != keep.decoded[i] || s != skip.decoded[i]) && ++bad <= 5) {
      ADD_FAILURE() << "'" << k << "' / '" << s << "' vs HF '" << keep.decoded[i] << "' / '"
                    << skip.decoded[i] << "'";
    }
  }
  EXPECT_EQ(bad, 0);
  auto out_of_range = (*tok)->Decode({2, static_cast<int32_t>(vocab_.size())});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("at position 1 is outside the vocabulary"));
}

TEST_F(WordPiece, BadFiles) {
  nlohmann::json j = BertTokenizerJson(vocab_, true);
  j["model"]["unk_token"] = "<unk>";
  WriteAll(dir_ + "/nounk.json", j.dump());
  auto nounk = DefaultTokenizerFactory().Open(dir_ + "/nounk.json", "");
  ASSERT_FALSE(nounk.ok());
  EXPECT_THAT(nounk.status().message(), HasSubstr("model.unk_token '<unk>' is not in model.vocab"));
  j = BertTokenizerJson(vocab_, true);
  j["normalizer"] = {{"type", "NFKC"}};
  WriteAll(dir_ + "/nfkc.json", j.dump());
  auto nfkc = DefaultTokenizerFactory().Open(dir_ + "/nfkc.json", "");
  ASSERT_FALSE(nfkc.ok());
  EXPECT_EQ(nfkc.status().code(), Status::Code::kUnimplemented);
  EXPECT_THAT(nfkc.status().message(), HasSubstr("normalizer type NFKC in " + dir_ + "/nfkc.json"));
  j = BertTokenizerJson(vocab_, true);
  j["post_processor"]["special_tokens"].erase("[SEP]");
  WriteAll(dir_ + "/nosep.json", j.dump());
  auto nosep = DefaultTokenizerFactory().Open(dir_ + "/nosep.json", "");
  ASSERT_FALSE(nosep.ok());
  EXPECT_THAT(nosep.status().message(), HasSubstr("post_processor.single[2]: special token '[SEP]'"));
}

}  // namespace
}  // namespace traind::engine::testing
