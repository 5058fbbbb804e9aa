// Fuzz target: GPT-2's vocab.json + merges.txt reader. The input is vocab.json, a NUL byte, then
// merges.txt (no NUL: all of it is vocab.json and merges.txt is empty); both go into a scratch
// folder that is opened as data.tokenizer names a folder, then used (tokenizer_check.h).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer_check.h"
#include "traind/engine/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace traind;
  using namespace traind::engine;
  static const std::string dir = [] {
    const std::string d = traind::fuzz::ScratchDir() + "/gpt2";
    std::filesystem::create_directories(d);
    return d;
  }();
  const auto* nul = size > 0 ? static_cast<const uint8_t*>(memchr(data, 0, size)) : nullptr;
  const size_t vocab_size = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  traind::fuzz::WriteScratch("gpt2/vocab.json", data, vocab_size);
  const size_t merges_at = nul != nullptr ? vocab_size + 1 : size;
  traind::fuzz::WriteScratch("gpt2/merges.txt", data + merges_at, size - merges_at);
  auto tok = DefaultTokenizerFactory().Open(dir, "");
  if (!tok.ok()) return 0;
  traind::fuzz::ExerciseTokenizer(**tok,
                                  std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
