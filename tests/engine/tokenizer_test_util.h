// Helpers for the tokenizer tests: the Hugging Face tokenizers reference (Node bindings, installed
// with npm ci from tests/engine/reference/tokenizers into the build folder), GPT-2 tokenizer.json
// files built from ../shared/data/gpt2, and generated Unicode test strings.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizers/unicode.h"
#include "traind/engine/tokenizer.h"

namespace traind::engine::testing {

inline std::string SharedData(const std::string& rel) {
  return std::string(TRAIND_SHARED_DATA) + "/" + rel;
}
inline bool FileExists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
inline std::string ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void WriteAll(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
inline std::string TempDir(const std::string& name) {
  std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/") +
                     name + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}
inline int Shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// The folder holding node_modules/tokenizers, installed on first use (npm ci, under a lock so
// parallel test binaries share one install). Empty with *error set when it cannot be installed.
inline std::string ReferenceDir(std::string* error) {
  const std::string src = std::string(TRAIND_TESTS_DIR) + "/reference/tokenizers";
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
    *error = "getcwd failed";
    return "";
  }
  const std::string dir = std::string(cwd) + "/tokenizer-reference";
  const std::string cmd =
      "command -v node >/dev/null && command -v npm >/dev/null && mkdir -p '" + dir +
      "' && flock '" + dir + ".lock' sh -c 'cd \"" + dir + "\" && cp \"" + src +
      "/package.json\" \"" + src + "/package-lock.json\" \"" + src +
      "/tokenizer_ref.js\" . && (node -e \"require(\\\"tokenizers\\\")\" 2>/dev/null || "
      "npm ci --no-audit --no-fund --loglevel=error)' >'" + dir + ".log' 2>&1";
  if (Shell(cmd) != 0 || Shell("cd '" + dir + "' && node -e 'require(\"tokenizers\")' >>'" + dir +
                               ".log' 2>&1") != 0) {
    *error = "the Hugging Face tokenizers reference (npm package tokenizers, for node) could not "
             "be installed or loaded in " + dir + " (needs node and npm: ./run.sh deps installs "
             "them, and npm registry access for npm ci); see " + dir + ".log:\n" +
             ReadAll(dir + ".log");
    return "";
  }
  return dir;
}

struct ReferenceResult {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;
};

// Runs the HF reference on `texts` (and decodes `decode`), or fails the test.
inline bool RunReference(const std::string& tokenizer_json, const std::vector<std::string>& texts,
                         bool add_special_tokens, const std::vector<std::vector<int32_t>>& decode,
                         bool skip_special_tokens, ReferenceResult* out) {
  std::string error;
  const std::string dir = ReferenceDir(&error);
  if (dir.empty()) {
    ADD_FAILURE() << error;
    return false;
  }
  const std::string work = TempDir("traind-tokref");
  nlohmann::json req;
  req["tokenizer"] = tokenizer_json;
  req["texts"] = texts;
  req["add_special_tokens"] = add_special_tokens;
  req["decode"] = decode;
  req["skip_special_tokens"] = skip_special_tokens;
  WriteAll(work + "/req.json", req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  const std::string cmd = "node '" + dir + "/tokenizer_ref.js' encode '" + work + "/req.json' '" +
                          work + "/out.json' >'" + work + "/log' 2>&1";
  if (Shell(cmd) != 0) {
    ADD_FAILURE() << "the reference failed: " << cmd << "\n" << ReadAll(work + "/log");
    return false;
  }
  const nlohmann::json res = nlohmann::json::parse(ReadAll(work + "/out.json"));
  out->ids = res["ids"].get<std::vector<std::vector<int32_t>>>();
  out->decoded = res["decoded"].get<std::vector<std::string>>();
  Shell("rm -rf '" + work + "'");
  return true;
}

// GPT-2's tokenizer.json (as HF's gpt2 repository has it) built from vocab.json + merges.txt.
// `pre_tokenizer` / `post_processor` / `added` replace the GPT-2 defaults when given.
inline nlohmann::json Gpt2TokenizerJson(const std::string& gpt2_dir) {
  nlohmann::json vocab = nlohmann::json::parse(ReadAll(gpt2_dir + "/vocab.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(ReadAll(gpt2_dir + "/merges.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::json::array(
      {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
        {"rstrip", false}, {"normalized", true}, {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                        {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true},
                         {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},           {"dropout", nullptr},
                {"unk_token", nullptr},    {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false},  {"ignore_merges", false},
                {"vocab", vocab},          {"merges", merges}};
  return j;
}

inline std::string Utf8(uint32_t cp) {
  std::string s;
  unicode::AppendUtf8(cp, &s);
  return s;
}

// Mixed-script test strings: words, contractions, emoji (with ZWJ sequences and modifiers), CJK,
// Hangul, Cyrillic, Greek, Arabic, Devanagari, accents (precomposed and combining), digit runs
// (ASCII up to 300 digits, Arabic-Indic, superscripts), and mixed whitespace.
inline std::vector<std::string> GeneratedStrings(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t k) { return static_cast<size_t>(rng() % k); };
  auto range = [&](uint32_t a, uint32_t b) { return Utf8(a + static_cast<uint32_t>(rng() % (b - a + 1))); };
  const std::vector<std::string> words = {
      "the", "The", "HELLO", "world", "it", "don", "we", "they", "I", "naïve", "café", "Straße",
      "über", "déjà", "vu", "tokenizer", "GPT", "λόγος", "Москва", "東京", "日本語", "한국어",
      "مرحبا", "नमस्ते", "ÅNGSTRÖM", "ﬁne", "x86_64", "e-mail", "C++", "hello_world", "Ⅻ", "İstanbul"};
  const std::vector<std::string> contractions = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
                                                 "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'x", "''"};
  const std::vector<std::string> spaces = {" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n",
                                           "\n ", "\u00a0", "\u3000", "\u2003", " \t ", "\u2028",
                                           "\u200b", "\x0b", "\x0c"};
  const std::vector<std::string> emoji = {"🤗", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🙂🙃", "✨"};
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    const size_t parts = 1 + pick(12);
    for (size_t p = 0; p < parts; ++p) {
      switch (pick(14)) {
        case 0: case 1: case 2: s += words[pick(words.size())]; break;
        case 3: s += contractions[pick(contractions.size())]; break;
        case 4: case 5: s += spaces[pick(spaces.size())]; break;
        case 6: s += emoji[pick(emoji.size())]; break;
        case 7: for (size_t k = 1 + pick(6); k > 0; --k) s += range(0x4E00, 0x9FA5); break;
        case 8: {
          const size_t len = pick(5) == 0 ? 50 + pick(250) : 1 + pick(8);
          for (size_t k = 0; k < len; ++k) s += static_cast<char>('0' + pick(10));
          break;
        }
        case 9: {
          static const char* kDigitsLike[] = {"٣٤٥", "²³", "½", "①②", "१२३", "3.14", "1,000,000"};
          s += kDigitsLike[pick(7)];
          break;
        }
        case 10: {
          static const char* kPunct[] = {".", ",", "!?", "...", "—", "“quoted”", "(x)", "[]",
                                         "{}", "#", "$5", "@home", "-", "--", "«»", "¿", "。",
                                         "、", "‼", "<|", "|>", "<|endoftext", "~~~"};
          s += kPunct[pick(23)];
          break;
        }
        case 11: {
          // Latin letters with combining marks, Hangul syllables, Cyrillic, Greek.
          static const std::pair<uint32_t, uint32_t> kRanges[] = {
              {0xAC00, 0xD7A3}, {0x0410, 0x044F}, {0x03B1, 0x03C9}, {0x00C0, 0x00FF},
              {0x3041, 0x3096}, {0x0905, 0x0939}};
          const auto& r = kRanges[pick(6)];
          for (size_t k = 1 + pick(5); k > 0; --k) s += range(r.first, r.second);
          if (pick(3) == 0) s += range(0x0300, 0x036F);  // a combining mark
          break;
        }
        case 12: for (size_t k = 1 + pick(8); k > 0; --k) s += static_cast<char>('a' + pick(26)); break;
        default: s += range(0x21, 0x7E); break;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace traind::engine::testing
