// The chat template interpreter: renders chat_template_parse.h's tree with Jinja2's semantics
// (scopes, Undefined, loop.*, macros, call blocks); the filters, tests, methods and operators are
// chat_template_builtins.cc's.
#include "data/chat_template.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/chat_template_builtins.h"
#include "data/chat_template_parse.h"

namespace traind::engine {
namespace chat_template_internal {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Interp {
 public:
  // frames: [0] globals, [1] the template's variables (top-level set writes here), then scopes.
  std::vector<std::shared_ptr<Frame>> frames;
  std::string* out = nullptr;
  int depth = 0;        // of for loops (loop.depth)
  int macro_depth = 0;  // of macro calls: recursion is bounded so that it cannot exhaust the stack

  Value Lookup(const std::string& name) const {
    for (size_t k = frames.size(); k-- > 0;) {
      auto it = frames[k]->find(name);
      if (it != frames[k]->end()) return it->second;
    }
    return Value::Undefined("'" + name + "' is undefined");
  }

  Flow Exec(const Body& body) {
    for (const NodeP& n : body) {
      const Flow f = ExecNode(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  std::string Capture(const Body& body) {
    std::string buf;
    std::string* saved = out;
    out = &buf;
    Exec(body);
    out = saved;
    return buf;
  }

  Flow ExecNode(const Node& n) {
    try {
      return ExecNodeImpl(n);
    } catch (TemplateError& e) {
      if (e.line == 0) e.line = n.line;
      throw;
    }
  }

  Flow ExecNodeImpl(const Node& n) {
    switch (n.k) {
      case Node::K::kText:
        *out += n.text;
        return Flow::kNormal;
      case Node::K::kOut:
        *out += ToStr(Eval(*n.e[0]));
        return Flow::kNormal;
      case Node::K::kIf:
        for (size_t k = 0; k < n.e.size(); ++k) {
          if (Truthy(Eval(*n.e[k]))) return Exec(n.bodies[k]);
        }
        if (n.bodies.size() > n.e.size()) return Exec(n.bodies.back());
        return Flow::kNormal;
      case Node::K::kFor:
        return ExecFor(n);
      case Node::K::kSet: {
        Value v = Eval(*n.e[0]);
        if (!n.attr.empty()) {
          Value ns = Lookup(n.names[0]);
          if (ns.kind != Value::Kind::kNamespace) {
            Fail("cannot assign attribute '" + n.attr + "' of '" + n.names[0] +
                 "': not a namespace");
          }
          for (auto& kv : *ns.dict) {
            if (kv.first == n.attr) {
              kv.second = std::move(v);
              return Flow::kNormal;
            }
          }
          ns.dict->emplace_back(n.attr, std::move(v));
          return Flow::kNormal;
        }
        Assign(n.names, v);
        return Flow::kNormal;
      }
      case Node::K::kSetBlock:
        (*frames.back())[n.names[0]] = Value::Str(Capture(n.bodies[0]));
        return Flow::kNormal;
      case Node::K::kMacro:
        (*frames.back())[n.text] = MakeMacro(n);
        return Flow::kNormal;
      case Node::K::kCallBlock: {
        const Expr& call = *n.e[0];
        Value fn = Eval(*call.a[0]);
        CallArgs ca = EvalArgs(call);
        auto scope = frames;
        const Body* body = &n.bodies[0];
        ca.kw.emplace_back("caller", Value::Func([this, scope, body](CallArgs&) {
                             auto saved = frames;
                             frames = scope;
                             frames.push_back(std::make_shared<Frame>());
                             std::string s = Capture(*body);
                             frames = saved;
                             return Value::Str(std::move(s));
                           }));
        *out += ToStr(CallValue(fn, ca, "the call block's macro"));
        return Flow::kNormal;
      }
      case Node::K::kFilter: {
        Value body = Value::Str(Capture(n.bodies[0]));
        const Expr& f = *n.e[0];
        CallArgs ca = EvalArgs(f);
        *out += ToStr(ApplyFilter(f.s, body, ca));
        return Flow::kNormal;
      }
      case Node::K::kScope:
        return Exec(n.bodies[0]);
      case Node::K::kBreak:
        return Flow::kBreak;
      case Node::K::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& names, const Value& v) {
    Frame& f = *frames.back();
    if (names.size() == 1) {
      f[names[0]] = v;
      return;
    }
    const Array items = Items(v);
    if (items.size() != names.size()) {
      Fail("cannot unpack " + std::to_string(items.size()) + " values into " +
           std::to_string(names.size()) + " names");
    }
    for (size_t k = 0; k < names.size(); ++k) f[names[k]] = items[k];
  }

  Flow ExecFor(const Node& n) {
    const Value seq = Eval(*n.e[0]);
    if (seq.is_none()) Fail("'NoneType' object is not iterable");
    Array items = Items(seq);
    if (n.e.size() > 1) {  // the loop filter sees the loop variables, not `loop`
      Array kept;
      for (const Value& item : items) {
        frames.push_back(std::make_shared<Frame>());
        Assign(n.names, item);
        const bool keep = Truthy(Eval(*n.e[1]));
        frames.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      frames.push_back(std::make_shared<Frame>());
      Assign(n.names, items[static_cast<size_t>(k)]);
      Object loop = {
          {"index", Value::Int(k + 1)},
          {"index0", Value::Int(k)},
          {"revindex", Value::Int(len - k)},
          {"revindex0", Value::Int(len - k - 1)},
          {"first", Value::Bool(k == 0)},
          {"last", Value::Bool(k == len - 1)},
          {"length", Value::Int(len)},
          {"depth", Value::Int(depth + 1)},
          {"depth0", Value::Int(depth)},
          {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)]
                             : Value::Undefined("there is no previous item")},
          {"nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)]
                                   : Value::Undefined("there is no next item")},
          {"cycle", Value::Func([k](CallArgs& ca) {
             if (ca.pos.empty()) Fail("loop.cycle() needs at least one item");
             return ca.pos[static_cast<size_t>(k) % ca.pos.size()];
           })},
      };
      (*frames.back())["loop"] = Value::Namespace(std::move(loop));
      ++depth;
      const Flow f = Exec(n.bodies[0]);
      --depth;
      frames.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (len == 0 && n.bodies.size() > 1) return Exec(n.bodies[1]);
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& n) {
    // Defaults are evaluated at call time in the macro's scope, as Jinja does.
    const Node* node = &n;
    auto root = std::vector<std::shared_ptr<Frame>>(frames.begin(), frames.begin() + 2);
    return Value::Func([this, node, root](CallArgs& ca) {
      if (macro_depth >= 100)
        Fail("macro '" + node->text + "': calls nested deeper than 100 levels");
      ++macro_depth;
      struct Unnest {
        int* n;
        ~Unnest() { --*n; }
      } unnest{&macro_depth};
      auto local = std::make_shared<Frame>();
      if (ca.pos.size() > node->names.size()) {
        Fail("macro '" + node->text + "' takes " + std::to_string(node->names.size()) +
             " arguments (" + std::to_string(ca.pos.size()) + " given)");
      }
      auto saved = frames;
      frames = root;
      frames.push_back(local);
      for (size_t k = 0; k < ca.pos.size(); ++k) (*local)[node->names[k]] = ca.pos[k];
      for (const auto& [key, v] : ca.kw) {
        if (key != "caller" &&
            std::find(node->names.begin(), node->names.end(), key) == node->names.end()) {
          frames = saved;
          Fail("macro '" + node->text + "' has no parameter '" + key + "'");
        }
        (*local)[key] = v;
      }
      for (size_t k = 0; k < node->names.size(); ++k) {
        if (local->count(node->names[k])) continue;
        (*local)[node->names[k]] =
            node->e[k] ? Eval(*node->e[k])
                       : Value::Undefined("parameter '" + node->names[k] + "' was not provided");
      }
      std::string s;
      try {
        s = Capture(node->bodies[0]);
      } catch (...) {
        frames = saved;
        throw;
      }
      frames = saved;
      return Value::Str(std::move(s));
    });
  }

  CallArgs EvalArgs(const Expr& e) {
    CallArgs ca;
    for (size_t k = 1; k < e.a.size(); ++k) {
      Value v = Eval(*e.a[k]);
      if (e.kw[k - 1].empty()) {
        ca.pos.push_back(std::move(v));
      } else {
        ca.kw.emplace_back(e.kw[k - 1], std::move(v));
      }
    }
    return ca;
  }

  static Value CallValue(const Value& fn, CallArgs& ca, const std::string& what) {
    if (fn.kind == Value::Kind::kFunc) return (*fn.func)(ca);
    if (fn.is_undefined()) {
      Fail(fn.s.empty() ? what + " is undefined"
                        : fn.s + " (a method or function that is not supported)");
    }
    Fail(what + " is not callable (a " + TypeName(fn) + ")");
  }

  Value Eval(const Expr& e) {
    try {
      return EvalImpl(e);
    } catch (TemplateError& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  // long function: one case per expression kind, the evaluator's whole grammar in one switch
  Value EvalImpl(const Expr& e) {
    switch (e.k) {
      case Expr::K::kLit:
        return e.lit;
      case Expr::K::kName:
        return Lookup(e.s);
      case Expr::K::kAttr:
        return Attribute(Eval(*e.a[0]), e.s);
      case Expr::K::kItem:
        return Item(Eval(*e.a[0]), Eval(*e.a[1]));
      case Expr::K::kSlice: {
        const Value obj = Eval(*e.a[0]);
        if (obj.is_undefined()) FailUndefined(obj);
        const Value none = Value::None();
        const Value a = e.a[1] ? Eval(*e.a[1]) : none, b = e.a[2] ? Eval(*e.a[2]) : none,
                    c = e.a[3] ? Eval(*e.a[3]) : none;
        if (obj.is_list()) {
          Array out;
          for (size_t k : SliceIndices(static_cast<int64_t>(obj.list->size()), a, b, c))
            out.push_back((*obj.list)[k]);
          return Value::List(std::move(out));
        }
        if (obj.is_str()) {
          const std::vector<uint32_t> cps = Utf8Decode(obj.s);
          std::string out;
          for (size_t k : SliceIndices(static_cast<int64_t>(cps.size()), a, b, c))
            AppendUtf8(cps[k], &out);
          return Value::Str(std::move(out));
        }
        Fail(std::string("'") + TypeName(obj) + "' object is not subscriptable with a slice");
      }
      case Expr::K::kCall: {
        const Value fn = Eval(*e.a[0]);
        CallArgs ca = EvalArgs(e);
        std::string what = e.a[0]->k == Expr::K::kName   ? "'" + e.a[0]->s + "'"
                           : e.a[0]->k == Expr::K::kAttr ? "method '" + e.a[0]->s + "'"
                                                         : "the callee";
        return CallValue(fn, ca, what);
      }
      case Expr::K::kFilter: {
        const Value v = Eval(*e.a[0]);
        CallArgs ca = EvalArgs(e);
        return ApplyFilter(e.s, v, ca);
      }
      case Expr::K::kTest: {
        const Value v = Eval(*e.a[0]);
        CallArgs ca = EvalArgs(e);
        return Value::Bool(ApplyTest(e.s, v, ca) != e.negated);
      }
      case Expr::K::kUnary: {
        const Value v = Eval(*e.a[0]);
        if (e.s == "not") return Value::Bool(!Truthy(v));
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number()) Fail("bad operand type for unary " + e.s + ": '" + TypeName(v) + "'");
        if (e.s == "+") return v.kind == Value::Kind::kBool ? Value::Int(v.b) : v;
        return v.kind == Value::Kind::kFloat ? Value::Float(-v.f) : Value::Int(-ToInt(v, "-"));
      }
      case Expr::K::kAnd: {
        Value l = Eval(*e.a[0]);
        return Truthy(l) ? Eval(*e.a[1]) : l;
      }
      case Expr::K::kOr: {
        Value l = Eval(*e.a[0]);
        return Truthy(l) ? l : Eval(*e.a[1]);
      }
      case Expr::K::kCond:
        if (Truthy(Eval(*e.a[0]))) return Eval(*e.a[1]);
        return e.a[2] ? Eval(*e.a[2])
                      : Value::Undefined("the conditional expression had no else branch");
      case Expr::K::kList: {
        Array a;
        for (const ExprP& x : e.a) a.push_back(Eval(*x));
        return Value::List(std::move(a));
      }
      case Expr::K::kDict: {
        Object o;
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          const Value key = Eval(*e.a[k]);
          if (!key.is_str())
            Fail(std::string("dict literal keys must be strings, not ") + TypeName(key));
          Value v = Eval(*e.a[k + 1]);
          auto it =
              std::find_if(o.begin(), o.end(), [&](const auto& kv) { return kv.first == key.s; });
          if (it != o.end()) {
            it->second = std::move(v);
          } else {
            o.emplace_back(key.s, std::move(v));
          }
        }
        return Value::Dict(std::move(o));
      }
      case Expr::K::kBinary: {
        const Value l = Eval(*e.a[0]);
        const Value r = Eval(*e.a[1]);
        const std::string& op = e.s;
        if (op == "~") return Value::Str(ToStr(l) + ToStr(r));
        if (op == "==") return Value::Bool(Equal(l, r));
        if (op == "!=") return Value::Bool(!Equal(l, r));
        if (op == "<") return Value::Bool(Less(l, r, op));
        if (op == ">") return Value::Bool(Less(r, l, op));
        if (op == "<=") return Value::Bool(!Less(r, l, op));
        if (op == ">=") return Value::Bool(!Less(l, r, op));
        if (op == "in") return Value::Bool(Contains(r, l));
        if (op == "not in") return Value::Bool(!Contains(r, l));
        return Arith(op, l, r);
      }
    }
    Fail("unknown expression");
  }
};

}  // namespace
}  // namespace chat_template_internal

namespace cti = chat_template_internal;

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source, std::string name) {
  try {
    auto prog = std::make_shared<cti::Program>(cti::ParseProgram(source));
    return ChatTemplate(std::move(prog), std::move(name));
  } catch (const cti::TemplateError& e) {
    return Status::InvalidArgument("chat template '" + name + "' line " + std::to_string(e.line) +
                                   ": " + e.what());
  } catch (const std::exception& e) {  // std::bad_alloc
    return Status::ResourceExhausted("chat template '" + name + "': " + e.what());
  }
}

namespace {

template <typename Json>
Result<std::string> RenderProgram(const cti::Program& program, const std::string& name,
                                  const Json& vars) {
  if (!vars.is_object()) {
    return Status::InvalidArgument("chat template '" + name +
                                   "': the variables must be a JSON object");
  }
  std::string out;
  try {
    cti::Interp interp;
    interp.frames.push_back(std::make_shared<cti::Frame>(cti::Globals()));
    auto top = std::make_shared<cti::Frame>();
    for (auto it = vars.begin(); it != vars.end(); ++it)
      (*top)[it.key()] = cti::FromJson(it.value());
    interp.frames.push_back(top);
    interp.out = &out;
    interp.Exec(program.body);
  } catch (const cti::TemplateError& e) {
    if (e.raised) {
      return Status::InvalidArgument("chat template '" + name + "' raised an exception at line " +
                                     std::to_string(e.line) + ": " + e.what());
    }
    return Status::InvalidArgument("chat template '" + name + "' line " + std::to_string(e.line) +
                                   ": " + e.what());
  } catch (const std::exception& e) {  // std::bad_alloc
    return Status::ResourceExhausted("chat template '" + name + "': " + e.what());
  }
  return out;
}

}  // namespace

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& vars) const {
  return RenderProgram(*program_, name_, vars);
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& vars) const {
  return RenderProgram(*program_, name_, vars);
}

nlohmann::ordered_json ChatTemplateSpecialTokens(const nlohmann::ordered_json& tokenizer_config) {
  auto token = [](const nlohmann::ordered_json& t) -> std::optional<std::string> {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string())
      return t["content"].get<std::string>();
    return std::nullopt;
  };
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!tokenizer_config.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    auto it = tokenizer_config.find(key);
    if (it == tokenizer_config.end()) continue;
    if (auto t = token(*it)) out[key] = *t;
  }
  auto it = tokenizer_config.find("additional_special_tokens");
  if (it != tokenizer_config.end() && it->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : *it) {
      if (auto s = token(t)) list.push_back(*s);
    }
    out["additional_special_tokens"] = list;
  }
  return out;
}

}  // namespace traind::engine
