// The builtins of the chat template interpreter (chat_template.cc): Python's operators, Jinja's
// getattr/getitem, the filters, tests and str/dict methods that chat templates use, and the
// globals transformers adds. Private to chat_template*.cc. Every function throws TemplateError
// (without a line: the caller's statement or expression fills it in) on bad input.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "data/chat_template_value.h"

namespace traind::engine::chat_template_internal {

[[noreturn]] inline void Fail(const std::string& msg) { throw TemplateError(msg); }
// A strict use of Undefined (arithmetic, attributes, calls): Jinja's UndefinedError.
[[noreturn]] inline void FailUndefined(const Value& v) {
  Fail(v.s.empty() ? "undefined value" : v.s);
}

// An int (or bool) as int64_t; `what` names it in the error.
int64_t ToInt(const Value& v, const char* what);
// What a for loop or a filter iterates: a list's elements, a dict's keys, a string's characters;
// Undefined iterates as empty.
Array Items(const Value& v);
// The indices picked by Python's slice [a:b:c] (None or Undefined: omitted) of a length-len
// sequence.
std::vector<size_t> SliceIndices(int64_t len, const Value& a, const Value& b, const Value& c);
// Python's a < b for numbers and strings; `op` names the operator in the error.
bool Less(const Value& a, const Value& b, const std::string& op);
// Python's `item in container`.
bool Contains(const Value& container, const Value& item);
// Python's + - * / // % ** (op) on l and r.
Value Arith(const std::string& op, const Value& l, const Value& r);
// Jinja's getattr (x.name: a str/dict method, else the dict member) and getitem (x[key]);
// Undefined (naming what was missing) when there is none.
Value Attribute(const Value& obj, const std::string& name);
Value Item(const Value& obj, const Value& key);
// The filter or test `name` applied to v with its own arguments.
Value ApplyFilter(const std::string& name, const Value& v, CallArgs& ca);
bool ApplyTest(const std::string& name, const Value& v, CallArgs& ca);

// raise_exception, strftime_now, namespace, dict, range.
using Frame = std::unordered_map<std::string, Value>;
Frame Globals();

}  // namespace traind::engine::chat_template_internal
