// `trainctl tokenize`: local (no traind) for every tokenizer kind (byte, GPT-2 BPE from
// vocab.json + merges.txt, a WordPiece tokenizer.json, a SentencePiece .model trained here and
// checked against spm_encode), ids in text and JSON, and one clear sentence with exit 2 for bad
// tokenizer files and missing input; `traind run` on BPE and SentencePiece ids.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

using ::testing::EndsWith;
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

TEST(TrainctlTokenize, Gpt2BpeFolder) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  struct stat st;
  if (::stat((gpt2 + "/vocab.json").c_str(), &st) != 0) {
    GTEST_SKIP() << "GPT-2 vocab.json not found in " << gpt2 << " (../shared/data)";
  }
  // GPT-2's published ids: "Hello" 15496, " world" 995, "!" 0, "<|endoftext|>" 50256.
  CmdResult text = Trainctl({"tokenize", "--tokenizer", gpt2, "Hello world!<|endoftext|>"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, "15496 995 0 50256\n");
  const std::string dir = MakeTempDir("traind-tokenize");
  WriteAll(dir + "/in.txt", "Hello world");
  CmdResult json = Trainctl({"-o", "json", "tokenize", "--tokenizer", gpt2, "--file", dir + "/in.txt"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["ids"], nlohmann::json::array({15496, 995}));
}

TEST(TrainctlTokenize, WordPieceTokenizerJson) {
  const std::string dir = MakeTempDir("traind-tokenize");
  nlohmann::json j = {
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true},
                      {"handle_chinese_chars", true}, {"strip_accents", nullptr},
                      {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"},
                 {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", 100},
                 {"vocab", {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3},
                            {"hello", 4}, {"world", 5}, {"##s", 6}, {",", 7}}}}}};
  WriteAll(dir + "/tokenizer.json", j.dump());
  // Lowercased, accent-free, "," isolated, "worlds" = world ##s, "xyz" unknown.
  CmdResult r = Trainctl({"tokenize", "--tokenizer", dir + "/tokenizer.json", "HÉLLO, Worlds xyz"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "4 7 5 6 1\n");
  CmdResult folder = Trainctl({"-o", "json", "tokenize", "--tokenizer", dir, "hello"});
  ASSERT_EQ(folder.exit_code, 0) << folder.err;
  EXPECT_EQ(nlohmann::json::parse(folder.out)["ids"], nlohmann::json::array({4}));
}

TEST(TrainctlTokenize, SentencePieceModelMatchesSpmEncode) {
  const std::string dir = MakeTempDir("traind-tokenize");
  // Words of 1-3 syllables in a fixed pseudo-random order: enough variety for 300 pieces.
  static const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po",
                                     "qua", "rin", "dor", "fel", "gim", "hap", "jus", "lek",
                                     "mon", "nix"};
  std::string corpus;
  uint32_t x = 12345;
  auto next = [&x](uint32_t k) { x = x * 1103515245u + 12345u; return (x >> 16) % k; };
  for (int line = 0; line < 3000; ++line) {
    for (uint32_t w = 3 + next(10); w > 0; --w) {
      for (uint32_t s = 1 + next(3); s > 0; --s) corpus += kSyllables[next(20)];
      corpus += w > 1 ? " " : "\n";
    }
  }
  WriteAll(dir + "/corpus.txt", corpus);
  CmdResult train = RunCommand({"/usr/bin/spm_train", "--input=" + dir + "/corpus.txt",
                                "--model_prefix=" + dir + "/sp", "--vocab_size=300",
                                "--model_type=unigram", "--minloglevel=2"});
  ASSERT_EQ(train.exit_code, 0) << "/usr/bin/spm_train (Debian package sentencepiece, installed by run.sh) failed or is missing: " << train.err;
  const std::string text = "kalo mine rusa 42 tovi zepo, the quick fox";
  WriteAll(dir + "/in.txt", text + "\n");
  CmdResult spm = RunCommand({"/usr/bin/spm_encode", "--model=" + dir + "/sp.model",
                              "--output_format=id", "--input=" + dir + "/in.txt"});
  ASSERT_EQ(spm.exit_code, 0) << spm.err;
  CmdResult ours = Trainctl({"tokenize", "--tokenizer", dir + "/sp.model", text});
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  EXPECT_EQ(ours.out, spm.out);
  EXPECT_GT(ours.out.size(), 4u);
}

// `traind run` trains on a tokenizer's ids: GPT-2 BPE (vocab 50257) and a SentencePiece model
// (through the dlopen shim, in a binary that also links gRPC's protobuf), and caches the ids.
TEST(TraindRunTokenizers, TrainsOnBpeAndSentencePieceIds) {
  const std::string gpt2 = std::string(TRAIND_SHARED_DATA) + "/gpt2";
  struct stat st;
  if (::stat((gpt2 + "/vocab.json").c_str(), &st) != 0) {
    GTEST_SKIP() << "GPT-2 vocab.json not found in " << gpt2 << " (../shared/data)";
  }
  const std::string dir = MakeTempDir("traind-run-tok");
  ::setenv("TRAIND_TOKEN_CACHE_DIR", (dir + "/cache").c_str(), 1);
  std::string corpus;
  for (int i = 0; i < 400; ++i) {
    corpus += "ROMEO: But soft, what light through yonder window breaks? It is the east " +
              std::to_string(i) + ".\n";
  }
  WriteAll(dir + "/data.txt", corpus);
  CmdResult train = RunCommand({"/usr/bin/spm_train", "--input=" + dir + "/data.txt",
                                "--model_prefix=" + dir + "/sp", "--vocab_size=80",
                                "--model_type=bpe", "--minloglevel=2"});
  ASSERT_EQ(train.exit_code, 0) << "/usr/bin/spm_train: " << train.err;
  struct Case {
    std::string tokenizer;
    int vocab;
  };
  for (const Case& c : {Case{gpt2, 50257}, Case{dir + "/sp.model", 80}}) {
    const std::string spec =
        "model:\n  arch: gpt2\n  config: {vocab_size: " + std::to_string(c.vocab) +
        ", n_positions: 32, n_embd: 16, n_layer: 1, n_head: 2}\n"
        "data:\n  train_file: " + dir + "/data.txt\n  tokenizer: " + c.tokenizer +
        "\n  seq_len: 16\n  validation_split: 0.1\n"
        "training: {max_steps: 3, per_device_train_batch_size: 2, logging_steps: 1, eval_steps: 3, "
        "save_steps: 100}\noutput_dir: " + dir + "/out-" + std::to_string(c.vocab) + "\n";
    WriteAll(dir + "/job.yaml", spec);
    CmdResult run = RunCommand({TRAIND_BIN, "run", dir + "/job.yaml"}, 300);
    ASSERT_EQ(run.exit_code, 0) << c.tokenizer << "\n" << run.out << run.err;
    EXPECT_THAT(run.out + run.err, HasSubstr("done: 3 steps")) << c.tokenizer;
  }
  // One cache file per tokenizer.
  CmdResult ls = RunCommand({"/bin/ls", dir + "/cache"});
  EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), 2) << ls.out;
  ::unsetenv("TRAIND_TOKEN_CACHE_DIR");
}

TEST(TrainctlTokenize, BadTokenizerFileAndMissingInputExitTwo) {
  const std::string dir = MakeTempDir("traind-tokenize");
  WriteAll(dir + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  CmdResult bad = Trainctl({"tokenize", "--tokenizer", dir + "/tokenizer.json", "hi"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr(dir + "/tokenizer.json: not valid JSON"));
  EXPECT_THAT(bad.err, EndsWith("\n"));
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;  // one sentence
  WriteAll(dir + "/u.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  CmdResult uni = Trainctl({"tokenize", "--tokenizer", dir + "/u.json", "hi"});
  EXPECT_EQ(uni.exit_code, 2);
  EXPECT_THAT(uni.err, HasSubstr("model type Unigram in " + dir + "/u.json is not supported"));
  CmdResult none = Trainctl({"tokenize", "--tokenizer", dir + "/nope", "hi"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr(dir + "/nope: no such file or folder"));
  CmdResult missing = Trainctl({"tokenize", "--tokenizer", "byte", "--file", "/nonexistent/f"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/f"));
}

// `tokenize --spec`: the spec's first training examples (text, ids, labels) as text and as
// {"examples":[{"text","input_ids","labels"}]}; the expected labels worked out here for the byte
// tokenizer (token i = byte i) from the template's text: only the assistant's answer and its end
// marker carry loss with assistant_only_loss.
std::string InstructSpec(const std::string& dir, const std::string& extra) {
  WriteAll(dir + "/t.jinja",
           "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}");
  std::string lines;
  for (const char* a : {"4", "blue", "no"}) {
    lines += std::string(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":")") +
             a + "\"}]}\n";
  }
  WriteAll(dir + "/chat.jsonl", lines);
  const std::string spec =
      "model:\n  arch: llama\n  config: {vocab_size: 256, hidden_size: 16, intermediate_size: 32, "
      "num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
      "max_position_embeddings: 64}\n"
      "data:\n  train_file: chat.jsonl\n  format: jsonl\n  tokenizer: byte\n  chat_template: t.jinja\n"
      "  seq_len: 60\n  validation_split: 0\n  shuffle: false\n" + extra +
      "training: {max_steps: 2, per_device_train_batch_size: 2, logging_steps: 1, save_steps: 100}\n"
      "output_dir: out\n";
  WriteAll(dir + "/job.yaml", spec);
  return dir + "/job.yaml";
}

TEST(TrainctlTokenize, SpecExamplesAsTextAndJson) {
  const std::string dir = MakeTempDir("traind-tokenize-spec");
  InstructSpec(dir, "  assistant_only_loss: true\n");
  // Paths resolve against the working directory, as submit's do.
  CmdResult json = RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && '" + std::string(TRAINCTL_BIN) +
                                                    "' -o json tokenize --spec job.yaml --examples 2"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j.size(), 1u);
  ASSERT_EQ(j["examples"].size(), 2u);
  const std::string prompt = "<user>q</user>\n<assistant>";
  for (int e = 0; e < 2; ++e) {
    const std::string answer = std::string(e == 0 ? "4" : "blue") + "</assistant>\n";
    const std::string text = prompt + answer;
    const nlohmann::json& x = j["examples"][e];
    ASSERT_EQ(x.size(), 3u);
    EXPECT_EQ(x["text"], text);
    std::vector<int> ids, labels;
    for (size_t i = 0; i < text.size(); ++i) {
      ids.push_back(static_cast<unsigned char>(text[i]));
      labels.push_back(i >= prompt.size() ? ids.back() : -100);
    }
    EXPECT_EQ(x["input_ids"], nlohmann::json(ids));
    EXPECT_EQ(x["labels"], nlohmann::json(labels));
  }
  CmdResult text = RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && '" + std::string(TRAINCTL_BIN) +
                                                    "' tokenize --spec job.yaml"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("example 1: 40 tokens, 14 with loss\n"
                                  "text: \"<user>q</user>\\n<assistant>4</assistant>\\n\"\n"
                                  "input_ids: 60 117 115 101 114 62 113 "));
  EXPECT_THAT(text.out, HasSubstr("example 3: "));
  EXPECT_THAT(text.out, HasSubstr("labels: -100 -100 "));
  // Errors: one sentence, exit 2.
  WriteAll(dir + "/chat.jsonl", R"({"messages":[{"role":"user","content":5}]})" "\n");
  CmdResult bad = RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && '" + std::string(TRAINCTL_BIN) +
                                                   "' tokenize --spec job.yaml"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("chat.jsonl line 1: messages[0].content: expected a string, got number"));
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  // With packing the examples shown are the same (before packing).
  InstructSpec(dir, "  assistant_only_loss: true\n  packing: true\n");
  CmdResult packing = RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && '" + std::string(TRAINCTL_BIN) +
                                                       "' tokenize --spec job.yaml"});
  ASSERT_EQ(packing.exit_code, 0) << packing.err;
  EXPECT_THAT(packing.out, HasSubstr("example 1: 40 tokens, 14 with loss\n"));
  CmdResult neither = Trainctl({"tokenize"});
  EXPECT_EQ(neither.exit_code, 2);
}

// `traind run` instruction-tunes on conversational jsonl.
TEST(TraindRunInstruction, TrainsOnConversations) {
  const std::string dir = MakeTempDir("traind-run-instruct");
  InstructSpec(dir, "  assistant_only_loss: true\n");
  CmdResult run = RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && '" + std::string(TRAIND_BIN) +
                                                   "' run job.yaml"}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out + run.err, HasSubstr("done: 2 steps"));
  const nlohmann::json state = nlohmann::json::parse(ReadAll(dir + "/out/trainer_state.json"));
  EXPECT_EQ(state["global_step"], 2);
  // The chat template beside the model, for trainctl generate --chat.
  EXPECT_EQ(ReadAll(dir + "/out/chat_template.jinja"), ReadAll(dir + "/t.jinja"));
}

}  // namespace
}  // namespace traind::testing
