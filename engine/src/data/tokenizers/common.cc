// Shared tokenizer helpers: file reading, hashing, added-token splitting, post-processors,
// id checks and the line-split parallel encoder.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <thread>

#include "data/tokenizers/internal.h"
#include "data/tokenizers/unicode.h"
#include "traind/engine/mutex.h"

namespace traind::engine::tokenizers {

uint64_t Fnv1a(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex16(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kDigits[v & 0xF];
  return s;
}

Result<std::string> ReadFileBytes(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(what + ": " + path + ": no such file");
    return Status::FailedPrecondition(what + ": " + path + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(what + ": " + path + ": is a folder, not a file");
  }
  std::string bytes;
  if (st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return Status::FailedPrecondition(what + ": " + path + ": read failed: " +
                                        std::strerror(err));
    }
    if (r == 0) break;
    bytes.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return bytes;
}

Status Malformed(const std::string& path, const std::string& msg) {
  return Status::InvalidArgument("data.tokenizer: " + path + ": " + msg);
}

bool ParseTokenId(const nlohmann::json& v, int32_t* out) {
  if (!v.is_number_integer()) return false;
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenId)
                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId;
  if (ok) *out = static_cast<int32_t>(v.get<int64_t>());
  return ok;
}

Status CheckIds(const std::vector<int32_t>& ids, int64_t vocab) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Status::InvalidArgument("token id " + std::to_string(ids[i]) + " at position " +
                                     std::to_string(i) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
    }
  }
  return Status::Ok();
}

// ---- added tokens ----

AddedVocab::AddedVocab(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  by_first_byte_.resize(256);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_id_[tokens_[i].id] = i;
    if (tokens_[i].content.empty()) continue;
    if (tokens_[i].content.find('\n') != std::string::npos) any_newline_ = true;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedVocab::ById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocab::ByContent(std::string_view content) const {
  for (const AddedToken& t : tokens_) {
    if (t.content == content) return &t;
  }
  return nullptr;
}

namespace {

bool IsWordChar(std::string_view s, size_t pos_after_or_at, bool before) {
  // The code point just before `pos` (before = true) or at `pos`.
  if (before) {
    if (pos_after_or_at == 0) return false;
    size_t p = pos_after_or_at - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    const uint32_t c = unicode::DecodeUtf8(s, &p);
    return c == '_' || unicode::IsLetter(c) || unicode::IsNumber(c);
  }
  if (pos_after_or_at >= s.size()) return false;
  size_t p = pos_after_or_at;
  const uint32_t c = unicode::DecodeUtf8(s, &p);
  return c == '_' || unicode::IsLetter(c) || unicode::IsNumber(c);
}

size_t WhitespaceBefore(std::string_view s, size_t end, size_t floor) {
  // Start of the run of whitespace code points that ends at `end` (not below `floor`).
  size_t p = end;
  while (p > floor) {
    size_t q = p - 1;
    while (q > floor && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
    size_t r = q;
    if (!unicode::IsWhitespace(unicode::DecodeUtf8(s, &r))) break;
    p = q;
  }
  return p;
}

size_t WhitespaceAfter(std::string_view s, size_t start) {
  size_t p = start;
  while (p < s.size()) {
    size_t q = p;
    if (!unicode::IsWhitespace(unicode::DecodeUtf8(s, &q))) break;
    p = q;
  }
  return p;
}

}  // namespace

void AddedVocab::Split(std::string_view text, std::vector<Piece>* out) const {
  if (tokens_.empty()) {
    if (!text.empty()) out->push_back({text, -1});
    return;
  }
  size_t plain_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto& cands = by_first_byte_[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (size_t idx : cands) {
      const AddedToken& t = tokens_[idx];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.single_word && (IsWordChar(text, i, true) ||
                            IsWordChar(text, i + t.content.size(), false))) {
        continue;
      }
      hit = &t;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, end = i + hit->content.size();
    if (hit->lstrip) start = WhitespaceBefore(text, start, plain_start);
    if (hit->rstrip) end = WhitespaceAfter(text, end);
    if (start > plain_start) out->push_back({text.substr(plain_start, start - plain_start), -1});
    out->push_back({text.substr(start, end - start), hit->id});
    plain_start = i = end;
  }
  if (plain_start < text.size()) out->push_back({text.substr(plain_start), -1});
}

Result<std::vector<AddedToken>> ParseAddedTokens(const nlohmann::json& root,
                                                 const std::string& path) {
  std::vector<AddedToken> out;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return out;
  const nlohmann::json& list = root["added_tokens"];
  if (!list.is_array()) return Malformed(path, "\"added_tokens\" must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& t = list[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    AddedToken a;
    if (!t.is_object() || !t.contains("id") || !ParseTokenId(t["id"], &a.id) ||
        !t.contains("content") || !t["content"].is_string()) {
      return Malformed(path, where + ": expected an object with an integer \"id\" in [0, " +
                             std::to_string(kMaxTokenId) + ") and a string \"content\"");
    }
    a.content = t["content"].get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    out.push_back(std::move(a));
  }
  return out;
}

// ---- post-processors ----

namespace {

Result<int32_t> NamedId(const nlohmann::json& pair, const std::string& path,
                        const std::string& where) {
  if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() ||
      !pair[1].is_number_integer()) {
    return Malformed(path, where + ": expected [\"token\", id]");
  }
  return pair[1].get<int32_t>();
}

Status AddProcessor(const nlohmann::json& pp, const std::string& path, const std::string& where,
                    PostProcessor* out) {
  if (pp.is_null()) return Status::Ok();
  if (!pp.is_object() || !pp.contains("type") || !pp["type"].is_string()) {
    return Malformed(path, where + ": expected an object with a \"type\"");
  }
  const std::string type = pp["type"].get<std::string>();
  if (type == "ByteLevel") return Status::Ok();  // offsets only; ids unchanged
  if (type == "Sequence") {
    if (!pp.contains("processors") || !pp["processors"].is_array()) {
      return Malformed(path, where + ".processors: expected a list");
    }
    for (size_t i = 0; i < pp["processors"].size(); ++i) {
      TRAIND_RETURN_IF_ERROR(AddProcessor(pp["processors"][i], path,
                                          where + ".processors[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    if (!pp.contains("cls") || !pp.contains("sep")) {
      return Malformed(path, where + ": " + type + " needs \"cls\" and \"sep\"");
    }
    TRAIND_ASSIGN_OR_RETURN(int32_t cls, NamedId(pp["cls"], path, where + ".cls"));
    TRAIND_ASSIGN_OR_RETURN(int32_t sep, NamedId(pp["sep"], path, where + ".sep"));
    out->prefix.push_back(cls);
    out->suffix.insert(out->suffix.begin(), sep);
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    if (!pp.contains("single") || !pp["single"].is_array()) {
      return Malformed(path, where + ".single: expected a list");
    }
    const nlohmann::json specials =
        pp.contains("special_tokens") ? pp["special_tokens"] : nlohmann::json::object();
    bool after = false;
    std::vector<int32_t> pre, post;
    for (size_t i = 0; i < pp["single"].size(); ++i) {
      const nlohmann::json& item = pp["single"][i];
      const std::string iw = where + ".single[" + std::to_string(i) + "]";
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return Malformed(path, iw + ": expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        return Malformed(path, iw + ": special token '" + name +
                               "' is not in the template's \"special_tokens\" with its \"ids\"");
      }
      for (const auto& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return Malformed(path, iw + ": non-integer id for " + name);
        (after ? post : pre).push_back(id.get<int32_t>());
      }
    }
    out->prefix.insert(out->prefix.end(), pre.begin(), pre.end());
    out->suffix.insert(out->suffix.begin(), post.begin(), post.end());
    return Status::Ok();
  }
  return Status::Unimplemented("data.tokenizer: post_processor type " + type + " in " + path +
                               " is not supported (TemplateProcessing, BertProcessing, "
                               "RobertaProcessing, ByteLevel, Sequence)");
}

}  // namespace

Result<PostProcessor> ParsePostProcessor(const nlohmann::json& pp, const std::string& path,
                                         const std::unordered_map<std::string, int32_t>& vocab) {
  (void)vocab;
  PostProcessor out;
  TRAIND_RETURN_IF_ERROR(AddProcessor(pp, path, "post_processor", &out));
  return out;
}

// ---- parallel encoding ----

Status EncodeSplitAtLinesTo(
    std::string_view text, int threads,
    const std::function<Result<std::vector<int32_t>>(std::string_view)>& encode,
    std::atomic<int64_t>* bytes_done,
    const std::function<Status(const std::vector<int32_t>&)>& emit) {
  const size_t n = text.size();
  if (threads < 1) threads = 1;
  // With one thread, parts still bound the progress granularity (1 MiB); with more, at least 8
  // parts per thread balance the load.
  const size_t parts_wanted =
      std::max(threads == 1 ? size_t{1} : static_cast<size_t>(threads) * 8, n >> 20);
  if (parts_wanted == 1 || n < (1u << 16)) {
    Result<std::vector<int32_t>> ids = encode(text);
    if (bytes_done != nullptr) bytes_done->fetch_add(static_cast<int64_t>(n));
    if (!ids.ok()) return ids.status();
    return emit(*ids);
  }
  // p is safe when text[p-2 .. p] is "X\nY" with X and Y ASCII non-whitespace: the single '\n'
  // is then one whole piece both in the full text and at the end of the left part.
  auto ascii_non_ws = [&](size_t p) {
    const unsigned char c = static_cast<unsigned char>(text[p]);
    return c < 0x80 && c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f';
  };
  auto safe = [&](size_t p) { return p >= 2 && text[p - 1] == '\n' && ascii_non_ws(p) && ascii_non_ws(p - 2); };
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < parts_wanted; ++k) {
    size_t p = std::max(cuts.back() + 1, n * k / parts_wanted);
    while (p < n && !safe(p)) ++p;
    if (p >= n) break;
    cuts.push_back(p);
  }
  cuts.push_back(n);
  const size_t parts = cuts.size() - 1;
  // Parts are taken in order; a finished part waits in `results` until every part before it has
  // been emitted. The thread that completes the next part in line emits it (and any that waited
  // behind it) under `mu`, so emits never overlap and come in order.
  std::vector<Result<std::vector<int32_t>>> results(parts, Status::Internal("not encoded"));
  std::vector<char> ready(parts, 0);  // guarded by mu
  Mutex mu;
  size_t emitted = 0;                 // guarded by mu
  Status failed = Status::Ok();       // guarded by mu
  std::atomic<bool> stop{false};
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; !stop.load() && (i = next.fetch_add(1)) < parts;) {
      Result<std::vector<int32_t>> r = encode(text.substr(cuts[i], cuts[i + 1] - cuts[i]));
      if (bytes_done != nullptr) bytes_done->fetch_add(static_cast<int64_t>(cuts[i + 1] - cuts[i]));
      MutexLock lock(&mu);
      results[i] = std::move(r);
      ready[i] = 1;
      while (failed.ok() && emitted < parts && ready[emitted]) {
        Result<std::vector<int32_t>>& e = results[emitted];
        Status st = e.ok() ? emit(*e) : e.status();
        e = Status::Internal("emitted");  // frees the part's ids
        ++emitted;
        if (!st.ok()) {
          failed = std::move(st);
          stop = true;
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (!failed.ok()) return failed;
  if (emitted != parts) return Status::Internal("EncodeSplitAtLinesTo: a part was not emitted");
  return Status::Ok();
}

Result<std::vector<int32_t>> EncodeSplitAtLines(
    std::string_view text, int threads,
    const std::function<Result<std::vector<int32_t>>(std::string_view)>& encode,
    std::atomic<int64_t>* bytes_done) {
  std::vector<int32_t> out;
  TRAIND_RETURN_IF_ERROR(EncodeSplitAtLinesTo(
      text, threads, encode, bytes_done, [&out](const std::vector<int32_t>& part) {
        if (out.empty()) {
          out = part;
        } else {
          out.insert(out.end(), part.begin(), part.end());
        }
        return Status::Ok();
      }));
  return out;
}

}  // namespace traind::engine::tokenizers

namespace traind::engine {

Result<std::vector<int32_t>> Tokenizer::EncodeWithOffsets(std::string_view text,
                                                          std::vector<int64_t>* starts) const {
  TRAIND_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text, false));
  starts->assign(ids.size(), 0);
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  // The first case-insensitive match of `core` in text at or after `from`, no further than
  // `window` bytes on (a later repeat of the token's text is not the token).
  auto find = [&](std::string_view core, size_t from, size_t window) -> size_t {
    for (size_t p = from; p + core.size() <= text.size() && p <= from + window; ++p) {
      size_t k = 0;
      while (k < core.size() && lower(text[p + k]) == lower(core[k])) ++k;
      if (k == core.size()) return p;
    }
    return std::string_view::npos;
  };
  size_t at = 0;  // where the previous token ended
  for (size_t i = 0; i < ids.size(); ++i) {
    Result<std::string> piece = Decode({ids[i]}, false);
    const std::string p = piece.ok() ? *piece : std::string();
    std::string_view core = p;
    // Word markers: SentencePiece's space (the text may not hold it), WordPiece's "##".
    size_t lead = 0;
    for (;;) {
      if (!core.empty() && core[0] == ' ') {
        core.remove_prefix(1);
        ++lead;
      } else if (core.substr(0, 3) == "\xE2\x96\x81") {
        core.remove_prefix(3);
        ++lead;
      } else if (core.substr(0, 2) == "##") {
        core.remove_prefix(2);
      } else {
        break;
      }
    }
    const size_t found = core.empty() ? std::string_view::npos : find(core, at, 16 + lead);
    if (found == std::string_view::npos) {
      (*starts)[i] = static_cast<int64_t>(std::min(at, text.size()));
      continue;
    }
    // The start is the token's first character: its leading space when the text has it there.
    size_t begin = found;
    while (begin > at && found - begin < lead && text[begin - 1] == ' ') --begin;
    (*starts)[i] = static_cast<int64_t>(begin);
    at = found + core.size();
  }
  return ids;
}

}  // namespace traind::engine
