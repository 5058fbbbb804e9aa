// The GPT-2 and LLaMA-3 pre-tokenizer expressions as hand-written leftmost-first matchers; each
// branch below is one alternative of the expression, tried in the expression's order, with the
// backtracking of `\s+(?!\S)` spelled out.
#include "data/tokenizers/pretokenize.h"

#include "data/tokenizers/unicode.h"

namespace traind::engine::tokenizers {

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

enum Kind : uint8_t { kWs, kL, kN, kO };  // whitespace, letter, number, other

struct Cursor {
  std::string_view s;
  // The code point at p, its kind and the position after it.
  uint32_t At(size_t p, size_t* next) const {
    const auto b = static_cast<unsigned char>(s[p]);
    if (b < 0x80) {
      *next = p + 1;
      return b;
    }
    size_t q = p;
    const uint32_t c = unicode::DecodeUtf8(s, &q);
    *next = q;
    return c;
  }
  static Kind KindOf(uint32_t c) {
    if (c < 0x80) {
      if ((c | 0x20) - 'a' < 26) return kL;
      if (c - '0' < 10) return kN;
      if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return kWs;
      return kO;
    }
    if (unicode::IsWhitespace(c)) return kWs;
    const unicode::Class cls = unicode::ClassOf(c);
    if (cls == unicode::kLetter) return kL;
    if (cls == unicode::kNumber) return kN;
    return kO;
  }
  Kind KindAt(size_t p, size_t* next, uint32_t* cp = nullptr) const {
    const uint32_t c = At(p, next);
    if (cp) *cp = c;
    return KindOf(c);
  }
  // End of the run of code points of kind k starting at p (p itself not checked).
  size_t RunEnd(size_t p, Kind k) const {
    while (p < s.size()) {
      size_t q;
      if (KindAt(p, &q) != k) break;
      p = q;
    }
    return p;
  }
};

// \s+(?!\S)|\s+ at p, where the code point at p is whitespace.
size_t WhitespaceMatch(const Cursor& c, size_t p) {
  size_t e = p, last = p;
  while (e < c.s.size()) {
    size_t q;
    if (c.KindAt(e, &q) != kWs) break;
    last = e;
    e = q;
  }
  if (e == c.s.size()) return e;  // (?!\S) holds at the end
  if (last > p) return last;      // give back the last whitespace: it is followed by whitespace
  return e;                       // \s+ (one whitespace before a non-whitespace)
}

size_t ContractionEnd(std::string_view s, size_t p, bool ignore_case) {
  // s[p] == '\''
  if (p + 1 >= s.size()) return 0;
  auto low = [&](char ch) { return ignore_case && ch >= 'A' && ch <= 'Z' ? char(ch + 32) : ch; };
  const char a = low(s[p + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
  if (p + 2 < s.size()) {
    const char b = low(s[p + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
  }
  return 0;
}

}  // namespace

void SplitGpt2(std::string_view s, std::vector<Span>* out) {
  const Cursor c{s};
  size_t i = 0;
  while (i < s.size()) {
    size_t j;
    uint32_t cp;
    const Kind k = c.KindAt(i, &j, &cp);
    size_t end = 0;
    if (cp == '\'') end = ContractionEnd(s, i, false);
    if (end == 0) {
      // ' ?' then \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+
      Kind body = k;
      size_t body_start = i;
      if (cp == ' ' && j < s.size()) {
        size_t q;
        const Kind next = c.KindAt(j, &q);
        if (next != kWs) {
          body = next;
          body_start = j;
        }
      }
      if (body != kWs) end = c.RunEnd(body_start, body);
      else end = WhitespaceMatch(c, i);
    }
    out->emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(end));
    i = end;
  }
}

void SplitLlama3(std::string_view s, std::vector<Span>* out) {
  const Cursor c{s};
  size_t i = 0;
  while (i < s.size()) {
    size_t j;
    uint32_t cp;
    const Kind k = c.KindAt(i, &j, &cp);
    size_t end = 0;
    if (cp == '\'') end = ContractionEnd(s, i, true);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (end == 0) {
      if (k == kL) {
        end = c.RunEnd(i, kL);
      } else if (k != kN && cp != '\r' && cp != '\n' && j < s.size()) {
        size_t q;
        if (c.KindAt(j, &q) == kL) end = c.RunEnd(j, kL);
      }
    }
    // \p{N}{1,3}
    if (end == 0 && k == kN) {
      end = j;
      for (int n = 1; n < 3 && end < s.size(); ++n) {
        size_t q;
        if (c.KindAt(end, &q) != kN) break;
        end = q;
      }
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if (end == 0) {
      size_t body_start = i;
      Kind body = k;
      if (cp == ' ' && j < s.size()) {
        size_t q;
        body = c.KindAt(j, &q);
        body_start = j;
      }
      if (body == kO) {
        end = c.RunEnd(body_start, kO);
        while (end < s.size() && (s[end] == '\r' || s[end] == '\n')) ++end;
      }
    }
    // \s*[\r\n]+ | \s+(?!\S) | \s+   (k is whitespace here)
    if (end == 0) {
      size_t e = i, after_newline = 0;
      while (e < s.size()) {
        size_t q;
        uint32_t w;
        if (c.KindAt(e, &q, &w) != kWs) break;
        if (w == '\r' || w == '\n') after_newline = q;
        e = q;
      }
      end = after_newline != 0 ? after_newline : WhitespaceMatch(c, i);
    }
    out->emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(end));
    i = end;
  }
}

}  // namespace traind::engine::tokenizers
