// The builtins of chat templates (chat_template_builtins.h) with Python's and Jinja2's semantics.
// To add a filter (or test): its name in Filters() (Tests()), so that Parse accepts it, and its
// case in ApplyFilter (ApplyTest); a str or dict method goes in Method. Check it against Jinja2
// (transformers' environment) and add a case to tests/engine/chat_template_test.cc: features.jinja
// where @huggingface/jinja agrees, else PythonJinjaSemantics with Jinja2's output.
#include "data/chat_template_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "data/chat_template_parse.h"

namespace traind::engine::chat_template_internal {
namespace {

const std::set<std::string>& Filters() {
  static const std::set<std::string> k = {
      "abs",    "capitalize", "count",  "d",          "default", "first",   "float",
      "indent", "int",        "items",  "join",       "last",    "length",  "list",
      "lower",  "map",        "reject", "rejectattr", "replace", "reverse", "safe",
      "select", "selectattr", "string", "title",      "tojson",  "trim",    "upper"};
  return k;
}
const std::set<std::string>& Tests() {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
      "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
      "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
      "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper",
      "==",      "!=",       "<",        "<=",          ">",    ">="};
  return k;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool IsAsciiAlpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
// Python's str.title() (ASCII letters): a letter after an uncased character is upper case, any
// other letter lower case.
std::string Title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c))
                                       : std::toupper(static_cast<unsigned char>(c)));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}
// Jinja's title filter: each word (split at runs of whitespace, '-', '(', '{', '[', '<') has its
// first character upper case and the rest lower case.
std::string TitleFilter(const std::string& s) {
  auto sep = [](char c) {
    return IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    if (sep(c)) {
      word_start = true;
      continue;
    }
    c = static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                     : std::tolower(static_cast<unsigned char>(c)));
    word_start = false;
  }
  return out;
}
std::string Capitalize(const std::string& s) {
  std::string out = AsciiLower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

// Python's str.strip/lstrip/rstrip: whitespace, or the code points of `chars`.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = Utf8Decode(s);
  std::vector<uint32_t> set;
  const bool ws = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!ws) set = Utf8Decode(ToStr(*chars));
  auto drop = [&](uint32_t cp) {
    return ws ? IsPyWhitespace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return Utf8Encode(cps, b, e);
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    const std::vector<uint32_t> cps = Utf8Decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < cps.size()) AppendUtf8(cps[k], &out);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Value Split(const std::string& s, const Value* sep, int64_t maxsplit) {
  Array parts;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace; no empty parts
    const std::vector<uint32_t> cps = Utf8Decode(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && IsPyWhitespace(cps[k])) ++k;
      if (k >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && IsPyWhitespace(cps[e - 1])) --e;
        parts.push_back(Value::Str(Utf8Encode(cps, k, e)));
        break;
      }
      size_t e = k;
      while (e < cps.size() && !IsPyWhitespace(cps[e])) ++e;
      parts.push_back(Value::Str(Utf8Encode(cps, k, e)));
      k = e;
    }
    return Value::List(std::move(parts));
  }
  const std::string d = ToStr(*sep);
  if (d.empty()) Fail("split: empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    parts.push_back(Value::Str(s.substr(pos, f - pos)));
    pos = f + d.size();
  }
  parts.push_back(Value::Str(s.substr(pos)));
  return Value::List(std::move(parts));
}

// Python's len().
int64_t Length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kStr:
      return static_cast<int64_t>(Utf8Decode(v.s).size());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list->size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return static_cast<int64_t>(v.dict->size());
    default:
      Fail(std::string("object of type '") + TypeName(v) + "' has no len()");
  }
}

Value DictItems(const Value& d) {
  Array out;
  for (const auto& [k, v] : *d.dict) out.push_back(Value::List({Value::Str(k), v}));
  return Value::List(std::move(out));
}

// Arguments of a filter, test or method by position or keyword, as Python binds them.
class Args {
 public:
  Args(CallArgs& a, const char* fn) : a_(a), fn_(fn) {}
  // The argument at `pos` or named `name`, or nullptr.
  const Value* Get(size_t pos, const char* name) {
    if (pos < a_.pos.size()) return &a_.pos[pos];
    for (const auto& [k, v] : a_.kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  const Value& Need(size_t pos, const char* name) {
    const Value* v = Get(pos, name);
    if (v == nullptr) Fail(std::string(fn_) + "() is missing its argument '" + name + "'");
    return *v;
  }
  // Fails when more positional arguments than `max_pos` were given, or a keyword not in `names`.
  void Check(size_t max_pos, std::initializer_list<const char*> names) {
    if (a_.pos.size() > max_pos) {
      Fail(std::string(fn_) + "() takes at most " + std::to_string(max_pos) + " arguments (" +
           std::to_string(a_.pos.size()) + " given)");
    }
    for (const auto& kv : a_.kw) {
      bool ok = false;
      for (const char* n : names) ok = ok || kv.first == n;
      if (!ok) Fail(std::string(fn_) + "() got an unexpected keyword argument '" + kv.first + "'");
    }
  }

 private:
  CallArgs& a_;
  const char* fn_;
};

// A bound method of a str or dict, or Undefined naming what was missing.
// long function: one branch per str/dict method Jinja templates call, a table read top to bottom
Value Method(const Value& obj, const std::string& name) {
  const char* type = TypeName(obj);
  auto bind = [&](auto fn) {
    Value self = obj;
    std::string n = name;
    return Value::Func([self, n, fn](CallArgs& ca) {
      Args args(ca, n.c_str());
      return fn(self, args);
    });
  };
  if (obj.is_str()) {
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return bind([starts](const Value& self, Args& args) {
        args.Check(1, {});
        const Value& p = args.Need(0, "prefix");
        auto match = [&](const std::string& x) {
          if (x.size() > self.s.size()) return false;
          return starts ? self.s.compare(0, x.size(), x) == 0
                        : self.s.compare(self.s.size() - x.size(), x.size(), x) == 0;
        };
        if (p.is_list()) {
          for (const Value& x : *p.list) {
            if (match(ToStr(x))) return Value::Bool(true);
          }
          return Value::Bool(false);
        }
        if (!p.is_str())
          Fail(std::string("startswith/endswith: expected a str, got ") + TypeName(p));
        return Value::Bool(match(p.s));
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return bind([l, r](const Value& self, Args& args) {
        args.Check(1, {});
        return Value::Str(Strip(self.s, args.Get(0, "chars"), l, r));
      });
    }
    if (name == "split") {
      return bind([](const Value& self, Args& args) {
        args.Check(2, {"sep", "maxsplit"});
        const Value* m = args.Get(1, "maxsplit");
        return Split(self.s, args.Get(0, "sep"), m ? ToInt(*m, "maxsplit") : -1);
      });
    }
    if (name == "replace") {
      return bind([](const Value& self, Args& args) {
        args.Check(3, {});
        const Value* c = args.Get(2, "count");
        return Value::Str(Replace(self.s, ToStr(args.Need(0, "old")), ToStr(args.Need(1, "new")),
                                  c ? ToInt(*c, "count") : -1));
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const std::string n = name;
      return bind([n](const Value& self, Args& args) {
        args.Check(0, {});
        return Value::Str(n == "upper"   ? AsciiUpper(self.s)
                          : n == "lower" ? AsciiLower(self.s)
                          : n == "title" ? Title(self.s)
                                         : Capitalize(self.s));
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return bind([find](const Value& self, Args& args) {
        args.Check(1, {});
        const std::string sub = ToStr(args.Need(0, "sub"));
        if (find) {
          const size_t f = self.s.find(sub);
          return Value::Int(f == std::string::npos
                                ? -1
                                : static_cast<int64_t>(Utf8Decode(self.s.substr(0, f)).size()));
        }
        if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Decode(self.s).size()) + 1);
        int64_t n = 0;
        for (size_t p = self.s.find(sub); p != std::string::npos;
             p = self.s.find(sub, p + sub.size()))
          ++n;
        return Value::Int(n);
      });
    }
    if (name == "join") {
      return bind([](const Value& self, Args& args) {
        args.Check(1, {});
        std::string out;
        bool first = true;
        for (const Value& x : Items(args.Need(0, "iterable"))) {
          if (!x.is_str()) Fail(std::string("join: expected str items, got ") + TypeName(x));
          if (!first) out += self.s;
          first = false;
          out += x.s;
        }
        return Value::Str(std::move(out));
      });
    }
  } else if (obj.kind == Value::Kind::kDict) {
    if (name == "get") {
      return bind([](const Value& self, Args& args) {
        args.Check(2, {});
        const Value& key = args.Need(0, "key");
        const Value* dflt = args.Get(1, "default");
        const Value* v = key.is_str() ? self.Find(key.s) : nullptr;
        return v ? *v : dflt ? *dflt : Value::None();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      const std::string n = name;
      return bind([n](const Value& self, Args& args) {
        args.Check(0, {});
        if (n == "items") return DictItems(self);
        Array out;
        for (const auto& [k, v] : *self.dict) out.push_back(n == "keys" ? Value::Str(k) : v);
        return Value::List(std::move(out));
      });
    }
  }
  return Value::Undefined(std::string("'") + type + " object' has no attribute '" + name + "'");
}

Value StrftimeNow(CallArgs& ca) {
  Args args(ca, "strftime_now");
  args.Check(1, {});
  const std::string fmt = ToStr(args.Need(0, "format"));
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string buf(256 + fmt.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::Str(std::move(buf));
}

}  // namespace

int64_t ToInt(const Value& v, const char* what) {
  if (v.kind == Value::Kind::kInt) return v.i;
  if (v.kind == Value::Kind::kBool) return v.b;
  Fail(std::string(what) + " must be an integer, not " + TypeName(v));
}

// The items a for loop or a filter iterates: a list's elements, a dict's keys, a string's
// characters; Undefined iterates as empty.
Array Items(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return *v.list;
    case Value::Kind::kDict: {
      Array out;
      for (const auto& kv : *v.dict) out.push_back(Value::Str(kv.first));
      return out;
    }
    case Value::Kind::kStr: {
      Array out;
      for (uint32_t cp : Utf8Decode(v.s)) {
        std::string c;
        AppendUtf8(cp, &c);
        out.push_back(Value::Str(std::move(c)));
      }
      return out;
    }
    default:
      Fail(std::string("'") + TypeName(v) + "' object is not iterable");
  }
}

// Python's slice index adjustment (PySlice_AdjustIndices), then the picked indices.
std::vector<size_t> SliceIndices(int64_t len, const Value& a, const Value& b, const Value& c) {
  const int64_t step = c.is_none() || c.is_undefined() ? 1 : ToInt(c, "a slice step");
  if (step == 0) Fail("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t dflt) -> int64_t {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t x = ToInt(v, "a slice index");
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  const int64_t start = adjust(a, step < 0 ? len - 1 : 0);
  const int64_t stop = adjust(b, step < 0 ? -1 : len);
  std::vector<size_t> out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
    out.push_back(static_cast<size_t>(k));
  return out;
}

bool Less(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_str() && b.is_str()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  Fail("'" + op + "' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) +
       "'");
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kStr:
      if (!item.is_str())
        Fail(std::string("'in <string>' requires string as left operand, not ") + TypeName(item));
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : *container.list) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_str() && container.Find(item.s) != nullptr;
    default:
      Fail(std::string("argument of type '") + TypeName(container) + "' is not iterable");
  }
}

// A filter applied to `v` with the filter's own arguments.
// long function: one branch per Jinja filter, a table read top to bottom
Value ApplyFilter(const std::string& name, const Value& v, CallArgs& ca) {
  Args args(ca, name.c_str());
  auto str_of = [&](const Value& x) {
    if (x.is_undefined()) return std::string();
    return ToStr(x);
  };
  if (name == "default" || name == "d") {
    args.Check(2, {"default_value", "boolean"});
    const Value* dflt = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    const bool use = v.is_undefined() || (boolean && Truthy(*boolean) && !Truthy(v));
    if (use) return dflt ? *dflt : Value::Str("");
    return v;
  }
  if (name == "safe") {
    args.Check(0, {});
    return v;
  }
  if (name == "trim") {
    args.Check(1, {"chars"});
    return Value::Str(Strip(str_of(v), args.Get(0, "chars"), true, true));
  }
  if (name == "upper") return Value::Str(AsciiUpper(str_of(v)));
  if (name == "lower") return Value::Str(AsciiLower(str_of(v)));
  if (name == "title") return Value::Str(TitleFilter(str_of(v)));
  if (name == "capitalize") return Value::Str(Capitalize(str_of(v)));
  if (name == "string") return Value::Str(str_of(v));
  if (name == "replace") {
    args.Check(3, {"old", "new", "count"});
    const Value* count = args.Get(2, "count");
    return Value::Str(Replace(str_of(v), ToStr(args.Need(0, "old")), ToStr(args.Need(1, "new")),
                              count && !count->is_none() ? ToInt(*count, "count") : -1));
  }
  if (name == "length" || name == "count") return Value::Int(Length(v));
  if (name == "tojson") {
    args.Check(1, {"indent", "ensure_ascii", "separators", "sort_keys"});
    const Value* indent = args.Get(0, "indent");
    const Value* ascii = args.Get(99, "ensure_ascii");
    const Value* seps = args.Get(99, "separators");
    const Value* sort = args.Get(99, "sort_keys");
    const int ind = indent && !indent->is_none() ? static_cast<int>(ToInt(*indent, "indent")) : -1;
    std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
    if (seps && !seps->is_none()) {
      if (!seps->is_list() || seps->list->size() != 2)
        Fail("tojson: separators must be a pair of strings");
      item_sep = ToStr((*seps->list)[0]);
      key_sep = ToStr((*seps->list)[1]);
    }
    return Value::Str(
        ToJson(v, ind, ascii && Truthy(*ascii), item_sep, key_sep, sort && Truthy(*sort)));
  }
  if (name == "first" || name == "last") {
    const Array items = Items(v);
    if (items.empty()) return Value::Undefined("no " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::List(Items(v));
  if (name == "reverse") {
    if (v.is_str()) {
      std::vector<uint32_t> cps = Utf8Decode(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::Str(Utf8Encode(cps, 0, cps.size()));
    }
    Array items = Items(v);
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "join") {
    args.Check(2, {"d", "attribute"});
    const Value* sep = args.Get(0, "d");
    const Value* attr = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : Items(v)) {
      if (!first && sep) out += ToStr(*sep);
      first = false;
      out += str_of(attr ? Attribute(item, ToStr(*attr)) : item);
    }
    return Value::Str(std::move(out));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List({});
    if (!v.is_dict()) Fail(std::string("items filter: expected a mapping, got ") + TypeName(v));
    return DictItems(v);
  }
  if (name == "int") {
    args.Check(2, {"default", "base"});
    const Value* dflt = args.Get(0, "default");
    const Value fallback = dflt ? *dflt : Value::Int(0);
    if (v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool)
      return Value::Int(ToInt(v, "int"));
    if (v.kind == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(v.f));
    if (v.is_str()) {
      const std::string t = Strip(v.s, nullptr, true, true);
      char* end = nullptr;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end && *end == '\0') return Value::Int(x);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0') return Value::Int(static_cast<int64_t>(d));
    }
    return fallback;
  }
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.as_double());
    if (v.is_str()) {
      const std::string t = Strip(v.s, nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0') return Value::Float(d);
    }
    const Value* dflt = args.Get(0, "default");
    return dflt ? *dflt : Value::Float(0);
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::Float(std::fabs(v.f));
    return Value::Int(std::llabs(ToInt(v, "abs")));
  }
  if (name == "indent") {
    args.Check(3, {"width", "first", "blank"});
    const Value* width = args.Get(0, "width");
    const Value* first = args.Get(1, "first");
    const Value* blank = args.Get(2, "blank");
    const std::string pad =
        width && width->is_str()
            ? width->s
            : std::string(static_cast<size_t>(width ? ToInt(*width, "width") : 4), ' ');
    const std::string s = str_of(v);
    std::string out;
    size_t pos = 0;
    bool first_line = true;
    while (true) {
      const size_t nl = s.find('\n', pos);
      const std::string line =
          s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      const bool indent_it =
          first_line ? (first && Truthy(*first)) : (!line.empty() || (blank && Truthy(*blank)));
      if (!first_line) out += '\n';
      if (indent_it) out += pad;
      out += line;
      first_line = false;
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    return Value::Str(std::move(out));
  }
  if (name == "map") {
    const Value* attr = args.Get(99, "attribute");
    Array out;
    if (attr) {
      args.Check(0, {"attribute", "default"});
      const Value* dflt = args.Get(99, "default");
      for (const Value& item : Items(v)) {
        Value x = Attribute(item, ToStr(*attr));
        out.push_back(x.is_undefined() && dflt ? *dflt : x);
      }
      return Value::List(std::move(out));
    }
    if (ca.pos.empty()) Fail("map() needs a filter name or attribute=");
    const std::string filter = ToStr(ca.pos[0]);
    if (!Filters().count(filter)) Fail("filter '" + filter + "' (in map) is not supported");
    for (const Value& item : Items(v)) {
      CallArgs rest;
      rest.pos.assign(ca.pos.begin() + 1, ca.pos.end());
      rest.kw = ca.kw;
      out.push_back(ApplyFilter(filter, item, rest));
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "select" || name == "selectattr";
    if (!ca.kw.empty()) Fail(name + "() takes no keyword arguments");
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (ca.pos.empty()) Fail(name + "() needs an attribute name");
      attr = ToStr(ca.pos[k++]);
    }
    std::string test;
    if (k < ca.pos.size()) test = ToStr(ca.pos[k++]);
    if (!test.empty() && !Tests().count(test))
      Fail("test '" + test + "' (in " + name + ") is not supported");
    Array out;
    for (const Value& item : Items(v)) {
      const Value x = by_attr ? Attribute(item, attr) : item;
      bool pass;
      if (test.empty()) {
        pass = Truthy(x);
      } else {
        CallArgs targs;
        targs.pos.assign(ca.pos.begin() + static_cast<std::ptrdiff_t>(k), ca.pos.end());
        pass = ApplyTest(test, x, targs);
      }
      if (pass == keep) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  Fail("filter '" + name + "' is not supported");
}

bool ApplyTest(const std::string& name, const Value& v, CallArgs& ca) {
  Args args(ca, name.c_str());
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_str();
  if (name == "mapping") return v.kind == K::kDict;
  if (name == "sequence") return v.is_str() || v.is_list() || v.kind == K::kDict;
  if (name == "iterable") return v.is_str() || v.is_list() || v.kind == K::kDict;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "callable") return v.kind == K::kFunc;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "lower") return v.is_str() && AsciiLower(v.s) == v.s;
  if (name == "upper") return v.is_str() && AsciiUpper(v.s) == v.s;
  if (name == "odd" || name == "even") {
    const int64_t x = ToInt(v, name.c_str());
    return ((x % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = ToInt(args.Need(0, "num"), "divisibleby");
    if (d == 0) Fail("divisibleby(0)");
    return ToInt(v, "divisibleby") % d == 0;
  }
  const Value& other = args.Need(0, "other");
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, other);
  if (name == "ne" || name == "!=") return !Equal(v, other);
  if (name == "sameas") {
    if (v.kind != other.kind) return false;
    if (v.kind == K::kNone || v.kind == K::kUndefined) return true;
    if (v.kind == K::kBool) return v.b == other.b;
    return Equal(v, other) && (v.dict == other.dict && v.list == other.list);
  }
  if (name == "in") return Contains(other, v);
  if (name == "lt" || name == "<") return Less(v, other, "<");
  if (name == "le" || name == "<=") return !Less(other, v, "<=");
  if (name == "gt" || name == ">") return Less(other, v, ">");
  if (name == "ge" || name == ">=") return !Less(v, other, ">=");
  Fail("test '" + name + "' is not supported");
}

// Jinja's getattr (x.name): a method, else the dict member; Undefined when there is none.
Value Attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_dict()) {
    if (obj.kind == Value::Kind::kDict) {
      Value m = Method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const Value* v = obj.Find(name)) return *v;
    return Value::Undefined(std::string("'") + TypeName(obj) + " object' has no attribute '" +
                            name + "'");
  }
  return Method(obj, name);
}

// Jinja's getitem (x[key]): the member or element, else the attribute for a string key.
Value Item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_list() || obj.is_str()) {
    if (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool) {
      int64_t k = ToInt(key, "an index");
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::Undefined(std::string("list index out of range"));
        return (*obj.list)[static_cast<size_t>(k)];
      }
      const std::vector<uint32_t> cps = Utf8Decode(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::Undefined(std::string("string index out of range"));
      return Value::Str(Utf8Encode(cps, static_cast<size_t>(k), static_cast<size_t>(k) + 1));
    }
  } else if (obj.is_dict() && key.is_str()) {
    if (const Value* v = obj.Find(key.s)) return *v;
  }
  if (key.is_str()) return Attribute(obj, key.s);
  return Value::Undefined(std::string("'") + TypeName(obj) + " object' has no item " + Repr(key));
}

Value Arith(const std::string& op, const Value& l, const Value& r) {
  if (l.is_undefined()) FailUndefined(l);
  if (r.is_undefined()) FailUndefined(r);
  auto unsupported = [&]() -> Value {
    Fail("unsupported operand type(s) for " + op + ": '" + TypeName(l) + "' and '" + TypeName(r) +
         "'");
  };
  if (op == "+") {
    if (l.is_str() && r.is_str()) return Value::Str(l.s + r.s);
    if (l.is_list() && r.is_list()) {
      Array a = *l.list;
      a.insert(a.end(), r.list->begin(), r.list->end());
      return Value::List(std::move(a));
    }
  }
  if (op == "*") {
    const Value* seq = l.is_str() || l.is_list() ? &l : r.is_str() || r.is_list() ? &r : nullptr;
    const Value* n = seq == &l ? &r : &l;
    if (seq && (n->kind == Value::Kind::kInt || n->kind == Value::Kind::kBool)) {
      const int64_t times = std::max<int64_t>(0, ToInt(*n, "a repeat count"));
      const size_t unit = seq->is_str() ? seq->s.size() : seq->list->size();
      if (unit > 0 && static_cast<uint64_t>(times) > (uint64_t{1} << 28) / unit)
        Fail("a repetition of more than 2^28 items");
      if (seq->is_str()) {
        std::string s;
        for (int64_t k = 0; k < times; ++k) s += seq->s;
        return Value::Str(std::move(s));
      }
      Array a;
      for (int64_t k = 0; k < times; ++k) a.insert(a.end(), seq->list->begin(), seq->list->end());
      return Value::List(std::move(a));
    }
  }
  if (op == "%" && l.is_str()) Fail("string formatting with '%' is not supported");
  if (!l.is_number() || !r.is_number()) return unsupported();
  const bool ints = l.kind != Value::Kind::kFloat && r.kind != Value::Kind::kFloat;
  const double a = l.as_double(), b = r.as_double();
  if (op == "/") {
    if (b == 0) Fail("division by zero");
    return Value::Float(a / b);
  }
  if (ints) {
    const int64_t x = ToInt(l, op.c_str()), y = ToInt(r, op.c_str());
    if (op == "+") return Value::Int(x + y);
    if (op == "-") return Value::Int(x - y);
    if (op == "*") return Value::Int(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) Fail("integer division or modulo by zero");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::Int(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {
      int64_t p = 1;
      for (int64_t k = 0; k < y; ++k) p *= x;
      return Value::Int(p);
    }
  }
  if (op == "+") return Value::Float(a + b);
  if (op == "-") return Value::Float(a - b);
  if (op == "*") return Value::Float(a * b);
  if (op == "**") return Value::Float(std::pow(a, b));
  if (b == 0) Fail("float division or modulo by zero");
  if (op == "//") return Value::Float(std::floor(a / b));
  if (op == "%") {
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return Value::Float(m);
  }
  return unsupported();
}

Frame Globals() {
  Frame g;
  g["raise_exception"] = Value::Func([](CallArgs& ca) -> Value {
    throw TemplateError(ca.pos.empty() ? std::string() : ToStr(ca.pos[0]), 0, true);
  });
  g["strftime_now"] = Value::Func(StrftimeNow);
  g["namespace"] = Value::Func([](CallArgs& ca) {
    Object o;
    for (const Value& p : ca.pos) {
      if (!p.is_dict()) Fail("namespace() takes keyword arguments or a dict");
      o.insert(o.end(), p.dict->begin(), p.dict->end());
    }
    o.insert(o.end(), ca.kw.begin(), ca.kw.end());
    return Value::Namespace(std::move(o));
  });
  g["dict"] = Value::Func([](CallArgs& ca) {
    Object o;
    for (const Value& p : ca.pos) {
      if (!p.is_dict()) Fail("dict() takes keyword arguments or a dict");
      o.insert(o.end(), p.dict->begin(), p.dict->end());
    }
    o.insert(o.end(), ca.kw.begin(), ca.kw.end());
    return Value::Dict(std::move(o));
  });
  g["range"] = Value::Func([](CallArgs& ca) {
    if (ca.pos.empty() || ca.pos.size() > 3 || !ca.kw.empty())
      Fail("range() takes 1 to 3 positional arguments");
    int64_t start = 0, stop, step = 1;
    if (ca.pos.size() == 1) {
      stop = ToInt(ca.pos[0], "range");
    } else {
      start = ToInt(ca.pos[0], "range");
      stop = ToInt(ca.pos[1], "range");
      if (ca.pos.size() == 3) step = ToInt(ca.pos[2], "range");
    }
    if (step == 0) Fail("range() arg 3 must not be zero");
    Array a;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      a.push_back(Value::Int(k));
      if (a.size() > 100000) Fail("range() of more than 100000 items");
    }
    return Value::List(std::move(a));
  });
  return g;
}

bool IsSupportedFilter(const std::string& name) { return Filters().count(name) > 0; }
bool IsSupportedTest(const std::string& name) { return Tests().count(name) > 0; }

}  // namespace traind::engine::chat_template_internal
