// Pre-tokenizers of byte-level BPE tokenizers, written out by hand from their regular expressions
// (no regex library): each appends the [begin, end) byte ranges of the pieces of `s`, in order,
// covering `s` completely.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace traind::engine::tokenizers {

using Span = std::pair<uint32_t, uint32_t>;

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(std::string_view s, std::vector<Span>* out);

// LLaMA-3 (also GPT-4's cl100k):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void SplitLlama3(std::string_view s, std::vector<Span>* out);

extern const char kGpt2Pattern[];
extern const char kLlama3Pattern[];

}  // namespace traind::engine::tokenizers
