// What the tokenizer fuzz targets do with a tokenizer that loaded: encode a few fixed texts and
// the input's own tail, check every id is in [0, vocab_size), decode the ids and every single id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "traind/engine/tokenizer.h"

namespace traind::fuzz {

inline void ExerciseTokenizer(const traind::engine::Tokenizer& tok, std::string_view input) {
  const int64_t vocab = tok.vocab_size();
  FUZZ_CHECK(vocab > 0, "vocab_size " + std::to_string(vocab));
  const std::string_view tail = input.substr(input.size() - std::min<size_t>(input.size(), 64));
  const std::string_view texts[] = {"",
                                    "Hello world! It's 2024.\n\n  tabs\tand  spaces ",
                                    "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                                    "\xf0\x9f\x99\x82 UNAFFABLE",
                                    "[CLS] <|endoftext|> [SEP] <s></s>",
                                    "\xff\xfe\xc3 \xe2\x82",
                                    tail};
  for (std::string_view text : texts) {
    for (bool special : {false, true}) {
      auto ids = tok.Encode(text, special);
      if (!ids.ok()) continue;  // an error status is fine; a crash or a bad id is not
      for (int32_t id : *ids) {
        FUZZ_CHECK(id >= 0 && id < vocab, "Encode gave id " + std::to_string(id) +
                                              " outside the vocab of " + std::to_string(vocab));
      }
      for (bool skip : {false, true}) {
        FUZZ_CHECK(tok.Decode(*ids, skip).ok(), "Decode of Encode's own ids failed");
      }
    }
  }
  // Every id decodes (bounded, so a large vocab stays fast).
  std::vector<int32_t> all;
  for (int64_t i = 0; i < std::min<int64_t>(vocab, 4096); ++i)
    all.push_back(static_cast<int32_t>(i));
  FUZZ_CHECK(tok.Decode(all, false).ok(), "Decode of ids [0, vocab) failed");
  if (vocab <= INT32_MAX) {
    FUZZ_CHECK(!tok.Decode({static_cast<int32_t>(vocab)}).ok(), "Decode accepted id vocab_size");
  }
  FUZZ_CHECK(!tok.Decode({-1}).ok(), "Decode accepted id -1");
  (void)tok.fingerprint();
  (void)tok.eos_id();
  (void)tok.bos_id();
  (void)tok.pad_id();
}

}  // namespace traind::fuzz
