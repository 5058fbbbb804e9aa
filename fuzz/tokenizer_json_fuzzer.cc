// Fuzz target: the HF tokenizer.json reader (BPE and WordPiece models, normalizers,
// pre-tokenizers, added tokens, post-processors), opened through the factory as data.tokenizer
// names it (the bytes go to a scratch tokenizer.json), then used (tokenizer_check.h).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer_check.h"
#include "traind/engine/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace traind;
  using namespace traind::engine;
  const std::string path = traind::fuzz::WriteScratch("tokenizer.json", data, size);
  auto tok = DefaultTokenizerFactory().Open(path, "");
  if (!tok.ok()) return 0;
  traind::fuzz::ExerciseTokenizer(**tok,
                                  std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
