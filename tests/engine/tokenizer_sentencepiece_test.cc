// SentencePiece .model files: models trained here with spm_train (unigram and BPE with byte
// fallback) on tinyshakespeare; our ids and decoded text equal spm_encode's and spm_decode's (the
// Debian package sentencepiece) on Shakespeare lines and generated Unicode strings; bad files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace traind::engine::testing {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string JoinIds(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s.push_back(' ');
    s.append(std::to_string(ids[i]));
  }
  return s;
}

class SentencePiece : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = TempDir("traind-spm");
    const std::string shakespeare_path = SharedData("tinyshakespeare.txt");
    if (!FileExists(shakespeare_path)) {
      GTEST_SKIP() << shakespeare_path << " not found (../shared/data)";
    }
    const std::string corpus = ReadAll(shakespeare_path).substr(0, 300000);
    WriteAll(dir_ + "/corpus.txt", corpus);
    const std::string cmd = "/usr/bin/spm_train --input='" + dir_ + "/corpus.txt' --model_prefix='" +
                            dir_ + "/sp' --vocab_size=600 --model_type=" + GetParam() +
                            " --byte_fallback=" + (GetParam() == "bpe" ? "true" : "false") +
                            " --minloglevel=2 >'" + dir_ + "/train.log' 2>&1";
    ASSERT_EQ(Shell(cmd), 0) << "spm_train (Debian package sentencepiece, installed by run.sh) "
                                "failed or is missing: " << cmd << "\n" << ReadAll(dir_ + "/train.log");
    for (const std::string& l : Lines(corpus.substr(0, 40000))) texts_.push_back(l);
    for (std::string s : GeneratedStrings(1500, 5)) {
      for (char& c : s) {
        if (c == '\n' || c == '\r') c = ' ';  // spm_encode reads one text per line
      }
      texts_.push_back(s);
    }
  }
  std::string dir_;
  std::vector<std::string> texts_;
};

TEST_P(SentencePiece, EncodeAndDecodeMatchSpmTools) {
  std::string input;
  for (const auto& t : texts_) input += t + "\n";
  WriteAll(dir_ + "/in.txt", input);
  ASSERT_EQ(Shell("/usr/bin/spm_encode --model='" + dir_ + "/sp.model' --output_format=id <'" +
                  dir_ + "/in.txt' >'" + dir_ + "/ids.txt' 2>'" + dir_ + "/enc.log'"),
            0)
      << ReadAll(dir_ + "/enc.log");
  const std::vector<std::string> ref = Lines(ReadAll(dir_ + "/ids.txt"));
  ASSERT_EQ(ref.size(), texts_.size());
  auto tok = DefaultTokenizerFactory().Open(dir_ + "/sp.model", "");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->kind(), "sentencepiece");
  EXPECT_EQ((*tok)->vocab_size(), 600);
  EXPECT_EQ((*tok)->bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ((*tok)->eos_id(), std::optional<int32_t>(2));
  std::string our_ids;
  int bad = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    auto ids = (*tok)->Encode(texts_[i]);
    ASSERT_TRUE(ids.ok());
    const std::string line = JoinIds(*ids);
    if (line != ref[i] && ++bad <= 5) {
      ADD_FAILURE() << "'" << texts_[i] << "': " << line << " vs spm_encode " << ref[i];
    }
    our_ids += line + "\n";
  }
  EXPECT_EQ(bad, 0);
  WriteAll(dir_ + "/our_ids.txt", our_ids);
  ASSERT_EQ(Shell("/usr/bin/spm_decode --model='" + dir_ + "/sp.model' --input_format=id <'" +
                  dir_ + "/our_ids.txt' >'" + dir_ + "/dec.txt' 2>'" + dir_ + "/dec.log'"),
            0)
      << ReadAll(dir_ + "/dec.log");
  const std::vector<std::string> decoded = Lines(ReadAll(dir_ + "/dec.txt"));
  ASSERT_EQ(decoded.size(), texts_.size());
  bad = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    auto text = (*tok)->Decode(*(*tok)->Encode(texts_[i]));
    ASSERT_TRUE(text.ok());
    if (*text != decoded[i] && ++bad <= 5) {
      ADD_FAILURE() << "decode: '" << *text << "' vs spm_decode '" << decoded[i] << "'";
    }
  }
  EXPECT_EQ(bad, 0);
  // <s> first with add_special_tokens; ids beyond the vocabulary are named.
  auto with_bos = (*tok)->Encode("To be", true);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ(with_bos->front(), 1);
  auto bad_id = (*tok)->Decode({5, 600});
  ASSERT_FALSE(bad_id.ok());
  EXPECT_THAT(bad_id.status().message(), HasSubstr("token id 600 at position 1 is outside"));
  // A folder holding tokenizer.model.
  ASSERT_EQ(Shell("mkdir -p '" + dir_ + "/folder' && cp '" + dir_ + "/sp.model' '" + dir_ +
                  "/folder/tokenizer.model'"),
            0);
  auto folder = DefaultTokenizerFactory().Open(dir_ + "/folder", "");
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ((*folder)->fingerprint(), (*tok)->fingerprint());
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, SentencePiece, ::testing::Values("unigram", "bpe"));

TEST(SentencePieceBadFile, NotAModel) {
  const std::string dir = TempDir("traind-spm-bad");
  WriteAll(dir + "/x.model", "this is not a protobuf \x01\x02\x03");
  auto r = DefaultTokenizerFactory().Open(dir + "/x.model", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(dir + "/x.model: not a SentencePiece model"));
}

}  // namespace
}  // namespace traind::engine::testing
