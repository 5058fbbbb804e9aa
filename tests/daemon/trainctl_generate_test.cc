// trainctl generate through a real traind (CLI.md): a job trains, then the model continues a
// prompt in a job-runner child on traind's device. Text and -o json layouts, greedy decoding is
// repeatable and its ids are the text's bytes (byte tokenizer), a seed changes sampling, and bad
// input (no model, bad options, a wrong token, a folder outside the caller's roots) gets one clear
// error with CLI.md's exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "daemon_fixture.h"

namespace traind::testing {
namespace {

using ::testing::HasSubstr;

class TrainctlGenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("traind-generate"));
    const std::string data = WriteTextData(*dir_);
    std::filesystem::create_directories(*dir_ + "/out");
    daemon_ = new Daemon(*dir_ + "/state");
    ASSERT_TRUE(daemon_->Start({"--data-roots", *dir_, "--output-roots", *dir_ + "/out"}));
    SpecOptions o;
    o.train_file = data;
    o.max_steps = 30;
    o.output_dir = *dir_ + "/out/model";
    o.training_extra = "  sample_every: 10\n";  // samples in the job's log (JOBSPEC.md)
    const std::string spec = *dir_ + "/model.yaml";
    o.name = "model";
    WriteAll(spec, TinySpec(o));
    CmdResult r = Ctl({"submit", spec, "--wait"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    job_ = new std::string(r.out.substr(0, r.out.find('\n')));
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete job_;
  }
  static CmdResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> all = {"--addr", daemon_->addr(), "--state-dir", daemon_->state_dir()};
    all.insert(all.end(), args.begin(), args.end());
    return Trainctl(all);
  }
  static std::string Model() { return *dir_ + "/out/model"; }

  static std::string* dir_;
  static std::string* job_;
  static Daemon* daemon_;
};
std::string* TrainctlGenerateTest::dir_ = nullptr;
std::string* TrainctlGenerateTest::job_ = nullptr;
Daemon* TrainctlGenerateTest::daemon_ = nullptr;

TEST_F(TrainctlGenerateTest, JsonLayoutGreedyIsRepeatableAndIdsAreTheText) {
  CmdResult r = Ctl({"-o", "json", "generate", Model(), "--prompt", "the ", "--max-new-tokens",
                     "24", "--top-k", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt"], "the ");
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({116, 104, 101, 32}));
  ASSERT_TRUE(j["ids"].is_array());
  ASSERT_EQ(j["ids"].size(), 24u) << r.out;
  std::string bytes;
  for (const auto& id : j["ids"]) bytes.push_back(static_cast<char>(id.get<int>()));
  EXPECT_EQ(j["text"], bytes);  // the byte tokenizer: printable English-like text
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["device"], "cpu");
  // Greedy twice, and --temperature 0 is greedy too.
  CmdResult again = Ctl({"-o", "json", "generate", Model(), "--prompt", "the ", "--max-new-tokens",
                         "24", "--temperature", "0"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["ids"], j["ids"]);
  // A trained model continues with the corpus's words: mostly letters and spaces.
  int letters = 0;
  for (char ch : bytes) letters += std::isalpha(static_cast<unsigned char>(ch)) || ch == ' ';
  EXPECT_GE(letters, 20) << bytes;
}

TEST_F(TrainctlGenerateTest, TextPrintsTheContinuationAndTheSeedDecides) {
  auto run = [](const std::string& seed, const std::string& output) {
    return Ctl({"-o", output, "generate", Model(), "--prompt", "a", "--max-new-tokens", "40",
                "--temperature", "1.0", "--top-p", "0.95", "--seed", seed});
  };
  CmdResult a = run("1", "text"), b = run("1", "text"), c = run("2", "text");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  // Text mode prints the continuation alone (not the prompt), then a newline.
  CmdResult j = run("1", "json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto parsed = nlohmann::json::parse(j.out);  // valid JSON: cut UTF-8 became U+FFFD
  // The tiny model has 32 positions: 1 prompt byte + 31 new ones, fewer when it sampled the eos.
  if (parsed["finish_reason"] != "eos") {
    EXPECT_EQ(parsed["finish_reason"], "max_positions") << j.out;
    EXPECT_EQ(parsed["ids"].size(), 31u);
  }
  EXPECT_EQ(a.out, parsed["text"].get<std::string>() + "\n");
}

TEST_F(TrainctlGenerateTest, BadInputIsOneClearErrorWithTheContractsExitCodes) {
  CmdResult r = Ctl({"generate", *dir_ + "/out/nothing-here", "--prompt", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("nothing-here"));
  EXPECT_TRUE(r.out.empty());
  r = Ctl({"generate", Model(), "--prompt", "x", "--top-p", "1.5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--top-p"));
  r = Ctl({"generate", Model(), "--prompt", "x", "--max-new-tokens", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-new-tokens"));
  r = Ctl({"generate", Model()});  // no --prompt: usage
  EXPECT_EQ(r.exit_code, 2);
  // Outside the caller's roots (traind runs with --data-roots/--output-roots).
  r = Ctl({"generate", "/usr/share", "--prompt", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("output_dir: /usr/share is outside"));
  // A wrong token.
  r = Trainctl({"--addr", daemon_->addr(), "--token", "wrong", "generate", Model(), "--prompt", "x"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("did not accept the token"));
}

// --chat: the user message rendered with the model folder's chat template (tokenizer_config.json
// "chat_template", add_generation_prompt, its special tokens; else chat_template.jinja), encoded
// without added special tokens; -o json's prompt is the rendered text. Without a template it is
// one clear error; --chat and --prompt exclude each other.
TEST_F(TrainctlGenerateTest, ChatRendersTheModelsTemplate) {
  CmdResult none = Ctl({"generate", Model(), "--chat", "hi"});
  EXPECT_EQ(none.exit_code, 2) << none.err;
  EXPECT_THAT(none.err, HasSubstr("--chat: the model has no chat template"));
  EXPECT_THAT(none.err, HasSubstr(Model() + "/chat_template.jinja"));
  CmdResult both = Ctl({"generate", Model(), "--chat", "hi", "--prompt", "x"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.err, HasSubstr("excludes"));
  // The trained model's folder with a chat template in its tokenizer_config.json.
  const std::string chat = *dir_ + "/out/chat-model";
  std::filesystem::create_directories(chat);
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(Model() + "/" + f, chat + "/" + f);
  }
  nlohmann::json cfg = {
      {"bos_token", "<s>"},
      {"chat_template",
       "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}U:{% endif %}"
       "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"}};
  WriteAll(chat + "/tokenizer_config.json", cfg.dump());
  CmdResult r = Ctl({"-o", "json", "generate", chat, "--chat", "to be", "--max-new-tokens", "4",
                     "--top-k", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const std::string rendered = "<s>U:to be\nA:";  // the tiny model has 32 positions
  EXPECT_EQ(j["prompt"], rendered);
  std::vector<int> bytes(rendered.begin(), rendered.end());
  EXPECT_EQ(j["prompt_ids"], nlohmann::json(bytes));
  EXPECT_EQ(j["ids"].size(), 4u);
  // Greedy from the rendered prompt equals --prompt with the same text.
  CmdResult same = Ctl({"-o", "json", "generate", chat, "--prompt", rendered, "--max-new-tokens",
                        "4", "--top-k", "1"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(nlohmann::json::parse(same.out)["ids"], j["ids"]);
  // chat_template.jinja (what a job trained with data.chat_template writes) serves as well.
  std::filesystem::remove(chat + "/tokenizer_config.json");
  WriteAll(chat + "/chat_template.jinja", "[{{ messages[0].content }}]{% if add_generation_prompt %}>{% endif %}");
  CmdResult jinja = Ctl({"-o", "json", "generate", chat, "--chat", "q", "--max-new-tokens", "1"});
  ASSERT_EQ(jinja.exit_code, 0) << jinja.err;
  EXPECT_EQ(nlohmann::json::parse(jinja.out)["prompt"], "[q]>");
  // A template that fails names itself.
  WriteAll(chat + "/chat_template.jinja", "{{ raise_exception('only system turns') }}");
  CmdResult raised = Ctl({"generate", chat, "--chat", "q"});
  EXPECT_EQ(raised.exit_code, 2);
  EXPECT_THAT(raised.err, HasSubstr("only system turns"));
}

// training.sample_every: the job's log holds a sample at steps 10, 20, 30 (text and JSON).
TEST_F(TrainctlGenerateTest, SamplesDuringTrainingAreInTheLog) {
  CmdResult r = Ctl({"logs", *job_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* step : {"sample step 10: \"", "sample step 20: \"", "sample step 30: \""}) {
    EXPECT_THAT(r.out, HasSubstr(step)) << r.out;
  }
  r = Ctl({"-o", "json", "logs", *job_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int samples = 0;
  size_t at = 0;
  while (at < r.out.size()) {
    const size_t end = r.out.find('\n', at);
    auto ev = nlohmann::json::parse(r.out.substr(at, end - at));
    at = end == std::string::npos ? r.out.size() : end + 1;
    if (ev["type"] != "sample") continue;
    ++samples;
    EXPECT_EQ(ev["step"].get<int>() % 10, 0);
    EXPECT_FALSE(ev["prompt"].get<std::string>().empty());  // the training text's first bytes
    EXPECT_GT(ev["ids"].size(), 0u);
  }
  EXPECT_EQ(samples, 3);
}

}  // namespace
}  // namespace traind::testing
