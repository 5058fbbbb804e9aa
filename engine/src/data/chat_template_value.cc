// Python semantics for the chat template interpreter's values: str(), repr(), truthiness, ==,
// json.dumps (as transformers' tojson calls it), and UTF-8 code points.
#include "data/chat_template_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace traind::engine::chat_template_internal {

const Value* Value::Find(const std::string& key) const {
  if (!dict) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* TypeName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kStr:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunc:
      return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kStr:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kFunc:
      return true;
  }
  return false;
}

std::string FloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // The shortest decimal that reads back as x (Python's repr), as digits and an exponent.
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s(buf);
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (s[k] != '.') digits += s[k];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out.append(digits, 0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
    return out;
  }
  if (exp < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exp - 1), '0');
    out += digits;
    return out;
  }
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    out += digits;
    out.append(int_len - digits.size(), '0');
    out += ".0";
    return out;
  }
  out.append(digits, 0, int_len);
  out += '.';
  out.append(digits, int_len, std::string::npos);
  return out;
}

namespace {

std::string StrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

// Python's json escapes for one byte below 0x80 (or any byte of UTF-8 text when !ensure_ascii).
void JsonEscapeByte(unsigned char c, std::string* out) {
  switch (c) {
    case '"':
      *out += "\\\"";
      break;
    case '\\':
      *out += "\\\\";
      break;
    case '\n':
      *out += "\\n";
      break;
    case '\r':
      *out += "\\r";
      break;
    case '\t':
      *out += "\\t";
      break;
    case '\b':
      *out += "\\b";
      break;
    case '\f':
      *out += "\\f";
      break;
    default:
      if (c < 0x20) {
        char b[8];
        std::snprintf(b, sizeof(b), "\\u%04x", c);
        *out += b;
      } else {
        *out += static_cast<char>(c);
      }
  }
}

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) JsonEscapeByte(c, out);
  } else {
    for (uint32_t cp : Utf8Decode(s)) {
      char b[16];
      if (cp < 0x80) {
        JsonEscapeByte(static_cast<unsigned char>(cp), out);
        continue;
      } else if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      *out += b;
    }
  }
  *out += '"';
}

void JsonDump(const Value& v, int indent, bool ensure_ascii, const std::string& item_sep,
              const std::string& key_sep, bool sort_keys, int depth, std::string* out) {
  switch (v.kind) {
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      *out += std::isnan(v.f)   ? "NaN"
              : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                                : FloatRepr(v.f);
      return;
    case Value::Kind::kStr:
      JsonString(v.s, ensure_ascii, out);
      return;
    case Value::Kind::kUndefined:
      throw TemplateError("tojson of an undefined value" +
                          (v.s.empty() ? std::string() : ": " + v.s));
    case Value::Kind::kFunc:
      throw TemplateError("tojson of a function");
    case Value::Kind::kList:
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      break;
  }
  const bool is_list = v.kind == Value::Kind::kList;
  const size_t n = is_list ? v.list->size() : v.dict->size();
  *out += is_list ? '[' : '{';
  if (n == 0) {
    *out += is_list ? ']' : '}';
    return;
  }
  std::string pad;
  if (indent >= 0)
    pad.append(1, '\n').append(static_cast<size_t>(indent) * static_cast<size_t>(depth + 1), ' ');
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  if (!is_list && sort_keys) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return (*v.dict)[a].first < (*v.dict)[b].first; });
  }
  for (size_t k = 0; k < n; ++k) {
    if (k > 0) *out += item_sep;
    *out += pad;
    if (is_list) {
      JsonDump((*v.list)[k], indent, ensure_ascii, item_sep, key_sep, sort_keys, depth + 1, out);
    } else {
      const auto& [key, val] = (*v.dict)[order[k]];
      JsonString(key, ensure_ascii, out);
      *out += key_sep;
      JsonDump(val, indent, ensure_ascii, item_sep, key_sep, sort_keys, depth + 1, out);
    }
  }
  if (indent >= 0)
    out->append(1, '\n').append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
  *out += is_list ? ']' : '}';
}

}  // namespace

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kStr:
      return StrRepr(v.s);
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + Repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->size(); ++k) {
        out += (k ? ", " : "") + StrRepr((*v.dict)[k].first) + ": " + Repr((*v.dict)[k].second);
      }
      return out + "}";
    }
    case Value::Kind::kNamespace:
      return "<Namespace>";
    default:
      return ToStr(v);
  }
}

std::string ToStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatRepr(v.f);
    case Value::Kind::kStr:
      return v.s;
    case Value::Kind::kFunc:
      return "<function>";
    default:
      return Repr(v);
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      return (a.kind == Value::Kind::kBool ? a.b : a.i) ==
             (b.kind == Value::Kind::kBool ? b.b : b.i);
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kStr:
      return a.s == b.s;
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    }
    default:
      return a.dict == b.dict && a.func == b.func;
  }
}

std::string ToJson(const Value& v, int indent, bool ensure_ascii, const std::string& item_sep,
                   const std::string& key_sep, bool sort_keys) {
  std::string out;
  JsonDump(v, indent, ensure_ascii, item_sep, key_sep, sort_keys, 0, &out);
  return out;
}

namespace {

template <typename Json>
Value FromJsonImpl(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case Json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(j.template get<uint64_t>()));
    case Json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case Json::value_t::string:
      return Value::Str(j.template get<std::string>());
    case Json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(FromJsonImpl(e));
      return Value::List(std::move(a));
    }
    case Json::value_t::object: {
      Object o;
      o.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        o.emplace_back(it.key(), FromJsonImpl(it.value()));
      return Value::Dict(std::move(o));
    }
    default:
      return Value::None();
  }
}

}  // namespace

Value FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }
Value FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }

std::vector<uint32_t> Utf8Decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t k = 0;
  while (k < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    const size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 9;
    bool ok = n != 9 && k + n < s.size();
    uint32_t cp = n == 0 ? c : static_cast<uint32_t>(c & (0x3F >> n));
    for (size_t m = 1; ok && m <= n; ++m) {
      const unsigned char cc = static_cast<unsigned char>(s[k + m]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {  // invalid UTF-8: the byte stands for itself
      out.push_back(c);
      ++k;
      continue;
    }
    out.push_back(cp);
    k += n + 1;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Utf8Encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) AppendUtf8(cps[k], &out);
  return out;
}

bool IsPyWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace traind::engine::chat_template_internal
