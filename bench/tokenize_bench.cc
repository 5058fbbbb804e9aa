// GPT-2 BPE tokenization throughput: traind's tokenizer (EncodeLarge on N threads) beside Hugging
// Face tokenizers (its Node bindings, encodeBatch over the same text cut after single newlines,
// RAYON_NUM_THREADS=N) in the same run, on the same tokenizer.json, and the ratio. The reference
// is installed from tests/engine/reference/tokenizers with npm ci into the build folder.
// Usage: tokenize_bench [--gpt2 DIR] [--file TEXT] [--threads N] [--rounds N] [--no-peer]
// Prints "RESULT side=traind MBps=..." and "RESULT side=hf MBps=..." lines and the ratio.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench_util.h"
#include "traind/engine/tokenizer.h"

namespace traind::bench {
namespace {

std::string ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// GPT-2's tokenizer.json (as HF ships it) from vocab.json + merges.txt.
std::string Gpt2TokenizerJson(const std::string& dir) {
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(ReadAll(dir + "/merges.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false},
                        {"lstrip", false}, {"rstrip", false}, {"normalized", true},
                        {"special", true}}};
  j["normalizer"] = nullptr;
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                     {"trim_offsets", true}, {"use_regex", true}};
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""},
                {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", nlohmann::json::parse(ReadAll(dir + "/vocab.json"))},
                {"merges", merges}};
  return j.dump();
}

int Main(int argc, char** argv) {
  std::string gpt2 = std::string(TRAIND_BENCH_SHARED_DATA) + "/gpt2";
  std::string file = std::string(TRAIND_BENCH_SHARED_DATA) + "/tinyshakespeare.txt";
  int threads = 2, rounds = 3;
  bool peer = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gpt2") gpt2 = FlagValue(argc, argv, &i);
    else if (a == "--file") file = FlagValue(argc, argv, &i);
    else if (a == "--threads") threads = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--rounds") rounds = std::atoi(FlagValue(argc, argv, &i));
    else if (a == "--no-peer") peer = false;
    else {
      std::fprintf(stderr, "tokenize_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const std::string text = ReadAll(file);
  if (text.empty()) {
    std::fprintf(stderr, "tokenize_bench: cannot read %s\n", file.c_str());
    return 1;
  }
  char tmpl[] = "/tmp/traind-tokbench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  const std::string json_path = dir + "/tokenizer.json";
  std::ofstream(json_path) << Gpt2TokenizerJson(gpt2);
  const double mb = static_cast<double>(text.size()) / 1e6;

  double best = 0, cold = 0;
  size_t count = 0;
  for (int r = 0; r < rounds; ++r) {
    auto tok = engine::DefaultTokenizerFactory().Open(json_path, "");  // a cold cache each round
    if (!tok.ok()) {
      std::fprintf(stderr, "tokenize_bench: %s\n", tok.status().ToString().c_str());
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = (*tok)->EncodeLarge(text, threads);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ids.ok()) return 1;
    count = ids->size();
    if (r == 0) cold = mb / dt;
    best = std::max(best, mb / dt);
  }
  std::printf("RESULT side=traind MBps=%.2f cold_MBps=%.2f tokens=%zu threads=%d bytes=%zu\n", best,
              cold, count, threads, text.size());
  if (!peer) return 0;

  // The peer: HF tokenizers for Node, installed (once) into the build folder.
  const std::string ref = std::string(TRAIND_BENCH_BUILD_DIR) + "/tokenizer-reference";
  const std::string src = std::string(TRAIND_BENCH_REF_SRC);
  const std::string install =
      "mkdir -p '" + ref + "' && cd '" + ref + "' && cp '" + src + "/package.json' '" + src +
      "/package-lock.json' '" + src + "/tokenizer_ref.js' . && (node -e 'require(\"tokenizers\")' "
      "2>/dev/null || npm ci --no-audit --no-fund --loglevel=error) >/dev/null 2>&1";
  if (std::system(install.c_str()) != 0) {
    std::fprintf(stderr, "tokenize_bench: cannot install the HF tokenizers reference in %s "
                         "(needs node and npm; run with --no-peer to skip it)\n", ref.c_str());
    return 1;
  }
  const std::string cmd = "RAYON_NUM_THREADS=" + std::to_string(threads) + " node '" + ref +
                          "/tokenizer_ref.js' bench '" + json_path + "' '" + file + "' " +
                          std::to_string(rounds);
  FILE* p = ::popen(cmd.c_str(), "r");
  double hf = 0;
  size_t hf_tokens = 0;
  char buf[256];
  while (p && std::fgets(buf, sizeof(buf), p)) {
    std::sscanf(buf, "MB/s %lf", &hf);
    std::sscanf(buf, "tokens %zu", &hf_tokens);
  }
  if (!p || ::pclose(p) != 0 || hf <= 0) {
    std::fprintf(stderr, "tokenize_bench: the HF reference failed: %s\n", cmd.c_str());
    return 1;
  }
  std::printf("RESULT side=hf MBps=%.2f tokens=%zu threads=%d\n", hf, hf_tokens, threads);
  std::printf("GPT-2 BPE on %s (%.2f MB), %d threads, best of %d: traind %.2f MB/s (first round "
              "%.2f), HF tokenizers %.2f MB/s, ratio traind/HF %.2fx%s\n",
              file.c_str(), mb, threads, rounds, best, cold, hf, best / hf,
              hf_tokens == count ? "" : " (token counts differ!)");
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) { return traind::bench::Main(argc, argv); }
