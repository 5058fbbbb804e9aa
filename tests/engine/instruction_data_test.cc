// Instruction data (engine/src/data/instruction_data.h, JOBSPEC.md "Instruction data"): the
// errors of bad lines, labels of prompt-completion and conversational examples against references
// computed here independently (the five real chat templates and ours rendered by Hugging Face's
// Jinja renderer, @huggingface/jinja, with spans and byte-tokenizer labels worked out from its
// text; GPT-2's published ids), token offsets of every tokenizer kind, the rows' next-token
// targets, and a training run whose accumulation 2 x B 2 equals B 4 on examples with unequal
// loss-token counts (the step's loss normalised over its tokens, HF's num_items_in_batch).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "data/chat_template.h"
#include "data/instruction_data.h"
#include "job_run_util.h"
#include "tokenizer_test_util.h"
#include "trainer_test_util.h"
#include "traind/engine/spec_examples.h"
#include "traind/engine/tokenizer.h"
#include "traind/engine/trainer.h"

namespace traind::engine {
namespace {

using nlohmann::ordered_json;
using testing::FileExists;
using testing::ReadAll;
using testing::Shell;
using testing::WriteAll;

const std::string kOwnTemplate = std::string(TRAIND_TESTS_DIR) + "/../../examples/instruct/chat_template.jinja";
const std::string kPlain = testing::kPlainChatTemplate;

struct Files {
  std::string dir, data, tmpl;
};
Files Write(const std::string& jsonl, const std::string& tmpl = kPlain) {
  Files f;
  f.dir = testing::MakeTempDir("instr");
  f.data = f.dir + "/d.jsonl";
  f.tmpl = f.dir + "/t.jinja";
  WriteAll(f.data, jsonl);
  WriteAll(f.tmpl, tmpl);
  return f;
}
DataSpec Spec(const Files& f) {
  DataSpec d;
  d.train_file = f.data;
  d.format = "jsonl";
  d.tokenizer = "byte";
  d.chat_template = f.tmpl;
  d.seq_len = 64;
  d.validation_split = 0;
  d.shuffle = false;
  return d;
}
std::string ErrorOf(const std::string& jsonl, DataSpec* tweak_spec = nullptr) {
  const Files f = Write(jsonl);
  DataSpec d = tweak_spec ? *tweak_spec : Spec(f);
  d.train_file = f.data;
  if (!tweak_spec) d.chat_template = f.tmpl;
  auto r = ReadInstructionExamples(d, "");
  if (r.ok()) return "OK";
  const std::string prefix = "data.train_file: " + f.data + " ";
  std::string m = r.status().message();
  if (m.rfind(prefix, 0) == 0) m = m.substr(prefix.size());
  return m;
}

TEST(InstructionData, EachBadLineIsOneErrorNamingFileLineAndField) {
  const std::string ok = R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})";
  EXPECT_EQ(ErrorOf(ok + "\n" + R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":7}]})"),
            "line 2: messages[1].content: expected a string, got number");
  EXPECT_EQ(ErrorOf(ok + "\n\n" + R"({"messages":[{"content":"a"}]})"), "line 3: messages[0]: no 'role'");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user"}]})"), "line 1: messages[0]: no 'content'");
  EXPECT_EQ(ErrorOf(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null}]})"),
            "line 1: messages[1].content: expected a string, got null");
  EXPECT_EQ(ErrorOf(R"({"messages":{"role":"user"}})"),
            "line 1: messages: expected a list of messages, got object");
  EXPECT_EQ(ErrorOf(R"({"messages":[]})"), "line 1: messages: an empty conversation");
  EXPECT_EQ(ErrorOf(R"({"messages":["hi"]})"),
            "line 1: messages[0]: expected an object with role and content, got string");
  EXPECT_EQ(ErrorOf(ok + "\n{not json").substr(0, 24), "line 2: not valid JSON (");
  EXPECT_EQ(ErrorOf(ok + "\n[1]"), "line 2: expected a JSON object");
  EXPECT_EQ(ErrorOf(R"({"input":"x"})"),
            "line 1: no known field: expected 'text' (language modelling), 'prompt' and "
            "'completion' (prompt-completion) or 'messages' (conversational)");
  EXPECT_EQ(ErrorOf(std::string(R"({"messages":[{"role":"user","content":"a)") + "\xff" + R"("}]})"),
            "line 1: not valid UTF-8 (byte 41 of the line)");
  EXPECT_EQ(ErrorOf(ok + "\n" + R"({"prompt":"p","completion":"c"})"),
            "line 2: a prompt-completion line in a conversational file (as line 1): the whole file "
            "must be one kind");
  EXPECT_EQ(ErrorOf(ok + "\n" + R"({"text":"t"})"),
            "line 2: a language-modelling (text) line in a conversational file (as line 1): the "
            "whole file must be one kind");
  EXPECT_EQ(ErrorOf(R"({"prompt":"p"})"), "line 1: no 'completion' beside 'prompt' (prompt-completion data)");
  EXPECT_EQ(ErrorOf(R"({"prompt":"p","completion":["c"]})"), "line 1: completion: expected a string, got array");
}

TEST(InstructionData, RenamedFieldsAndTemplateErrors) {
  const Files f = Write(R"({"conv":[{"role":"user","content":"a"}]})" "\n");
  DataSpec d = Spec(f);
  d.messages_field = "conv";
  auto r = ReadInstructionExamples(d, "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].text, "<user>a</user>\n");
  // The default name now finds nothing known.
  d.messages_field = "messages";
  EXPECT_NE(ReadInstructionExamples(d, "").status().message().find("no known field"), std::string::npos);

  // No template: where it looked.
  d.messages_field = "conv";
  d.chat_template.reset();
  EXPECT_EQ(ReadInstructionExamples(d, "").status().message(),
            "data.chat_template: conversational data needs a chat template: none given in "
            "data.chat_template, and the tokenizer (byte) has no folder with a "
            "tokenizer_config.json or chat_template.jinja");
  // The tokenizer folder's tokenizer_config.json: a list with a "default" entry.
  const std::string gpt2 = testing::SharedData("gpt2");
  if (FileExists(gpt2 + "/vocab.json")) {
    const std::string tok = f.dir + "/tok";
    Shell("mkdir -p '" + tok + "' && cp '" + gpt2 + "/vocab.json' '" + gpt2 + "/merges.txt' '" + tok + "'");
    WriteAll(tok + "/tokenizer_config.json",
             R"({"eos_token":"<|endoftext|>","chat_template":[{"name":"tool_use","template":"x"},)"
             R"({"name":"default","template":"{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}]})");
    d.tokenizer = tok;
    auto t = ReadInstructionExamples(d, "");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)[0].text, "a<|endoftext|>");
    EXPECT_EQ((*t)[0].ids, (std::vector<int32_t>{64, 50256}));  // GPT-2: "a" 64, eos 50256
    Shell("rm '" + tok + "/tokenizer_config.json'");
    WriteAll(tok + "/chat_template.jinja", "[{{ messages[0].content }}]");
    t = ReadInstructionExamples(d, "");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)[0].text, "[a]");
    Shell("rm '" + tok + "/chat_template.jinja'");
    EXPECT_EQ(ReadInstructionExamples(d, "").status().message(),
              "data.chat_template: conversational data needs a chat template: none given in "
              "data.chat_template, and neither " + tok + "/tokenizer_config.json (\"chat_template\") "
              "nor " + tok + "/chat_template.jinja holds one");
  }
  // A template that raises: its own message, with the line of the data.
  const Files g = Write(R"({"messages":[{"role":"bot","content":"a"}]})" "\n",
                        "{{ raise_exception('roles must be user or assistant') }}");
  auto e = ReadInstructionExamples(Spec(g), "");
  EXPECT_EQ(e.status().message(), "data.train_file: " + g.data + " line 1: chat template '" + g.tmpl +
                                      "' raised an exception at line 1: roles must be user or assistant");
  // A template that is not a prefix of itself with add_generation_prompt.
  const Files h = Write(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"r"}]})" "\n",
                        "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
                        "<gen>{% else %}<end>{% endif %}");
  DataSpec hs = Spec(h);
  hs.assistant_only_loss = true;
  EXPECT_EQ(ReadInstructionExamples(hs, "").status().message(),
            "data.train_file: " + h.data + " line 1: messages[1]: data.assistant_only_loss needs a "
            "chat template whose rendering of the messages before an assistant turn (with "
            "add_generation_prompt) is a prefix of the rendering with it, and that of the whole "
            "conversation; chat template '" + h.tmpl + "' is not");
  hs.assistant_only_loss = false;  // without it the template is fine
  EXPECT_TRUE(ReadInstructionExamples(hs, "").ok());
}

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

TEST(InstructionData, ConversationalLabelsWithAndWithoutAssistantOnlyLoss) {
  const Files f = Write(
      R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":"yo"},{"role":"user","content":"ok?"},)"
      R"({"role":"assistant","content":"sure"}]})" "\n");
  // Worked out by hand from kPlain: each message "<role>content</role>\n"; an assistant span is
  // what follows "<assistant>" (the add_generation_prompt text): "yo</assistant>\n".
  const std::string s0 = "<system>S</system>\n<user>hi</user>\n<assistant>";
  const std::string a0 = "yo</assistant>\n";
  const std::string s1 = "<user>ok?</user>\n<assistant>";
  const std::string a1 = "sure</assistant>\n";
  const std::string text = s0 + a0 + s1 + a1;
  DataSpec d = Spec(f);
  auto all = ReadInstructionExamples(d, "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].text, text);
  EXPECT_EQ((*all)[0].ids, Bytes(text));
  std::vector<int32_t> want = Bytes(text);
  want[0] = -100;
  EXPECT_EQ((*all)[0].labels, want);

  d.assistant_only_loss = true;
  auto only = ReadInstructionExamples(d, "");
  ASSERT_TRUE(only.ok()) << only.status().ToString();
  want.assign(text.size(), -100);
  for (auto [from, n] : {std::pair<size_t, size_t>{s0.size(), a0.size()},
                         {s0.size() + a0.size() + s1.size(), a1.size()}}) {
    for (size_t i = from; i < from + n; ++i) want[i] = static_cast<unsigned char>(text[i]);
  }
  EXPECT_EQ((*only)[0].labels, want);
}

TEST(InstructionData, PromptCompletionLabelsOnGpt2) {
  const std::string gpt2 = testing::SharedData("gpt2");
  if (!FileExists(gpt2 + "/vocab.json")) GTEST_SKIP() << "no " << gpt2;
  const Files f = Write(R"({"prompt":"Hello world","completion":"!"})" "\n" R"({"q":"Hello","a":" world"})" "\n");
  DataSpec d = Spec(f);
  d.tokenizer = gpt2;
  // GPT-2's published ids: "Hello" 15496, " world" 995, "!" 0, eos 50256 (no post-processor).
  auto r = ReadInstructionExamples(d, "", 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].text, "Hello world!");
  EXPECT_EQ((*r)[0].ids, (std::vector<int32_t>{15496, 995, 0, 50256}));
  EXPECT_EQ((*r)[0].labels, (std::vector<int32_t>{-100, -100, 0, 50256}));
  d.completion_only_loss = false;
  r = ReadInstructionExamples(d, "", 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].labels, (std::vector<int32_t>{-100, 995, 0, 50256}));
  // The second line under renamed fields (the first is then of no known kind).
  d.prompt_field = "q";
  d.completion_field = "a";
  d.completion_only_loss = true;
  EXPECT_NE(ReadInstructionExamples(d, "").status().message().find("line 1: no known field"),
            std::string::npos);
  WriteAll(f.data, R"({"q":"Hello","a":" world"})" "\n");
  r = ReadInstructionExamples(d, "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].labels, (std::vector<int32_t>{-100, 995, 50256}));
  // The byte tokenizer has no eos.
  d.tokenizer = "byte";
  EXPECT_EQ(ReadInstructionExamples(d, "").status().message(),
            "data.tokenizer: byte has no EOS token, which prompt-completion data ends each example "
            "with (use a tokenizer with one, or conversational data with a chat template)");
}

// The rows: ids truncated to seq_len + 1, targets[t] = labels[t + 1] or -1, padding -1.
TEST(InstructionData, RowsTruncatePadAndShiftTargets) {
  std::string jsonl;
  for (const char* a : {"yes", "a much longer answer that will not fit"}) {
    jsonl += std::string(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":")") + a + "\"}]}\n";
  }
  const Files f = Write(jsonl);
  DataSpec d = Spec(f);
  d.seq_len = 32;
  d.assistant_only_loss = true;
  auto data = LoadInstructionData(d, "");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_EQ(data->train.size(), 2);
  EXPECT_EQ(data->pad_id, 0);  // byte: no pad, no eos
  auto ex = ReadInstructionExamples(d, "");
  ASSERT_TRUE(ex.ok());
  const int64_t T = 32;
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<int32_t> ids(T), mask(T), tg(T);
    data->train.Get(i, ids.data(), mask.data());
    data->train.TokenTargets(i, tg.data());
    const auto& e = (*ex)[static_cast<size_t>(i)];
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < static_cast<int64_t>(e.ids.size());
      EXPECT_EQ(ids[t], real ? e.ids[t] : 0) << i << " " << t;
      const bool has_next = t + 1 < static_cast<int64_t>(e.ids.size());
      const int32_t want = has_next && e.labels[t + 1] != -100 ? e.labels[t + 1] : -1;
      EXPECT_EQ(tg[t], want) << i << " " << t;
    }
  }
  // The long one: its 33rd token is the last target.
  std::vector<int32_t> tg(T);
  data->train.TokenTargets(1, tg.data());
  EXPECT_EQ(tg[T - 1], (*ex)[1].labels[T]);
  EXPECT_NE(tg[T - 1], -1);
}

TEST(InstructionData, OffsetsOfEveryTokenizerKind) {
  auto byte = DefaultTokenizerFactory().Open("byte", "");
  ASSERT_TRUE(byte.ok());
  std::vector<int64_t> starts;
  auto ids = (*byte)->EncodeWithOffsets("aé", &starts);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 1, 2}));

  const std::string gpt2 = testing::SharedData("gpt2");
  if (FileExists(gpt2 + "/vocab.json")) {
    auto bpe = DefaultTokenizerFactory().Open(gpt2, "");
    ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
    const std::string text = "Hello world!<|endoftext|> héllo  there";
    ids = (*bpe)->EncodeWithOffsets(text, &starts);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, *(*bpe)->Encode(text, false));
    ASSERT_EQ(starts.size(), ids->size());
    // Each token's text is the text from its start to the next one's (byte-level tokens are the
    // text's own bytes; Decode of all of them is the text).
    std::string joined;
    for (size_t i = 0; i < ids->size(); ++i) {
      const size_t end = i + 1 < ids->size() ? static_cast<size_t>(starts[i + 1]) : text.size();
      joined += text.substr(static_cast<size_t>(starts[i]), end - static_cast<size_t>(starts[i]));
    }
    EXPECT_EQ(joined, text);
    EXPECT_EQ(starts[0], 0);
    EXPECT_EQ(starts[1], 5);   // " world"
    EXPECT_EQ(starts[3], 12);  // <|endoftext|>
    EXPECT_EQ(starts[4], 25);  // " h..."
  }

  // WordPiece (lowercasing, accents stripped): the default alignment.
  const std::string dir = testing::MakeTempDir("offsets");
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
  auto wp = DefaultTokenizerFactory().Open(dir + "/tokenizer.json", "");
  ASSERT_TRUE(wp.ok()) << wp.status().ToString();
  ids = (*wp)->EncodeWithOffsets("Hello, Worlds xyz", &starts);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{4, 7, 5, 6, 1}));
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 5, 7, 12, 13}));  // [UNK]: where "s" ended
}

// SentencePiece (a model trained here): the default alignment puts each piece at its word.
TEST(InstructionData, OffsetsOfSentencePiece) {
  const std::string shakespeare = testing::SharedData("tinyshakespeare.txt");
  if (!FileExists(shakespeare)) GTEST_SKIP() << "no " << shakespeare;
  const std::string dir = testing::MakeTempDir("offsets-spm");
  WriteAll(dir + "/corpus.txt", ReadAll(shakespeare).substr(0, 200000));
  ASSERT_EQ(Shell("/usr/bin/spm_train --input='" + dir + "/corpus.txt' --model_prefix='" + dir +
                  "/sp' --vocab_size=400 --model_type=bpe --minloglevel=2 >'" + dir + "/log' 2>&1"),
            0)
      << ReadAll(dir + "/log");
  auto sp = DefaultTokenizerFactory().Open(dir + "/sp.model", "");
  ASSERT_TRUE(sp.ok()) << sp.status().ToString();
  const std::string text = "ROMEO: What light through yonder window breaks?";
  std::vector<int64_t> starts;
  auto ids = (*sp)->EncodeWithOffsets(text, &starts);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, *(*sp)->Encode(text, false));
  ASSERT_EQ(starts.size(), ids->size());
  EXPECT_EQ(starts[0], 0);
  for (size_t i = 0; i < ids->size(); ++i) {
    // The piece's text (its word marker as a space) is the text at its start.
    std::string piece = *(*sp)->Decode({(*ids)[i]}, false);
    while (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    const size_t at = static_cast<size_t>(starts[i]);
    const size_t skip = text[at] == ' ' ? 1 : 0;
    EXPECT_EQ(text.compare(at + skip, piece.size(), piece), 0)
        << "token " << i << " '" << piece << "' at " << at;
    if (i > 0) {
      EXPECT_GT(starts[i], starts[i - 1]);
    }
  }
}

// ---- the five real templates and ours against @huggingface/jinja ----

std::string ReferenceDir(std::string* error) {
  const std::string src = std::string(TRAIND_TESTS_DIR) + "/reference/chat_template";
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return "";
  const std::string dir = std::string(cwd) + "/chat-template-reference";
  const std::string check = "node -e \"require(\\\"@huggingface/jinja\\\")\"";
  const std::string cmd =
      "command -v node >/dev/null && command -v npm >/dev/null && mkdir -p '" + dir + "' && flock '" +
      dir + ".lock' sh -c 'cd \"" + dir + "\" && cp \"" + src + "/package.json\" \"" + src +
      "/package-lock.json\" \"" + src + "/chat_template_ref.js\" . && (" + check +
      " 2>/dev/null || npm ci --no-audit --no-fund --loglevel=error)' >'" + dir + ".log' 2>&1";
  if (Shell(cmd) != 0) {
    *error = "the chat template reference (@huggingface/jinja) could not be installed in " + dir +
             ": " + ReadAll(dir + ".log");
    return "";
  }
  return dir;
}

TEST(InstructionData, RealTemplatesLabelsMatchReferenceSpans) {
  const std::string real = testing::SharedData("chat_templates");
  if (!FileExists(real + "/README.md")) GTEST_SKIP() << "no " << real;
  std::string error;
  const std::string ref = ReferenceDir(&error);
  ASSERT_FALSE(ref.empty()) << error;
  const std::vector<std::string> templates = {
      real + "/meta-llama-Llama-3.1-8B-Instruct.jinja", real + "/Qwen-Qwen2.5-7B-Instruct.jinja",
      real + "/google-gemma-2-2b-it.jinja", real + "/mistralai-Mistral-Nemo-Instruct-2407.jinja",
      real + "/microsoft-Phi-3.5-mini-instruct.jinja", kOwnTemplate};
  // Each template's tokenizer_config.json special tokens (ours: Llama 3's), in a folder given as
  // init_from (the byte tokenizer has no folder of its own).
  const ordered_json specials =
      ordered_json::parse(ReadAll(std::string(TRAIND_TESTS_DIR) + "/chat_templates/special_tokens.json"));
  auto config_of = [&](size_t t) {
    const std::string base = templates[t].substr(templates[t].rfind('/') + 1);
    return specials.contains(base) ? specials[base] : specials["meta-llama-Llama-3.1-8B-Instruct.jinja"];
  };
  const ordered_json convs = ordered_json::parse(R"([
    [{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"4."}],
    [{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
     {"role":"assistant","content":"Hello!"},{"role":"user","content":"Bye é"},
     {"role":"assistant","content":" See you. "}],
    [{"role":"user","content":"one"},{"role":"assistant","content":"two"},
     {"role":"user","content":"three"}]
  ])");
  // Cases: per (template, conversation) the full text, then per assistant turn i the texts
  // before (messages[:i], generation prompt) and up to it (messages[:i+1]).
  ordered_json req;
  req["cases"] = ordered_json::array();
  struct Key { size_t t, c; std::vector<size_t> turns; size_t first; };
  std::vector<Key> keys;
  for (size_t t = 0; t < templates.size(); ++t) {
    const std::string src = ReadAll(templates[t]);
    ASSERT_FALSE(src.empty()) << templates[t];
    for (size_t c = 0; c < convs.size(); ++c) {
      Key k{t, c, {}, req["cases"].size()};
      auto add = [&](size_t n, bool gen) {
        ordered_json msgs = ordered_json::array();
        for (size_t i = 0; i < n; ++i) msgs.push_back(convs[c][i]);
        ordered_json vars = ChatTemplateSpecialTokens(config_of(t));
        vars["messages"] = msgs;
        vars["add_generation_prompt"] = gen;
        req["cases"].push_back({{"template", src}, {"vars", vars}});
      };
      add(convs[c].size(), false);
      for (size_t i = 0; i < convs[c].size(); ++i) {
        if (convs[c][i]["role"] != "assistant") continue;
        k.turns.push_back(i);
        add(i, true);
        add(i + 1, false);
      }
      keys.push_back(k);
    }
  }
  const std::string work = testing::MakeTempDir("instr-ref");
  WriteAll(work + "/req.json", req.dump());
  ASSERT_EQ(Shell("node '" + ref + "/chat_template_ref.js' '" + work + "/req.json' '" + work +
                  "/out.json' >'" + work + "/log' 2>&1"),
            0)
      << ReadAll(work + "/log");
  const ordered_json res = ordered_json::parse(ReadAll(work + "/out.json"))["results"];
  int checked = 0;
  for (const Key& k : keys) {
    const std::string label = templates[k.t] + " conversation " + std::to_string(k.c);
    const ordered_json& full = res[k.first];
    ordered_json line = {{"messages", convs[k.c]}};
    const Files f = Write(line.dump() + "\n");
    DataSpec d = Spec(f);
    d.chat_template = templates[k.t];
    WriteAll(f.dir + "/tokenizer_config.json", config_of(k.t).dump());
    auto read = [&](const DataSpec& spec) { return ReadInstructionExamples(spec, f.dir); };
    if (!full["ok"].get<bool>()) {  // the template refuses it (Gemma: no system role): so do we
      auto refused = read(d);
      ASSERT_FALSE(refused.ok()) << label;
      EXPECT_NE(refused.status().message().find(full["error"].get<std::string>()), std::string::npos)
          << label << ": " << refused.status().message();
      ++checked;
      continue;
    }
    const std::string text = full["text"].get<std::string>();
    // Reference labels (byte tokenizer: token i is byte i): bytes inside an assistant span.
    std::vector<int32_t> want_all = Bytes(text), want_only(text.size(), -100);
    want_all[0] = -100;
    bool prefixes = true;  // Mistral-Nemo moves the system message to the last user turn: not
    for (size_t j = 0; j < k.turns.size(); ++j) {
      const std::string before = res[k.first + 1 + 2 * j]["text"].get<std::string>();
      const std::string upto = res[k.first + 2 + 2 * j]["text"].get<std::string>();
      if (upto.compare(0, before.size(), before) != 0 || text.compare(0, upto.size(), upto) != 0) {
        prefixes = false;
        break;
      }
      for (size_t i = before.size(); i < upto.size(); ++i) want_only[i] = static_cast<unsigned char>(text[i]);
    }
    want_only[0] = -100;
    auto all = read(d);
    ASSERT_TRUE(all.ok()) << label << ": " << all.status().ToString();
    EXPECT_EQ((*all)[0].text, text) << label;
    EXPECT_EQ((*all)[0].labels, want_all) << label;
    d.assistant_only_loss = true;
    auto only = read(d);
    if (!prefixes) {
      ASSERT_FALSE(only.ok()) << label;
      EXPECT_NE(only.status().message().find("chat template '" + templates[k.t] + "' is not"),
                std::string::npos) << only.status().message();
      std::printf("[instr-ref] %s: not prefix-consistent, refused for assistant_only_loss\n",
                  label.c_str());
      ++checked;
      continue;
    }
    ASSERT_TRUE(only.ok()) << label << ": " << only.status().ToString();
    EXPECT_EQ((*only)[0].labels, want_only) << label;
    int64_t with_loss = 0;
    for (int32_t l : want_only) with_loss += l != -100;
    EXPECT_GT(with_loss, 0) << label;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(templates.size() * convs.size()));
}

// ---- the spec's fields ----

TEST(InstructionSpec, FieldsDefaultsValidationAndRoundTrip) {
  const std::string base =
      "model:\n  arch: llama\n  config: {vocab_size: 256, hidden_size: 16, intermediate_size: 32, "
      "num_hidden_layers: 1, num_attention_heads: 2, max_position_embeddings: 64}\n"
      "data:\n  train_file: d.jsonl\n  format: jsonl\n  seq_len: 32\n";
  auto d = ParseJobSpec(base + "output_dir: o\n", "/b");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->data.prompt_field, "prompt");
  EXPECT_EQ(d->data.completion_field, "completion");
  EXPECT_EQ(d->data.messages_field, "messages");
  EXPECT_FALSE(d->data.chat_template.has_value());
  EXPECT_FALSE(d->data.assistant_only_loss);
  EXPECT_TRUE(d->data.completion_only_loss);
  EXPECT_FALSE(d->data.packing);
  auto s = ParseJobSpec(base +
                            "  prompt_field: q\n  completion_field: a\n  messages_field: conv\n"
                            "  chat_template: t/chat.jinja\n  assistant_only_loss: true\n"
                            "  completion_only_loss: false\n  packing: false\noutput_dir: o\n",
                        "/b");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->data.prompt_field, "q");
  EXPECT_EQ(s->data.completion_field, "a");
  EXPECT_EQ(s->data.messages_field, "conv");
  EXPECT_EQ(s->data.chat_template.value_or(""), "/b/t/chat.jinja");  // against the base dir
  EXPECT_TRUE(s->data.assistant_only_loss);
  EXPECT_FALSE(s->data.completion_only_loss);
  // JobSpecToJson round trip.
  const std::string json = JobSpecToJson(*s);
  auto again = ParseJobSpec(json, "/elsewhere");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << json;
  EXPECT_EQ(again->data.chat_template.value_or(""), "/b/t/chat.jinja");
  EXPECT_EQ(again->data.messages_field, "conv");
  EXPECT_TRUE(again->data.assistant_only_loss);
  EXPECT_FALSE(again->data.completion_only_loss);
  EXPECT_EQ(JobSpecToJson(*again), json);

  auto packed = ParseJobSpec(base + "  packing: true\noutput_dir: o\n", "/b");
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_TRUE(packed->data.packing);
  EXPECT_EQ(ParseJobSpec("model:\n  arch: gpt2\n  config: {vocab_size: 256, n_positions: 32, "
                         "n_embd: 16, n_layer: 1, n_head: 2}\n"
                         "data:\n  train_file: d.txt\n  seq_len: 32\n  packing: true\noutput_dir: o\n",
                         "/b")
                .status()
                .message(),
            "data.packing: true packs prompt-completion or conversational examples: needs format "
            "jsonl, got text");
  auto text = ParseJobSpec("model:\n  arch: gpt2\n  config: {vocab_size: 256, n_positions: 32, "
                           "n_embd: 16, n_layer: 1, n_head: 2}\n"
                           "data:\n  train_file: d.txt\n  seq_len: 32\n  assistant_only_loss: true\noutput_dir: o\n", "/b");
  EXPECT_EQ(text.status().message(),
            "data.assistant_only_loss: only for instruction data (data.format jsonl with "
            "prompt-completion or conversational lines) of the causal families (gpt2, llama, ...), "
            "got format text");
  auto bert = ParseJobSpec("model:\n  arch: bert\n  head: masked_lm\n  config: {vocab_size: 256, "
                           "hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, "
                           "intermediate_size: 32, max_position_embeddings: 64}\n"
                           "data:\n  train_file: d.jsonl\n  format: jsonl\n  seq_len: 32\n  chat_template: t.jinja\n"
                           "output_dir: o\n", "/b");
  EXPECT_EQ(bert.status().message(),
            "data.chat_template: only for instruction data (data.format jsonl with "
            "prompt-completion or conversational lines) of the causal families (gpt2, llama, ...), "
            "got arch bert");
}

// ---- training: the loss over the step's tokens ----

// testing::Conversations: unequal lengths, so micro-batches carry unequal counts of loss tokens.
JobSpec ChatSpec(const std::string& dir, const std::string& data, const std::string& tmpl) {
  return testing::ChatJobSpec(dir, data, tmpl, /*seq_len=*/64);
}

TEST(InstructionTraining, AccumulationTwoByTwoEqualsFourByOneOnUnequalCounts) {
  const std::string dir = testing::MakeTempDir("instr-accum");
  WriteAll(dir + "/chat.jsonl", testing::Conversations(24));
  WriteAll(dir + "/t.jinja", kPlain);
  // The micro-batches of the first step really differ in their loss-token counts.
  {
    JobSpec spec = ChatSpec(dir + "/probe", dir + "/chat.jsonl", dir + "/t.jinja");
    auto data = LoadInstructionData(spec.data, "");
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    int64_t counts[2] = {0, 0};
    std::vector<int32_t> tg(64);
    for (int64_t i = 0; i < 4; ++i) {
      data->train.TokenTargets(i, tg.data());
      for (int32_t t : tg) counts[i / 2] += t != -1;
    }
    std::printf("[instr-accum] loss tokens of step 1's micro-batches (B 2): %lld, %lld\n",
                static_cast<long long>(counts[0]), static_cast<long long>(counts[1]));
    ASSERT_NE(counts[0], counts[1]);
  }
  testing::ExpectAccumulationMatchesBatch(
      ChatSpec(dir + "/k", dir + "/chat.jsonl", dir + "/t.jinja"), dir, "instr-accum");
}

// The step's loss is the mean over its loss tokens: at step 1 (fresh weights) equal to the
// evaluation of the same examples (Evaluate's sum / count over the validation rows).
TEST(InstructionTraining, SpecExamplesAreTheJobsView) {
  const std::string dir = testing::MakeTempDir("instr-spec");
  WriteAll(dir + "/chat.jsonl", testing::Conversations(10));
  WriteAll(dir + "/t.jinja", kPlain);
  JobSpec spec = ChatSpec(dir, dir + "/chat.jsonl", dir + "/t.jinja");
  spec.data.validation_split = 0.5;
  spec.data.seq_len = 200;  // nothing truncated
  auto ex = SpecTrainingExamples(spec, 100);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_EQ(ex->size(), 5u);  // the training half only
  auto raw = ReadInstructionExamples(spec.data, "", 2);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*ex)[1].input_ids, (*raw)[1].ids);
  EXPECT_EQ((*ex)[1].labels, (*raw)[1].labels);
  spec.data.seq_len = 16;
  ex = SpecTrainingExamples(spec, 1);
  ASSERT_TRUE(ex.ok());
  ASSERT_EQ(ex->size(), 1u);
  EXPECT_EQ((*ex)[0].input_ids.size(), 17u);  // seq_len + 1: the last only a target
}

}  // namespace
}  // namespace traind::engine
