// SpecReader: typed reading of job spec mappings with field-path error messages.
// Scalars are parsed from their text here (not with yaml-cpp's as<T>) so quoting is respected:
// "5" (quoted) is a string, not an integer.
#include "train/spec_reader.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace traind::engine::spec {
namespace {

bool IsQuoted(const YAML::Node& n) { return n.Tag() == "!"; }

std::string JoinAllowed(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return (IsQuoted(n) ? "string '" : "'") + n.Scalar() + "'";
}

bool ParseInt64(const YAML::Node& n, int64_t* out) {
  if (!n.IsScalar() || IsQuoted(n)) return false;
  const std::string& s = n.Scalar();
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || end != s.c_str() + s.size()) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

Result<SpecReader> SpecReader::Open(const YAML::Node& node, const std::string& path) {
  if (!node.IsMap()) {
    return Status::InvalidArgument((path.empty() ? std::string("job spec") : path) +
                                   ": expected a mapping, got " + Describe(node));
  }
  SpecReader r;
  r.node_ = node;
  r.path_ = path;
  return r;
}

std::string SpecReader::PathOf(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

Status SpecReader::CheckKeys(const std::vector<std::string>& known,
                             const std::set<std::string>& foreign,
                             const std::string& foreign_message) const {
  std::set<std::string> seen;
  for (const auto& kv : node_) {  // kv is a value (yaml-cpp iterators yield temporaries)
    const YAML::Node k = kv.first;
    if (!k.IsScalar()) {
      return Status::InvalidArgument((path_.empty() ? std::string("job spec") : path_) +
                                     ": field names must be strings, got " + Describe(k));
    }
    const std::string key = k.Scalar();
    if (!seen.insert(key).second) return Error(key, "duplicate field");
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (foreign.count(key)) return Error(key, foreign_message);
    std::string hint;
    int best = 3;
    for (const std::string& cand : known) {
      const int d = EditDistance(key, cand);
      if (d < best) {
        best = d;
        hint = cand;
      }
    }
    return Error(key, "unknown field" + (hint.empty() ? "" : " (did you mean " + hint + "?)"));
  }
  return Status::Ok();
}

bool SpecReader::Has(const std::string& key) const { return static_cast<bool>(node_[key]); }

YAML::Node SpecReader::Child(const std::string& key) const { return node_[key]; }

Status SpecReader::Int(const std::string& key, int64_t* out, int64_t min) const {
  const YAML::Node n = node_[key];
  if (!n) return Status::Ok();
  int64_t v = 0;
  if (!ParseInt64(n, &v)) return Error(key, "expected an integer, got " + Describe(n));
  if (v < min) {
    return Error(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  }
  *out = v;
  return Status::Ok();
}

Status SpecReader::Double(const std::string& key, double* out) const {
  const YAML::Node n = node_[key];
  if (!n) return Status::Ok();
  if (!n.IsScalar() || IsQuoted(n) || n.Scalar().empty()) {
    return Error(key, "expected a number, got " + Describe(n));
  }
  const std::string& s = n.Scalar();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v) ||
      s.find_first_of("xXnN") != std::string::npos) {
    return Error(key, "expected a finite number, got " + Describe(n));
  }
  *out = v;
  return Status::Ok();
}

Status SpecReader::Bool(const std::string& key, bool* out) const {
  const YAML::Node n = node_[key];
  if (!n) return Status::Ok();
  if (n.IsScalar() && !IsQuoted(n)) {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
      return Status::Ok();
    }
    if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
      return Status::Ok();
    }
  }
  return Error(key, "expected true or false, got " + Describe(n));
}

Status SpecReader::String(const std::string& key, std::string* out) const {
  const YAML::Node n = node_[key];
  if (!n) return Status::Ok();
  if (!n.IsScalar()) return Error(key, "expected a string, got " + Describe(n));
  *out = n.Scalar();
  return Status::Ok();
}

Status SpecReader::OptionalString(const std::string& key, std::optional<std::string>* out) const {
  const YAML::Node n = node_[key];
  if (!n) return Status::Ok();
  if (n.IsNull()) {
    out->reset();
    return Status::Ok();
  }
  if (!n.IsScalar()) return Error(key, "expected a string or null, got " + Describe(n));
  *out = n.Scalar();
  return Status::Ok();
}

Status SpecReader::Enum(const std::string& key, std::string* out,
                        const std::vector<std::string>& allowed) const {
  std::string v = *out;
  TRAIND_RETURN_IF_ERROR(String(key, &v));
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    return Error(key, "expected one of " + JoinAllowed(allowed) + ", got '" + v + "'");
  }
  *out = v;
  return Status::Ok();
}

}  // namespace traind::engine::spec
