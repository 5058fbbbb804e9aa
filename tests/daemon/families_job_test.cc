// The new model families through traind as a user drives it (trainctl against a real daemon): a
// bert sequence classifier's eval_accuracy reaches `trainctl status` (text and -o json metrics)
// and `trainctl logs` (text and -o json events); a mixtral job trains and `trainctl generate`
// continues a prompt from its output folder through the KV-cache decoder; each llama-like family
// trained through the daemon writes the same bytes as `traind run` of the same spec.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

class FamiliesJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("traind-families");
    daemon_ = std::make_unique<Daemon>(dir_ + "/state");
    ASSERT_TRUE(daemon_->Start());
  }
  void TearDown() override {
    daemon_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  CmdResult Ctl(std::vector<std::string> args, double timeout = 180) {
    std::vector<std::string> all = {"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir()};
    all.insert(all.end(), args.begin(), args.end());
    return Trainctl(all, timeout);
  }
  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
};

// Sentences of filler words with one keyword: label 1 for "good", 0 for "bad" (byte tokenizer).
std::string WriteKeywordJsonl(const std::string& path, int n) {
  const char* filler[] = {"the", "movie", "was", "a", "plot", "it", "and", "very", "music", "of"};
  std::mt19937 rng(11);
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const bool good = rng() % 2 == 0;
    std::string text;
    const int len = 2 + static_cast<int>(rng() % 4), at = static_cast<int>(rng() % (len + 1));
    for (int w = 0; w <= len; ++w) {
      text += (w ? " " : "") + std::string(w == at ? (good ? "good" : "bad") : filler[rng() % 10]);
    }
    out << nlohmann::json({{"text", text}, {"label", good ? 1 : 0}}).dump() << "\n";
  }
  return path;
}

TEST_F(FamiliesJobTest, BertClassifierAccuracyInStatusAndLogs) {
  const std::string data = WriteKeywordJsonl(dir_ + "/kw.jsonl", 400);
  const std::string spec = dir_ + "/bert.yaml";
  std::ofstream(spec) << "name: bert-kw\nmodel:\n  arch: bert\n  head: sequence_classification\n"
                         "  num_labels: 2\n  config: {vocab_size: 256, hidden_size: 32, "
                         "intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, "
                         "max_position_embeddings: 48}\n"
                         "data: {train_file: " << data << ", format: jsonl, label_field: label, "
                         "seq_len: 48, validation_split: 0.25}\n"
                         "training: {max_steps: 30, per_device_train_batch_size: 8, "
                         "learning_rate: 1.0e-3, logging_steps: 10, eval_steps: 15}\n"
                         "output_dir: " << dir_ << "/bert-out\n";
  CmdResult r = Ctl({"submit", spec, "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  CmdResult list = Ctl({"-o", "json", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  std::string id;
  const nlohmann::json jobs = nlohmann::json::parse(list.out);
  for (const auto& job : jobs["jobs"]) {
    if (job["name"] == "bert-kw") id = job["id"].get<std::string>();
  }
  ASSERT_FALSE(id.empty()) << list.out;
  CmdResult st = Ctl({"-o", "json", "status", id});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  const nlohmann::json j = nlohmann::json::parse(st.out);
  EXPECT_EQ(j["state"], "SUCCEEDED");
  ASSERT_TRUE(j["metrics"].contains("eval_accuracy")) << st.out;
  const double acc = j["metrics"]["eval_accuracy"].get<double>();
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
  // 100 validation examples: the accuracy is a count of them.
  EXPECT_NEAR(acc * 100, std::round(acc * 100), 1e-6) << acc;
  CmdResult text = Ctl({"status", id});
  EXPECT_THAT(text.out, ::testing::HasSubstr("eval_accuracy"));
  CmdResult logs = Ctl({"logs", id});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, ::testing::HasSubstr("eval step 15  eval_loss "));
  EXPECT_THAT(logs.out, ::testing::HasSubstr("eval_accuracy "));
  // The output folder is a transformers BertForSequenceClassification.
  const nlohmann::json config =
      nlohmann::json::parse(ReadAll(dir_ + "/bert-out/config.json"));
  EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(config["id2label"].size(), 2u);
}

TEST_F(FamiliesJobTest, MixtralTrainsAndGenerates) {
  const std::string data = WriteTextData(dir_);
  const std::string spec = dir_ + "/moe.yaml";
  std::ofstream(spec) << "name: moe\nmodel:\n  arch: mixtral\n  config: {vocab_size: 256, "
                         "hidden_size: 32, intermediate_size: 32, num_hidden_layers: 2, "
                         "num_attention_heads: 4, num_key_value_heads: 2, "
                         "max_position_embeddings: 64, num_local_experts: 4, "
                         "num_experts_per_tok: 2, output_router_logits: true}\n"
                         "data: {train_file: " << data << ", seq_len: 32}\n"
                         "training: {max_steps: 20, per_device_train_batch_size: 4, "
                         "logging_steps: 5, sample_every: 10}\n"
                         "output_dir: " << dir_ << "/moe-out\n";
  CmdResult r = Ctl({"submit", spec, "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  CmdResult g = Ctl({"-o", "json", "generate", dir_ + "/moe-out", "--prompt", "the ",
                     "--max-new-tokens", "12", "--top-k", "1"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const nlohmann::json j = nlohmann::json::parse(g.out);
  ASSERT_TRUE(j["ids"].is_array());
  EXPECT_EQ(j["ids"].size(), 12u) << g.out;
  // Greedy is repeatable.
  CmdResult again = Ctl({"-o", "json", "generate", dir_ + "/moe-out", "--prompt", "the ",
                         "--max-new-tokens", "12", "--top-k", "1"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["ids"], j["ids"]);
}


// Each llama-like family and rope variant through the daemon equals `traind run` of the same spec,
// bit for bit (one CPU thread on both sides): model.safetensors and config.json. RunJob itself
// equals the float64 PyTorch reference of HF's semantics (families_train_test), so the daemon's
// jobs do too.
TEST(FamiliesThroughTheDaemon, EqualTraindRunBitForBit) {
  const std::string dir = MakeTempDir("traind-families-daemon");
  Daemon daemon(dir + "/state");
  ASSERT_TRUE(daemon.Start({"--device", "cpu", "--threads", "1"}));
  const std::string data = WriteTextData(dir, 20000);
  struct Family {
    std::string name, model;
  };
  const std::string dims = "vocab_size: 256, hidden_size: 32, intermediate_size: 48, "
                           "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
                           "max_position_embeddings: 64";
  const std::vector<Family> families = {
      {"llama3rope", "arch: llama\n  config: {" + dims +
                         ", head_dim: 16, rope_scaling: {rope_type: llama3, factor: 8.0, "
                         "low_freq_factor: 1.0, high_freq_factor: 4.0, "
                         "original_max_position_embeddings: 16}}"},
      {"qwen2", "arch: qwen2\n  config: {" + dims + "}"},
      {"mistral", "arch: mistral\n  config: {" + dims + ", sliding_window: 8}"},
      {"qwen3", "arch: qwen3\n  config: {" + dims + ", head_dim: 16}"},
      {"gemma", "arch: gemma\n  config: {" + dims + ", head_dim: 16}"},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.name);
    std::string outs[2];
    for (int via_daemon = 0; via_daemon < 2; ++via_daemon) {
      const std::string name = f.name + (via_daemon ? "-daemon" : "-run");
      const std::string spec = dir + "/" + name + ".yaml";
      outs[via_daemon] = dir + "/" + name;
      std::ofstream(spec) << "name: " << name << "\nmodel:\n  " << f.model << "\n"
                          << "data: {train_file: " << data << ", seq_len: 16}\n"
                          << "training: {max_steps: 3, per_device_train_batch_size: 2, "
                             "learning_rate: 1.0e-3, logging_steps: 1}\n"
                          << "output_dir: " << outs[via_daemon] << "\n";
      const CmdResult r =
          via_daemon ? Trainctl({"--addr", daemon.addr(), "--state-dir", daemon.state_dir(), "submit",
                                 spec, "--wait"},
                                240)
                     : RunCommand({TRAIND_BIN, "run", spec, "--device", "cpu", "--threads", "1"}, 240);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    }
    const std::string run_model = ReadAll(outs[0] + "/model.safetensors");
    ASSERT_FALSE(run_model.empty());
    EXPECT_TRUE(run_model == ReadAll(outs[1] + "/model.safetensors"))
        << "the daemon's weights differ from traind run's";
    const std::string config = ReadAll(outs[0] + "/config.json");
    EXPECT_EQ(config, ReadAll(outs[1] + "/config.json"));
    EXPECT_EQ(nlohmann::json::parse(config)["model_type"], f.name == "llama3rope" ? "llama" : f.name);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace traind::testing
