// The syntax tree of a chat template (chat_template.h): what chat_template_parse.cc builds from
// the source and chat_template.cc renders. Private to chat_template*.cc.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template_value.h"

namespace traind::engine::chat_template_internal {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    kLit,     // lit
    kName,    // s
    kAttr,    // a[0].s
    kItem,    // a[0][a[1]]
    kSlice,   // a[0][a[1]:a[2]:a[3]] (null children are omitted bounds)
    kCall,    // a[0](a[1..]) with kw[k-1] the keyword of a[k] ("" positional)
    kFilter,  // a[0] | s(a[1..]) (a[0] null in a filter block)
    kTest,    // a[0] is [not] s(a[1..])
    kUnary,   // s ("-", "+", "not") a[0]
    kBinary,  // a[0] s a[1]
    kAnd,
    kOr,
    kCond,  // a[1] if a[0] else a[2] (a[2] null: Undefined)
    kList,  // [a...] (also tuples)
    kDict,  // {a[0]: a[1], a[2]: a[3], ...}
  };
  K k = K::kLit;
  int line = 0;
  std::string s;
  Value lit;
  std::vector<ExprP> a;
  std::vector<std::string> kw;
  bool negated = false;
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum class K {
    kText,       // text
    kOut,        // {{ e[0] }}
    kIf,         // e[k] selects bodies[k]; bodies.size() == e.size() + 1 holds the else branch
    kFor,        // for names in e[0] [if e[1]]: bodies[0], else bodies[1]
    kSet,        // names (a tuple) = e[0]; attr non-empty: names[0].attr = e[0]
    kSetBlock,   // names[0] = rendered bodies[0]
    kMacro,      // macro text(names...) with defaults e (null: none): bodies[0]
    kCallBlock,  // e[0] (a call) with caller = bodies[0]
    kFilter,     // e[0] (a filter with a null operand) applied to rendered bodies[0]
    kScope,      // bodies[0] rendered in place (generation blocks)
    kBreak,
    kContinue,
  };
  K k = K::kText;
  int line = 0;
  std::string text;
  std::string attr;
  std::vector<std::string> names;
  std::vector<ExprP> e;
  std::vector<Body> bodies;
};

struct Program {
  Body body;
};

// Parses `source` with transformers' settings (trim_blocks, lstrip_blocks, a single trailing
// newline dropped). Throws TemplateError with the line on a syntax error or an unsupported
// construct.
Program ParseProgram(std::string_view source);

// The filters and tests the interpreter implements (chat_template.cc), checked at parse time.
bool IsSupportedFilter(const std::string& name);
bool IsSupportedTest(const std::string& name);

}  // namespace traind::engine::chat_template_internal
