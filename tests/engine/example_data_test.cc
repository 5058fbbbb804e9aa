// Example data for bert (engine/src/data/example_data.h): labelled jsonl examples through a
// WordPiece tokenizer.json made here and through the byte tokenizer (labels by integer and by
// name, truncation keeping [SEP], padding and the attention mask, errors naming file, line and
// field), the masked-LM masking (15% of the eligible positions, 80/10/10, never a special or
// padded position, a pure function of (seed, epoch, example, position)), the loader's order and
// resume, and the validation split.
#include "data/example_data.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace traind::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// [PAD] 0 [UNK] 1 [CLS] 2 [SEP] 3 [MASK] 4, then words.
const std::vector<std::string> kWords = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",
                                         "movie", "was",   "good",  "bad",   "very",   "film",
                                         "a",     "##s",   "it",    "is",    "not",    "fun"};

nlohmann::json TinyBertTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < kWords.size(); ++i) vocab[kWords[i]] = static_cast<int>(i);
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 5; ++i) {
    added.push_back({{"id", i}, {"content", kWords[static_cast<size_t>(i)]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true},
                          {"handle_chinese_chars", true}, {"strip_accents", nullptr},
                          {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"},
                     {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", 100},
                     {"vocab", vocab}}}};
}

class ExampleDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("traind_examples_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tokenizer.json") << TinyBertTokenizerJson().dump();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  DataSpec Spec(const std::string& file, int64_t T, bool wordpiece) {
    DataSpec d;
    d.train_file = file;
    d.format = "jsonl";
    d.label_field = "label";
    d.seq_len = T;
    d.validation_split = 0.0;
    d.tokenizer = wordpiece ? (dir_ / "tokenizer.json").string() : "byte";
    return d;
  }
  static ModelConfig Bert(const std::string& head, int64_t vocab) {
    ModelConfig c;
    c.arch = Arch::kBert;
    c.head = head;
    c.vocab_size = vocab;
    c.num_labels = 2;
    c.id2label = {"neg", "pos"};
    return c;
  }
  fs::path dir_;
};

std::vector<int32_t> Ids(const ExampleSet& s, int64_t i, std::vector<int32_t>* mask,
                         int32_t* label = nullptr) {
  std::vector<int32_t> ids(static_cast<size_t>(s.seq_len()));
  mask->assign(static_cast<size_t>(s.seq_len()), -7);
  const int32_t l = s.Get(i, ids.data(), mask->data());
  if (label != nullptr) *label = l;
  return ids;
}

TEST_F(ExampleDataTest, WordPieceClassificationLabelsTruncationPadding) {
  const std::string f = Write("d.jsonl",
                              "{\"text\": \"the movie was good\", \"label\": 1}\n"
                              "\n"  // blank lines are skipped
                              "{\"text\": \"The film was BAD\", \"label\": \"neg\"}\n"
                              "{\"text\": \"it is not fun it is very very very bad\", \"label\": \"pos\"}\n"
                              "{\"text\": \"\", \"label\": 0}\n");
  Result<ExampleData> d = LoadExampleData(Spec(f, 8, true), Bert("sequence_classification", 18), 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->classification);
  EXPECT_FALSE(d->mlm.has_value());
  EXPECT_EQ(d->pad_id, 0);
  ASSERT_EQ(d->train.size(), 4);
  EXPECT_EQ(d->validation.size(), 0);
  std::vector<int32_t> mask;
  int32_t label = -5;
  // [CLS] the movie was good [SEP] [PAD] [PAD]
  EXPECT_EQ(Ids(d->train, 0, &mask, &label), (std::vector<int32_t>{2, 5, 6, 7, 8, 3, 0, 0}));
  EXPECT_EQ(mask, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(label, 1);
  EXPECT_EQ(Ids(d->train, 1, &mask, &label), (std::vector<int32_t>{2, 5, 11, 7, 9, 3, 0, 0}));
  EXPECT_EQ(label, 0);  // "neg" through id2label
  // Truncated to 8 as HF does: 6 text tokens, then the final [SEP].
  EXPECT_EQ(Ids(d->train, 2, &mask, &label), (std::vector<int32_t>{2, 14, 15, 16, 17, 14, 15, 3}));
  EXPECT_EQ(mask, std::vector<int32_t>(8, 1));
  EXPECT_EQ(label, 1);
  EXPECT_EQ(d->train.Length(2), 8);
  // An empty text: [CLS] [SEP].
  EXPECT_EQ(Ids(d->train, 3, &mask, &label), (std::vector<int32_t>{2, 3, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(mask, (std::vector<int32_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(label, 0);

  // A micro-batch: targets[b] = row b's label, the rest -1; an empty row has mask 0.
  const int64_t rows[3] = {2, 0, -1}, epochs[3] = {0, 0, 0};
  std::vector<int32_t> in(24), tg(24), m(24);
  FillExampleBatch(*d, d->train, rows, epochs, 3, in.data(), tg.data(), m.data());
  EXPECT_EQ(tg[0], 1);
  EXPECT_EQ(tg[1], 1);
  EXPECT_EQ(tg[2], -1);
  for (size_t i = 3; i < tg.size(); ++i) EXPECT_EQ(tg[i], -1) << i;
  EXPECT_EQ(std::vector<int32_t>(in.begin() + 8, in.begin() + 16),
            (std::vector<int32_t>{2, 5, 6, 7, 8, 3, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + 16, m.end()), std::vector<int32_t>(8, 0));
  EXPECT_EQ(std::vector<int32_t>(in.begin() + 16, in.end()), std::vector<int32_t>(8, 0));
}

TEST_F(ExampleDataTest, ByteTokenizerHasNoSpecials) {
  const std::string f = Write("d.jsonl", "{\"text\": \"ab\", \"label\": 1}\n"
                                         "{\"text\": \"abcdef\", \"label\": \"LABEL_0\"}\n");
  ModelConfig c = Bert("sequence_classification", 256);
  c.id2label.clear();  // names are LABEL_<i>
  c.pad_token_id = 7;
  Result<ExampleData> d = LoadExampleData(Spec(f, 4, false), c, 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->pad_id, 7);  // the byte tokenizer has no pad: config pad_token_id
  std::vector<int32_t> mask;
  int32_t label = -5;
  EXPECT_EQ(Ids(d->train, 0, &mask, &label), (std::vector<int32_t>{'a', 'b', 7, 7}));
  EXPECT_EQ(mask, (std::vector<int32_t>{1, 1, 0, 0}));
  EXPECT_EQ(label, 1);
  EXPECT_EQ(Ids(d->train, 1, &mask, &label), (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
  EXPECT_EQ(mask, (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(label, 0);
}

TEST_F(ExampleDataTest, ErrorsNameFileLineAndField) {
  const ModelConfig c = Bert("sequence_classification", 256);
  auto load_error = [&](const std::string& body) {
    const std::string f = Write("bad.jsonl", "{\"text\": \"ok\", \"label\": 0}\n" + body + "\n");
    Result<ExampleData> d = LoadExampleData(Spec(f, 8, false), c, 1);
    EXPECT_FALSE(d.ok()) << body;
    EXPECT_EQ(d.status().code(), Status::Code::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr("data.train_file: " + f + " line 2: "));
    return d.status().message();
  };
  EXPECT_THAT(load_error("{\"text\": \"x\", \"label\": 2}"),
              HasSubstr("label (data.label_field): 2 is not in [0, 2)"));
  EXPECT_THAT(load_error("{\"text\": \"x\", \"label\": -1}"), HasSubstr("-1 is not in [0, 2)"));
  EXPECT_THAT(load_error("{\"text\": \"x\", \"label\": \"maybe\"}"),
              HasSubstr("label (data.label_field): 'maybe' is not a label name (config id2label: "
                        "neg, pos)"));
  EXPECT_THAT(load_error("{\"text\": \"x\", \"label\": 0.5}"),
              HasSubstr("expected an integer label or a label name, got 0.5"));
  EXPECT_THAT(load_error("{\"text\": \"x\"}"), HasSubstr("no field 'label' (data.label_field)"));
  EXPECT_THAT(load_error("{\"label\": 1}"), HasSubstr("no field 'text' (data.text_field)"));
  EXPECT_THAT(load_error("{\"text\": 3, \"label\": 1}"),
              HasSubstr("text (data.text_field): expected a string, got 3"));
  EXPECT_THAT(load_error("{\"text\": \"x\", "), HasSubstr("not valid JSON"));
  EXPECT_THAT(load_error("[1, 2]"), HasSubstr("expected a JSON object"));
  // No training example left.
  const std::string one = Write("one.jsonl", "{\"text\": \"ok\", \"label\": 0}\n");
  DataSpec s = Spec(one, 8, false);
  s.validation_split = 0.5;
  Result<ExampleData> d = LoadExampleData(s, c, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("1 examples leave no training example"));
  // A tokenizer without a mask token cannot feed masked_lm... the byte one can (vocab - 1).
  s.validation_split = 0.0;
  s.label_field.reset();
  d = LoadExampleData(s, Bert("masked_lm", 256), 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d->mlm.has_value());
  EXPECT_EQ(d->mlm->mask_id, 255);
}

TEST_F(ExampleDataTest, ValidationIsTheLastFractionOfExamples) {
  std::string body;
  for (int i = 0; i < 10; ++i) {
    body += "{\"text\": \"" + std::string(static_cast<size_t>(i + 1), 'x') + "\", \"label\": " +
            std::to_string(i % 2) + "}\n";
  }
  DataSpec s = Spec(Write("d.jsonl", body), 16, false);
  s.validation_split = 0.2;
  Result<ExampleData> d = LoadExampleData(s, Bert("sequence_classification", 256), 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->train.size(), 8);
  ASSERT_EQ(d->validation.size(), 2);
  EXPECT_EQ(d->train.Length(7), 8);
  EXPECT_EQ(d->validation.Length(0), 9);
  EXPECT_EQ(d->validation.Length(1), 10);
}

// HF DataCollatorForLanguageModeling's statistics over many positions.
TEST(MlmMaskingTest, FifteenPercentThenEightyTenTen) {
  MlmMasking m;
  m.mask_id = 999;
  m.vocab_size = 1000;
  m.seed = 42;
  m.special.assign(1000, false);
  m.special[0] = m.special[1] = true;
  const int64_t T = 512, N = 300;
  std::mt19937 rng(5);
  int64_t eligible = 0, selected = 0, to_mask = 0, to_random = 0, kept = 0;
  for (int64_t e = 0; e < N; ++e) {
    std::vector<int32_t> ids(T), mask(T, 1), targets(T);
    for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>(2 + rng() % 900);
    for (int64_t t = 0; t < T; t += 17) ids[static_cast<size_t>(t)] = static_cast<int32_t>(t % 2);
    for (int64_t t = T - 40; t < T; ++t) mask[static_cast<size_t>(t)] = 0;  // padding
    const std::vector<int32_t> original = ids;
    m.Apply(/*epoch=*/0, e, T, ids.data(), mask.data(), targets.data());
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(t);
      const bool special = original[i] < 2;
      if (special || mask[i] == 0) {
        EXPECT_EQ(targets[i], -1);
        EXPECT_EQ(ids[i], original[i]);
        continue;
      }
      ++eligible;
      if (targets[i] == -1) {
        EXPECT_EQ(ids[i], original[i]);
        continue;
      }
      ++selected;
      EXPECT_EQ(targets[i], original[i]);
      if (ids[i] == 999) ++to_mask;
      else if (ids[i] != original[i]) ++to_random;
      else ++kept;
      EXPECT_GE(ids[i], 0);
      EXPECT_LT(ids[i], 1000);
    }
  }
  const double p = static_cast<double>(selected) / static_cast<double>(eligible);
  EXPECT_NEAR(p, 0.15, 0.004) << selected << " of " << eligible;  // ~137k positions: sd 0.001
  const double s = static_cast<double>(selected);
  EXPECT_NEAR(to_mask / s, 0.8, 0.01);  // sd 0.0028
  EXPECT_NEAR(to_random / s, 0.1, 0.008);
  EXPECT_NEAR(kept / s, 0.1, 0.008);
}

TEST(MlmMaskingTest, MasksAreAFunctionOfSeedEpochExampleAndPosition) {
  MlmMasking m;
  m.mask_id = 255;
  m.vocab_size = 256;
  m.seed = 7;
  const int64_t T = 256;
  std::vector<int32_t> base(T), mask(T, 1);
  for (int64_t t = 0; t < T; ++t) base[static_cast<size_t>(t)] = static_cast<int32_t>(32 + t % 90);
  auto run = [&](uint64_t seed, int64_t epoch, int64_t example) {
    MlmMasking mm = m;
    mm.seed = seed;
    std::vector<int32_t> ids = base, targets(T);
    mm.Apply(epoch, example, T, ids.data(), mask.data(), targets.data());
    ids.insert(ids.end(), targets.begin(), targets.end());
    return ids;
  };
  EXPECT_EQ(run(7, 0, 3), run(7, 0, 3));
  EXPECT_NE(run(7, 0, 3), run(7, 1, 3));
  EXPECT_NE(run(7, 0, 3), run(7, 0, 4));
  EXPECT_NE(run(7, 0, 3), run(8, 0, 3));
  EXPECT_NE(run(7, kEvalMaskEpoch, 3), run(7, 0, 3));
  // The draws themselves: the same numbers every call.
  const MlmDraw a = MlmDraws(7, 2, 9, 11, 256), b = MlmDraws(7, 2, 9, 11, 256);
  EXPECT_EQ(a.select, b.select);
  EXPECT_EQ(a.replace, b.replace);
  EXPECT_EQ(a.random_id, b.random_id);
}

// masked_lm through the WordPiece tokenizer: its [MASK] id, never a special or padded position.
TEST_F(ExampleDataTest, MaskedLmWordPieceNeverMasksSpecials) {
  std::string body;
  for (int i = 0; i < 200; ++i) body += "{\"text\": \"the movie was very good it is a film\"}\n";
  DataSpec s = Spec(Write("d.jsonl", body), 16, true);
  s.label_field.reset();
  Result<ExampleData> d = LoadExampleData(s, Bert("masked_lm", 18), 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d->mlm.has_value());
  EXPECT_EQ(d->mlm->mask_id, 4);
  for (int id = 0; id < 5; ++id) EXPECT_TRUE(d->mlm->IsSpecial(id)) << id;
  for (int id = 5; id < 18; ++id) EXPECT_FALSE(d->mlm->IsSpecial(id)) << id;
  ASSERT_EQ(d->train.size(), 200);
  std::vector<int64_t> rows(200), epochs(200, 0);
  for (int i = 0; i < 200; ++i) rows[static_cast<size_t>(i)] = i;
  std::vector<int32_t> in(200 * 16), tg(200 * 16), m(200 * 16);
  FillExampleBatch(*d, d->train, rows.data(), epochs.data(), 200, in.data(), tg.data(), m.data());
  int64_t selected = 0;
  for (int r = 0; r < 200; ++r) {
    for (int t = 0; t < 16; ++t) {
      const size_t i = static_cast<size_t>(r * 16 + t);
      // [CLS] + 10 words + [SEP] = 12 real positions; 0 and 11 special, 12.. padding.
      if (t == 0 || t >= 11) {
        EXPECT_EQ(tg[i], -1) << r << " " << t;
      }
      if (t >= 12) {
        EXPECT_EQ(m[i], 0);
      }
      if (tg[i] != -1) ++selected;
    }
  }
  EXPECT_GT(selected, 200 * 10 * 0.10);
  EXPECT_LT(selected, 200 * 10 * 0.20);
}

// masked_lm on a text file: the stream cut into seq_len examples, every mask 1.
TEST_F(ExampleDataTest, MaskedLmTextStreamExamples) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "abcdefghij";
  DataSpec s = Spec(Write("d.txt", text), 16, false);
  s.format = "text";
  s.label_field.reset();
  s.validation_split = 0.1;
  Result<ExampleData> d = LoadExampleData(s, Bert("masked_lm", 256), 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.size(), 900 / 16);
  EXPECT_EQ(d->validation.size(), 100 / 16);
  std::vector<int32_t> mask;
  const std::vector<int32_t> ids = Ids(d->train, 1, &mask);
  EXPECT_EQ(mask, std::vector<int32_t>(16, 1));
  EXPECT_EQ(ids[0], 'a' + 16 % 10);
}

// The loader: example order, wrap into the next epoch, resume at a saved position (the masks
// too: they depend on the epoch and the example, not on the run).
TEST_F(ExampleDataTest, LoaderOrderAndResume) {
  std::string text;
  for (int i = 0; i < 700; ++i) text += static_cast<char>('a' + i % 26);
  DataSpec s = Spec(Write("d.txt", text), 8, false);
  s.format = "text";
  s.label_field.reset();
  Result<ExampleData> d = LoadExampleData(s, Bert("masked_lm", 256), 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const int64_t n = d->train.size(), B = 4, T = 8;
  ASSERT_EQ(n, 87);
  auto batch = [&](ExampleLoader* l) {
    std::vector<int32_t> v(static_cast<size_t>(3 * B * T));
    l->Next(v.data(), v.data() + B * T, v.data() + 2 * B * T);
    return v;
  };
  ExampleLoader one(&*d, B, /*shuffle=*/true, 11);
  std::vector<std::vector<int32_t>> all;
  std::vector<LoaderPosition> positions;
  for (int k = 0; k < 60; ++k) {  // 240 examples: into the third epoch
    positions.push_back(one.position());
    all.push_back(batch(&one));
  }
  EXPECT_EQ(one.position().epoch, 2);
  // Resume from micro-batch 30's position: the same batches (masks included).
  ExampleLoader resumed(&*d, B, true, 11, positions[30]);
  for (int k = 30; k < 60; ++k) EXPECT_EQ(batch(&resumed), all[static_cast<size_t>(k)]) << k;
  // Epochs differ in order (and masks).
  ExampleLoader in_order(&*d, B, /*shuffle=*/false, 11);
  std::vector<int32_t> first = batch(&in_order);
  std::vector<int32_t> mask;
  const std::vector<int32_t> ex0 = Ids(d->train, 0, &mask);
  // Without shuffle row 0 is example 0 (its unmasked positions are the example's ids).
  for (int64_t t = 0; t < T; ++t) {
    const int32_t target = first[static_cast<size_t>(B * T + t)];
    EXPECT_EQ(target == -1 ? first[static_cast<size_t>(t)] : target, ex0[static_cast<size_t>(t)]);
  }
}

}  // namespace
}  // namespace traind::engine
