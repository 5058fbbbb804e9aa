// Unicode helpers for the tokenizers: table lookups by binary search, UTF-8 coding, NFD.
#include "data/tokenizers/unicode.h"

#include <algorithm>

namespace traind::engine::unicode {
namespace {

const Mapping* FindMapping(const Mapping* table, size_t n, uint32_t cp) {
  const Mapping* end = table + n;
  const Mapping* it =
      std::lower_bound(table, end, cp, [](const Mapping& m, uint32_t c) { return m.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

uint8_t CombiningClassOf(uint32_t cp) {
  const CombiningClass* end = kCombiningClasses + kCombiningClassCount;
  const CombiningClass* it = std::lower_bound(
      kCombiningClasses, end, cp, [](const CombiningClass& m, uint32_t c) { return m.cp < c; });
  return (it != end && it->cp == cp) ? it->ccc : 0;
}

void Decompose(uint32_t cp, std::u32string* out) {
  // Hangul syllables decompose algorithmically (Unicode 3.12).
  constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr uint32_t kTCount = 28, kNCount = 588, kSCount = 11172;
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  // The generated table holds full (recursive) decompositions already.
  if (const Mapping* m = FindMapping(kDecomposition, kDecompositionCount, cp)) {
    for (int i = 0; i < m->len; ++i) out->push_back(m->to[i]);
    return;
  }
  out->push_back(cp);
}

}  // namespace

Class ClassOf(uint32_t cp) {
  if (cp > 0x10FFFF) return kControl;
  const CategoryRange* end = kCategoryRanges + kCategoryRangeCount;
  // The ranges tile [0, 0x10FFFF]: the first range whose last >= cp holds cp.
  const CategoryRange* it = std::lower_bound(
      kCategoryRanges, end, cp, [](const CategoryRange& r, uint32_t c) { return r.last < c; });
  return static_cast<Class>(it->cls);
}

bool IsWhitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const size_t i = *pos;
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  int len = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
  if (len == 0 || i + static_cast<size_t>(len) > s.size()) {
    *pos = i + 1;
    return 0xFFFD;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((b & 0xC0) != 0x80) {
      *pos = i + 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *pos = i + 1;
    return 0xFFFD;
  }
  *pos = i + static_cast<size_t>(len);
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void AppendLowercase(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    return;
  }
  if (const Mapping* m = FindMapping(kLowercase, kLowercaseCount, cp)) {
    for (int i = 0; i < m->len; ++i) AppendUtf8(m->to[i], out);
    return;
  }
  AppendUtf8(cp, out);
}

std::u32string Nfd(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) Decompose(static_cast<uint32_t>(c), &out);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  size_t i = 0;
  while (i < out.size()) {
    if (CombiningClassOf(static_cast<uint32_t>(out[i])) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && CombiningClassOf(static_cast<uint32_t>(out[j])) != 0) ++j;
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i),
                     out.begin() + static_cast<std::ptrdiff_t>(j), [](char32_t a, char32_t b) {
                       return CombiningClassOf(static_cast<uint32_t>(a)) <
                              CombiningClassOf(static_cast<uint32_t>(b));
                     });
    i = j;
  }
  return out;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    // Length and the valid range of the second byte (Unicode Table 3-7).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    // Consume the maximal valid prefix; replace it with one U+FFFD if incomplete.
    size_t k = 1;
    for (; k < static_cast<size_t>(len) && i + k < bytes.size(); ++k) {
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
    }
    if (k == static_cast<size_t>(len)) {
      out.append(bytes.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

}  // namespace traind::engine::unicode
