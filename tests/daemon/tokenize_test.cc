// `trainctl tokenize`: local (no traind), byte tokenizer ids in text and JSON, and a clear usage
// error (exit 2) for tokenizers that are not built yet.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

using ::testing::HasSubstr;

TEST(TrainctlTokenize, ByteIdsAsTextAndJson) {
  CmdResult text = Trainctl({"tokenize", "--tokenizer", "byte", "Hi é"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, "72 105 32 195 169\n");  // UTF-8 bytes of é are two tokens

  const std::string dir = MakeTempDir("traind-tokenize");
  const std::string path = dir + "/t.txt";
  std::ofstream(path, std::ios::binary) << "ab\n";
  CmdResult json = Trainctl({"-o", "json", "tokenize", "--tokenizer", "byte", "--file", path});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["ids"], nlohmann::json::array({97, 98, 10}));
}

TEST(TrainctlTokenize, UnsupportedTokenizerAndMissingFileExitTwo) {
  CmdResult bpe = Trainctl({"tokenize", "--tokenizer", "/x/tokenizer.json", "hi"});
  EXPECT_EQ(bpe.exit_code, 2);
  EXPECT_THAT(bpe.err, HasSubstr("not supported yet"));
  CmdResult missing = Trainctl({"tokenize", "--tokenizer", "byte", "--file", "/nonexistent/f"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/f"));
}

}  // namespace
}  // namespace traind::testing
