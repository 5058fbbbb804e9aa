// Values of the chat template interpreter (chat_template.h): the Python objects a Jinja template
// sees (Undefined, None, bool, int, float, str, list, dict, namespace, callables), with Python's
// str(), repr(), truthiness, equality and json.dumps. Private to chat_template*.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace traind::engine::chat_template_internal {

// A runtime error of a template; `line` is 0 until the statement or expression that raised it
// fills it in. `raised` marks raise_exception's own message.
struct TemplateError : std::runtime_error {
  TemplateError(std::string msg, int line_ = 0, bool raised_ = false)
      : std::runtime_error(std::move(msg)), line(line_), raised(raised_) {}
  int line;
  bool raised;
};

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, as Python's dict

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNamespace, kFunc };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                   // kStr; for kUndefined, what was undefined (for errors)
  std::shared_ptr<Array> list;     // kList (never mutated once built: the sandbox is immutable)
  std::shared_ptr<Object> dict;    // kDict, kNamespace (a namespace's attributes are assignable)
  std::shared_ptr<Function> func;  // kFunc

  static Value Undefined(std::string what = "") {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value None() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value Bool(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v;
    v.kind = Kind::kStr;
    v.s = std::move(x);
    return v;
  }
  static Value List(Array a) {
    Value v;
    v.kind = Kind::kList;
    v.list = std::make_shared<Array>(std::move(a));
    return v;
  }
  static Value Dict(Object o) {
    Value v;
    v.kind = Kind::kDict;
    v.dict = std::make_shared<Object>(std::move(o));
    return v;
  }
  static Value Namespace(Object o) {
    Value v = Dict(std::move(o));
    v.kind = Kind::kNamespace;
    return v;
  }
  static Value Func(Function fn) {
    Value v;
    v.kind = Kind::kFunc;
    v.func = std::make_shared<Function>(std::move(fn));
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_str() const { return kind == Kind::kStr; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  double as_double() const {
    return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i);
  }

  // The member `key` of a dict, or nullptr.
  const Value* Find(const std::string& key) const;
};

// Python's type name ("str", "int", "list", "dict", "NoneType", "Undefined", ...).
const char* TypeName(const Value& v);
// Python's bool(v).
bool Truthy(const Value& v);
// Python's str(v) (Undefined renders as ""), and repr(v).
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
// Python's ==.
bool Equal(const Value& a, const Value& b);
// transformers' tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys) (indent < 0:
// none). Undefined and callables raise TemplateError.
std::string ToJson(const Value& v, int indent, bool ensure_ascii, const std::string& item_sep,
                   const std::string& key_sep, bool sort_keys);
// Python's float repr ("1.0", "0.1", "1e+16").
std::string FloatRepr(double x);
// JSON in, Value out (objects in the JSON's order; nlohmann::json's is sorted).
Value FromJson(const nlohmann::ordered_json& j);
Value FromJson(const nlohmann::json& j);

// UTF-8 helpers: code points of s (bytes of invalid UTF-8 map to themselves), and back.
std::vector<uint32_t> Utf8Decode(const std::string& s);
std::string Utf8Encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void AppendUtf8(uint32_t cp, std::string* out);
// Python's str.isspace() for one code point.
bool IsPyWhitespace(uint32_t cp);

}  // namespace traind::engine::chat_template_internal
