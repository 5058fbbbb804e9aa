// bert through the normal job path (ParseJobSpec + RunJob, CPU): a small sequence classifier on a
// jsonl set made here, whose label is decided by one keyword among random filler words, reaches
// >= 95% eval_accuracy in trainer_state.json's log_history; a masked_lm job's eval_loss falls; a
// cancelled and resumed masked_lm run repeats the uninterrupted run's losses bit for bit (the
// same examples and the same masks after the resume).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "trainer_test_util.h"
#include "traind/engine/job_spec.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::TestRunOptions;
using testing::WriteFile;

const std::vector<std::string> kFiller = {"the", "a", "movie", "film", "plot", "actor", "was",
                                          "is", "and", "very", "quite", "story", "scene", "of",
                                          "it", "this", "that", "with", "music", "ending"};
const std::vector<std::string> kGood = {"good", "great", "fine"};
const std::vector<std::string> kBad = {"bad", "awful", "poor"};

// A word-level WordPiece tokenizer.json: [PAD] 0 [UNK] 1 [CLS] 2 [SEP] 3 [MASK] 4, then words.
std::string WriteTokenizer(const std::string& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  std::vector<std::string> words = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (const auto* list : {&kFiller, &kGood, &kBad}) words.insert(words.end(), list->begin(), list->end());
  for (size_t i = 0; i < words.size(); ++i) vocab[words[i]] = static_cast<int>(i);
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 5; ++i) {
    added.push_back({{"id", i}, {"content", words[static_cast<size_t>(i)]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const nlohmann::json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                      {"strip_accents", nullptr}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                 {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
  const std::string path = dir + "/tokenizer.json";
  WriteFile(path, tok.dump());
  return path;
}

// `n` lines: 3..12 filler words with one keyword at a random place; label pos (1) for a good
// keyword, neg (0) for a bad one, written as a name or an integer alternately.
std::string WriteSentiment(const std::string& dir, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string body;
  for (int i = 0; i < n; ++i) {
    const bool good = rng() % 2 == 0;
    const int len = 3 + static_cast<int>(rng() % 10);
    const int at = static_cast<int>(rng() % static_cast<uint32_t>(len + 1));
    std::string text;
    for (int w = 0; w <= len; ++w) {
      const std::string word = w == at ? (good ? kGood : kBad)[rng() % 3] : kFiller[rng() % kFiller.size()];
      text += (w ? " " : "") + word;
    }
    const nlohmann::json label = i % 2 == 0 ? nlohmann::json(good ? "pos" : "neg") : nlohmann::json(good ? 1 : 0);
    body += nlohmann::json({{"sentence", text}, {"label", label}}).dump() + "\n";
  }
  const std::string path = dir + "/sentiment.jsonl";
  WriteFile(path, body);
  return path;
}

nlohmann::json LogHistory(const std::string& output_dir) {
  return nlohmann::json::parse(ReadFile(output_dir + "/trainer_state.json"))["log_history"];
}

TEST(BertTrainerTest, ClassifierLearnsTheKeyword) {
  const std::string dir = MakeTempDir("bert_cls");
  const std::string tok = WriteTokenizer(dir);
  const std::string data = WriteSentiment(dir, 600, 5);
  const std::string yaml = R"(model:
  arch: bert
  head: sequence_classification
  config:
    vocab_size: 32
    hidden_size: 64
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    max_position_embeddings: 32
    id2label: {0: neg, 1: pos}
data:
  train_file: )" + data + R"(
  format: jsonl
  text_field: sentence
  label_field: label
  tokenizer: )" + tok + R"(
  seq_len: 16
  validation_split: 0.2
training:
  max_steps: 150
  per_device_train_batch_size: 16
  learning_rate: 1.0e-3
  lr_scheduler_type: linear
  warmup_steps: 10
  weight_decay: 0.01
  logging_steps: 25
  eval_steps: 50
  seed: 3
output_dir: )" + dir + "/out\n";
  Result<JobSpec> spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  std::vector<EvalReport> evals;
  std::vector<LogReport> logs;
  RunCallbacks cb;
  cb.on_eval = [&](const EvalReport& r) { evals.push_back(r); };
  cb.on_log = [&](const LogReport& r) { logs.push_back(r); };
  Result<RunSummary> run = RunJob(*spec, TestRunOptions(1), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(evals.size(), 3u);
  for (const EvalReport& e : evals) ASSERT_TRUE(e.eval_accuracy.has_value()) << e.step;
  std::vector<nlohmann::json> eval_entries;
  for (const nlohmann::json& e : LogHistory(spec->output_dir)) {
    if (e.contains("eval_loss")) eval_entries.push_back(e);
  }
  ASSERT_EQ(eval_entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(eval_entries[i].contains("eval_accuracy")) << eval_entries[i].dump();
    EXPECT_DOUBLE_EQ(eval_entries[i]["eval_accuracy"].get<double>(), *evals[i].eval_accuracy);
    EXPECT_DOUBLE_EQ(eval_entries[i]["eval_loss"].get<double>(), evals[i].eval_loss);
  }
  const double accuracy = eval_entries.back()["eval_accuracy"].get<double>();
  EXPECT_GE(accuracy, 0.95) << LogHistory(spec->output_dir).dump();
  EXPECT_LT(eval_entries.back()["eval_loss"].get<double>(), 0.3);
  // 120 validation examples: the accuracy is a count of them.
  EXPECT_NEAR(accuracy * 120, std::round(accuracy * 120), 1e-9);
  // samples/s counts examples, tokens/s B x T per example.
  ASSERT_FALSE(logs.empty());
  EXPECT_NEAR(logs.back().tokens_per_second / logs.back().samples_per_second, 16.0, 1e-6);
  // The model folder is a BertForSequenceClassification with the label names.
  const nlohmann::json config = nlohmann::json::parse(ReadFile(spec->output_dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(config["id2label"]["1"], "pos");
}

// A masked-LM job on a word text with structure: its eval_loss (over the masked positions of the
// validation examples, the same masks every time) falls.
std::string WriteMlmText(const std::string& dir, int sentences, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < sentences; ++i) {
    // Fixed phrases: "the movie was very good", "this film is quite bad", with filler between.
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) text += "the movie was very good . ";
    else if (kind == 1) text += "this film is quite bad . ";
    else text += "the story of it and the music with that ending . ";
  }
  const std::string path = dir + "/mlm.txt";
  WriteFile(path, text);
  return path;
}

std::string MlmYaml(const std::string& dir, const std::string& data, const std::string& tok,
                    int steps, int eval_steps, int save_steps) {
  return R"(model:
  arch: bert
  head: masked_lm
  config:
    vocab_size: 32
    hidden_size: 64
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    max_position_embeddings: 32
data:
  train_file: )" + data + R"(
  format: text
  tokenizer: )" + tok + R"(
  seq_len: 32
  validation_split: 0.1
training:
  max_steps: )" + std::to_string(steps) + R"(
  per_device_train_batch_size: 8
  learning_rate: 2.0e-3
  lr_scheduler_type: constant
  logging_steps: 2
  eval_steps: )" + std::to_string(eval_steps) + R"(
  save_steps: )" + std::to_string(save_steps) + R"(
  seed: 9
output_dir: )" + dir + "/out\n";
}

TEST(BertTrainerTest, MaskedLmEvalLossFalls) {
  const std::string dir = MakeTempDir("bert_mlm");
  const std::string tok = WriteTokenizer(dir);
  const std::string data = WriteMlmText(dir, 1500, 2);
  Result<JobSpec> spec = ParseJobSpec(MlmYaml(dir, data, tok, 600, 100, 0));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  std::vector<double> evals;
  RunCallbacks cb;
  cb.on_eval = [&](const EvalReport& r) {
    EXPECT_FALSE(r.eval_accuracy.has_value());
    evals.push_back(r.eval_loss);
  };
  Result<RunSummary> run = RunJob(*spec, TestRunOptions(1), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(evals.size(), 6u);
  for (double e : evals) EXPECT_TRUE(std::isfinite(e));
  // ln(32) = 3.47 at the start; the phrases make most masked words predictable (this run:
  // 2.72, 2.58, 2.41, 1.45, 0.78, 0.57 at steps 100..600).
  EXPECT_LT(evals.back(), evals.front()) << ::testing::PrintToString(evals);
  EXPECT_LT(evals.back(), 1.5) << ::testing::PrintToString(evals);
  EXPECT_GT(evals.front() - evals.back(), 1.0) << ::testing::PrintToString(evals);
  for (const nlohmann::json& e : LogHistory(spec->output_dir)) {
    EXPECT_FALSE(e.contains("eval_accuracy")) << e.dump();
  }
  const nlohmann::json config = nlohmann::json::parse(ReadFile(spec->output_dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "BertForMaskedLM");
}

// Cancelled after step 3 and resumed from checkpoint-2: the same losses as one uninterrupted run
// (the loader position and the masks, a function of (seed, epoch, example, position), resume).
TEST(BertTrainerTest, MaskedLmResumeRepeatsTheLosses) {
  const std::string dir_a = MakeTempDir("bert_mlm_a");
  const std::string dir_b = MakeTempDir("bert_mlm_b");
  const std::string tok = WriteTokenizer(dir_a);
  const std::string data = WriteMlmText(dir_a, 400, 4);
  Result<JobSpec> a = ParseJobSpec(MlmYaml(dir_a, data, tok, 6, 0, 2));
  Result<JobSpec> b = ParseJobSpec(MlmYaml(dir_b, data, tok, 6, 0, 2));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  const testing::CancelResumeRuns r = testing::RunCancelledAndResumed(*a, *b);
  ASSERT_TRUE(r.a.has_value() && r.a->ok()) << r.a->status().ToString();
  ASSERT_TRUE(r.b_resumed.has_value() && r.b_resumed->ok()) << r.b_resumed->status().ToString();
  testing::ExpectResumedLossesIdentical(r);
}

// Fine-tuning from a pretrained folder: a masked-LM run's output (BertForMaskedLM: no pooler, no
// classifier) is init_from of a classifier job; the job says which head tensors it initialised,
// and with learning_rate 0 the encoder it writes is the masked-LM's, tensor for tensor.
TEST(BertTrainerTest, ClassifierFromAMaskedLmFolder) {
  const std::string dir = MakeTempDir("bert_init_from");
  const std::string tok = WriteTokenizer(dir);
  Result<JobSpec> mlm = ParseJobSpec(MlmYaml(dir + "/mlm", WriteMlmText(dir, 300, 6), tok, 10, 0, 0));
  ASSERT_TRUE(mlm.ok()) << mlm.status().ToString();
  ASSERT_TRUE(RunJob(*mlm, TestRunOptions(1), RunCallbacks{}).ok());
  const std::string data = WriteSentiment(dir, 100, 8);
  const std::string yaml = "model:\n  arch: bert\n  head: sequence_classification\n"
                           "  config: {id2label: {0: neg, 1: pos}}\n  init_from: " +
                           mlm->output_dir + "\ndata:\n  train_file: " + data +
                           "\n  format: jsonl\n  text_field: sentence\n  label_field: label\n"
                           "  tokenizer: " + tok + "\n  seq_len: 16\ntraining:\n  max_steps: 1\n"
                           "  per_device_train_batch_size: 4\n  learning_rate: 0.0\n"
                           "output_dir: " + dir + "/cls\n";
  Result<JobSpec> cls = ParseJobSpec(yaml);
  ASSERT_TRUE(cls.ok()) << cls.status().ToString();
  std::vector<std::string> messages;
  RunCallbacks cb;
  cb.on_message = [&](const std::string& m) { messages.push_back(m); };
  Result<RunSummary> run = RunJob(*cls, TestRunOptions(1), cb);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  bool named = false;
  for (const std::string& m : messages) {
    named = named || (m.find("bert.pooler.dense.weight") != std::string::npos &&
                      m.find("classifier.weight") != std::string::npos &&
                      m.find("newly initialised") != std::string::npos);
  }
  EXPECT_TRUE(named) << ::testing::PrintToString(messages);
  auto before = ReadSafetensors(mlm->output_dir + "/model.safetensors");
  auto after = ReadSafetensors(cls->output_dir + "/model.safetensors");
  ASSERT_TRUE(before.ok() && after.ok());
  int compared = 0;
  for (const auto& [name, t] : after->tensors) {
    if (name.rfind("bert.embeddings.", 0) != 0 && name.rfind("bert.encoder.", 0) != 0) continue;
    ASSERT_TRUE(before->tensors.count(name)) << name;
    EXPECT_EQ(t.ToF32().value(), before->tensors.at(name).ToF32().value()) << name;
    ++compared;
  }
  EXPECT_GT(compared, 10);
  EXPECT_TRUE(after->tensors.count("classifier.weight"));
}

}  // namespace
}  // namespace traind::engine
