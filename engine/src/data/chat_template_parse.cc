// Lexer and parser of chat templates: Jinja's syntax with transformers' environment settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline off), into chat_template_parse.h's tree.
#include "data/chat_template_parse.h"

#include <cctype>
#include <cstdlib>
#include <set>

namespace traind::engine::chat_template_internal {
namespace {

[[noreturn]] void Fail(int line, const std::string& msg) { throw TemplateError(msg, line); }

struct Tok {
  enum class K { kName, kStr, kInt, kFloat, kOp, kEnd };
  K k = K::kEnd;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Piece {
  enum class K { kText, kVar, kBlock };
  K k = K::kText;
  std::string text;
  std::vector<Tok> toks;  // ends with a kEnd token
  int line = 0;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja's lexer: every line ending becomes \n, and one trailing newline is dropped.
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Piece> Run() {
    std::vector<Piece> out;
    size_t pos = 0;
    bool strip_next = false;
    while (pos < src_.size()) {
      size_t t = pos;
      while (true) {
        t = src_.find('{', t);
        if (t == std::string::npos || t + 1 >= src_.size()) {
          t = std::string::npos;
          break;
        }
        const char c = src_[t + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++t;
      }
      std::string data = src_.substr(pos, t == std::string::npos ? std::string::npos : t - pos);
      if (strip_next) {
        size_t b = 0;
        while (b < data.size() && IsSpace(data[b])) ++b;
        data.erase(0, b);
        strip_next = false;
      }
      if (t == std::string::npos) {
        if (!data.empty()) out.push_back(TextPiece(std::move(data), pos));
        break;
      }
      const char kind = src_[t + 1];
      const char sign = t + 2 < src_.size() ? src_[t + 2] : '\0';
      if (sign == '-') {
        while (!data.empty() && IsSpace(data.back())) data.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs between a line start and a block or comment tag go.
        const size_t nl = data.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if ((l_pos > 0 || line_starting) &&
            data.find_first_not_of(" \t", l_pos) == std::string::npos) {
          data.resize(l_pos);
        }
      }
      if (!data.empty()) out.push_back(TextPiece(std::move(data), pos));
      const int line = LineAt(t);
      pos = t + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string::npos) Fail(line, "comment '{#' is never closed with '#}'");
        const char before = end > pos ? src_[end - 1] : '\0';
        pos = end + 2;
        if (before == '-') {
          strip_next = true;
        } else if (before != '+' && pos < src_.size() && src_[pos] == '\n') {
          ++pos;  // trim_blocks
        }
        continue;
      }
      Piece p;
      p.k = kind == '{' ? Piece::K::kVar : Piece::K::kBlock;
      p.line = line;
      char end_sign = '\0';
      pos = LexTag(pos, p.k == Piece::K::kVar, line, &p.toks, &end_sign);
      if (end_sign == '-') {
        strip_next = true;
      } else if (p.k == Piece::K::kBlock && end_sign != '+' && pos < src_.size() &&
                 src_[pos] == '\n') {
        ++pos;  // trim_blocks
      }
      out.push_back(std::move(p));
    }
    return out;
  }

 private:
  Piece TextPiece(std::string text, size_t pos) {
    Piece p;
    p.text = std::move(text);
    p.line = LineAt(pos);
    return p;
  }

  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_++] == '\n') ++line_;
    }
    return line_;
  }

  // Lexes the tokens of a {{ }} or {% %} tag from pos; returns the position after its end.
  // long function: the tag lexer's one loop over characters; its states share the open brackets
  size_t LexTag(size_t pos, bool var, int open_line, std::vector<Tok>* toks, char* end_sign) {
    std::string open;  // the brackets opened and not yet closed
    const char* close = var ? "}}" : "%}";
    while (true) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        Fail(open_line,
             std::string(var ? "'{{'" : "'{%'") + " is never closed with '" + close + "'");
      }
      const int line = LineAt(pos);
      if (open.empty()) {
        for (char sign : {'-', '+', '\0'}) {
          const std::string end = sign ? std::string(1, sign) + close : std::string(close);
          if (src_.compare(pos, end.size(), end) == 0 && !(var && sign == '+')) {
            *end_sign = sign;
            Tok e;
            e.line = line;
            toks->push_back(e);
            return pos + end.size();
          }
        }
      }
      Tok t;
      t.line = line;
      const char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        t.k = Tok::K::kName;
        t.s = src_.substr(pos, e - pos);
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        while (e < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[e + 1])) &&
            !(toks->size() && toks->back().k == Tok::K::kOp && toks->back().s == ".")) {
          is_float = true;
          ++e;
          while (e < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
            ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            is_float = true;
            e = x;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = pos; k < e; ++k) {
          if (src_[k] != '_') num += src_[k];
        }
        if (is_float) {
          t.k = Tok::K::kFloat;
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          t.k = Tok::K::kInt;
          t.i = std::strtoll(num.c_str(), nullptr, 10);
        }
        pos = e;
      } else if (c == '\'' || c == '"') {
        t.k = Tok::K::kStr;
        pos = LexString(pos, line, &t.s);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : kOps) {
          const std::string o(op);
          if (src_.compare(pos, o.size(), o) == 0) {
            t.k = Tok::K::kOp;
            t.s = o;
            pos += o.size();
            found = true;
            break;
          }
        }
        if (!found) Fail(line, std::string("unexpected character '") + c + "'");
        if (t.s == "(" || t.s == "[" || t.s == "{")
          open += t.s == "(" ? ')' : t.s == "[" ? ']' : '}';
        if (t.s == ")" || t.s == "]" || t.s == "}") {
          if (open.empty() || open.back() != t.s[0]) {
            Fail(line, "unexpected '" + t.s + "'" +
                           (open.empty() ? std::string()
                                         : std::string(", expected '") + open.back() + "'"));
          }
          open.pop_back();
        }
      }
      toks->push_back(std::move(t));
    }
  }

  // A Python string literal at pos (its quote); returns the position after its closing quote.
  size_t LexString(size_t pos, int line, std::string* out) {
    const char q = src_[pos++];
    while (true) {
      if (pos >= src_.size()) Fail(line, "string literal is never closed");
      const char c = src_[pos++];
      if (c == q) return pos;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (pos >= src_.size()) Fail(line, "string literal is never closed");
      const char e = src_[pos++];
      auto hex = [&](size_t n) {
        if (pos + n > src_.size())
          Fail(line, "truncated \\x, \\u or \\U escape in a string literal");
        uint32_t v = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = src_[pos++];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            Fail(line, "bad hex escape in a string literal");
          v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : (std::tolower(h) - 'a' + 10));
        }
        AppendUtf8(v, out);
      };
      switch (e) {
        case 'n':
          *out += '\n';
          break;
        case 't':
          *out += '\t';
          break;
        case 'r':
          *out += '\r';
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'v':
          *out += '\v';
          break;
        case 'a':
          *out += '\a';
          break;
        case '0':
          *out += '\0';
          break;
        case '\\':
          *out += '\\';
          break;
        case '\'':
          *out += '\'';
          break;
        case '"':
          *out += '"';
          break;
        case '\n':
          break;  // a line continuation
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          *out += '\\';
          *out += e;
          break;  // Python keeps unknown escapes
      }
    }
  }

  std::string src_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---- expressions --------------------------------------------------------------------------------

class ExprParser {
 public:
  explicit ExprParser(const std::vector<Tok>& toks) : t_(toks) {}

  const Tok& Peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().k == Tok::K::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).k == Tok::K::kOp && Peek(ahead).s == op;
  }
  bool IsName(const char* n, size_t ahead = 0) const {
    return Peek(ahead).k == Tok::K::kName && Peek(ahead).s == n;
  }
  const Tok& Next() {
    const Tok& t = Peek();
    if (p_ < t_.size() - 1) ++p_;
    return t;
  }
  int Line() const { return Peek().line; }

  static std::string Describe(const Tok& t) {
    switch (t.k) {
      case Tok::K::kEnd:
        return "the end of the tag";
      case Tok::K::kStr:
        return "a string";
      case Tok::K::kInt:
      case Tok::K::kFloat:
        return "a number";
      default:
        return "'" + t.s + "'";
    }
  }
  void Expect(const char* op) {
    if (!IsOp(op)) Fail(Line(), std::string("expected '") + op + "', found " + Describe(Peek()));
    Next();
  }
  std::string ExpectName(const char* what) {
    if (Peek().k != Tok::K::kName)
      Fail(Line(), std::string("expected ") + what + ", found " + Describe(Peek()));
    return Next().s;
  }
  void ExpectEnd() {
    if (!AtEnd()) Fail(Line(), "unexpected " + Describe(Peek()));
  }

  // expr (',' expr)* as a list when there is a comma.
  ExprP ParseTuple() {
    const int line = Line();
    ExprP first = ParseExpr();
    if (!IsOp(",")) return first;
    auto list = Make(Expr::K::kList, line);
    list->a.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (AtEnd() || IsOp(")") || IsOp("=")) break;
      list->a.push_back(ParseExpr());
    }
    return list;
  }

  // An expression without a trailing `if` (a for loop's iterable, before its filter).
  ExprP ParseNoCond() { return ParseOr(); }

  ExprP ParseExpr() {
    ExprP e = ParseOr();
    while (IsName("if")) {
      const int line = Line();
      Next();
      auto c = Make(Expr::K::kCond, line);
      c->a.push_back(ParseOr());
      c->a.push_back(std::move(e));
      if (IsName("else")) {
        Next();
        c->a.push_back(ParseExpr());
      } else {
        c->a.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

 private:
  static ExprP Make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  static ExprP Bin(Expr::K k, const std::string& op, ExprP l, ExprP r, int line) {
    auto e = Make(k, line);
    e->s = op;
    e->a.push_back(std::move(l));
    e->a.push_back(std::move(r));
    return e;
  }

  ExprP ParseOr() {
    ExprP e = ParseAnd();
    while (IsName("or")) {
      const int line = Line();
      Next();
      e = Bin(Expr::K::kOr, "or", std::move(e), ParseAnd(), line);
    }
    return e;
  }
  ExprP ParseAnd() {
    ExprP e = ParseNot();
    while (IsName("and")) {
      const int line = Line();
      Next();
      e = Bin(Expr::K::kAnd, "and", std::move(e), ParseNot(), line);
    }
    return e;
  }
  ExprP ParseNot() {
    if (IsName("not")) {
      const int line = Line();
      Next();
      auto e = Make(Expr::K::kUnary, line);
      e->s = "not";
      e->a.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprP ParseCompare() {
    ExprP e = ParseConcat();
    while (true) {
      const int line = Line();
      std::string op;
      if (Peek().k == Tok::K::kOp && (Peek().s == "==" || Peek().s == "!=" || Peek().s == "<" ||
                                      Peek().s == "<=" || Peek().s == ">" || Peek().s == ">=")) {
        op = Next().s;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return e;
      }
      e = Bin(Expr::K::kBinary, op, std::move(e), ParseConcat(), line);
    }
  }
  ExprP ParseConcat() {
    ExprP e = ParseMath1();
    while (IsOp("~")) {
      const int line = Line();
      Next();
      e = Bin(Expr::K::kBinary, "~", std::move(e), ParseMath1(), line);
    }
    return e;
  }
  ExprP ParseMath1() {
    ExprP e = ParseMath2();
    while (IsOp("+") || IsOp("-")) {
      const int line = Line();
      const std::string op = Next().s;
      e = Bin(Expr::K::kBinary, op, std::move(e), ParseMath2(), line);
    }
    return e;
  }
  ExprP ParseMath2() {
    ExprP e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const int line = Line();
      const std::string op = Next().s;
      e = Bin(Expr::K::kBinary, op, std::move(e), ParsePow(), line);
    }
    return e;
  }
  ExprP ParsePow() {
    ExprP e = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Line();
      Next();
      e = Bin(Expr::K::kBinary, "**", std::move(e), ParseUnary(true), line);
    }
    return e;
  }
  ExprP ParseUnary(bool with_filter) {
    ExprP e;
    const int line = Line();
    if (IsOp("-") || IsOp("+")) {
      e = Make(Expr::K::kUnary, line);
      e->s = Next().s;
      e->a.push_back(ParseUnary(false));
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprP ParsePrimary() {
    const Tok& t = Peek();
    const int line = t.line;
    // Nesting is recursion here and at render: bounded, so that bad input cannot exhaust the stack.
    if (++nesting_ > kMaxNesting)
      Fail(line, "expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    struct Unnest {
      int* n;
      ~Unnest() { --*n; }
    } unnest{&nesting_};
    auto lit = [&](Value v) {
      auto e = Make(Expr::K::kLit, line);
      e->lit = std::move(v);
      return e;
    };
    switch (t.k) {
      case Tok::K::kName: {
        const std::string n = Next().s;
        if (n == "true" || n == "True") return lit(Value::Bool(true));
        if (n == "false" || n == "False") return lit(Value::Bool(false));
        if (n == "none" || n == "None") return lit(Value::None());
        auto e = Make(Expr::K::kName, line);
        e->s = n;
        return e;
      }
      case Tok::K::kStr: {
        std::string s;
        while (Peek().k == Tok::K::kStr) s += Next().s;  // adjacent literals concatenate
        return lit(Value::Str(std::move(s)));
      }
      case Tok::K::kInt:
        return lit(Value::Int(Next().i));
      case Tok::K::kFloat:
        return lit(Value::Float(Next().f));
      case Tok::K::kOp:
        if (t.s == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Make(Expr::K::kList, line);
          }
          ExprP e = ParseTuple();
          Expect(")");
          return e;
        }
        if (t.s == "[") {
          Next();
          auto e = Make(Expr::K::kList, line);
          while (!IsOp("]")) {
            e->a.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          Expect("]");
          return e;
        }
        if (t.s == "{") {
          Next();
          auto e = Make(Expr::K::kDict, line);
          while (!IsOp("}")) {
            e->a.push_back(ParseExpr());
            Expect(":");
            e->a.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          Expect("}");
          return e;
        }
        break;
      case Tok::K::kEnd:
        break;
    }
    Fail(line, "unexpected " + Describe(t));
  }

  ExprP ParsePostfix(ExprP e) {
    while (true) {
      const int line = Line();
      if (IsOp(".")) {
        Next();
        if (Peek().k == Tok::K::kInt) {
          auto item = Make(Expr::K::kItem, line);
          item->a.push_back(std::move(e));
          auto idx = Make(Expr::K::kLit, line);
          idx->lit = Value::Int(Next().i);
          item->a.push_back(std::move(idx));
          e = std::move(item);
          continue;
        }
        auto attr = Make(Expr::K::kAttr, line);
        attr->s = ExpectName("an attribute name after '.'");
        attr->a.push_back(std::move(e));
        e = std::move(attr);
      } else if (IsOp("[")) {
        Next();
        ExprP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) parts[k] = ParseExpr();
          if (k < 2 && IsOp(":")) {
            Next();
            slice = true;
          } else {
            break;
          }
        }
        Expect("]");
        auto sub = Make(slice ? Expr::K::kSlice : Expr::K::kItem, line);
        sub->a.push_back(std::move(e));
        if (!slice && !parts[0]) Fail(line, "empty subscript '[]'");
        sub->a.push_back(std::move(parts[0]));
        if (slice) {
          sub->a.push_back(std::move(parts[1]));
          sub->a.push_back(std::move(parts[2]));
        }
        e = std::move(sub);
      } else if (IsOp("(")) {
        auto call = Make(Expr::K::kCall, line);
        call->a.push_back(std::move(e));
        ParseArgs(call.get());
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  // '(' args ')' into e->a (after what is already there) and e->kw.
  void ParseArgs(Expr* e) {
    Expect("(");
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**"))
        Fail(Line(), "'*args' and '**kwargs' in a call are not supported");
      if (Peek().k == Tok::K::kName && IsOp("=", 1)) {
        e->kw.push_back(Next().s);
        Next();
      } else {
        if (!e->kw.empty() && !e->kw.back().empty())
          Fail(Line(), "a positional argument follows a keyword argument");
        e->kw.emplace_back();
      }
      e->a.push_back(ParseExpr());
      if (!IsOp(",")) break;
      Next();
    }
    Expect(")");
  }

  ExprP ParseFilterExpr(ExprP e) {
    while (true) {
      const int line = Line();
      if (IsOp("|")) {
        Next();
        auto f = Make(Expr::K::kFilter, line);
        f->a.push_back(std::move(e));
        ParseFilterTail(f.get());
        e = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto t = Make(Expr::K::kTest, line);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        t->s = ExpectName("a test name after 'is'");
        if (!IsSupportedTest(t->s)) Fail(line, "test '" + t->s + "' is not supported");
        t->a.push_back(std::move(e));
        if (IsOp("(")) {
          ParseArgs(t.get());
        } else {
          const Tok& n = Peek();
          static const std::set<std::string> kStop = {"else", "or", "and", "if", "in", "not", "is"};
          const bool starts = n.k == Tok::K::kStr || n.k == Tok::K::kInt || n.k == Tok::K::kFloat ||
                              (n.k == Tok::K::kName && !kStop.count(n.s)) || IsOp("[") || IsOp("{");
          if (starts) {
            t->kw.emplace_back();
            t->a.push_back(ParsePostfix(ParsePrimary()));
          }
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        auto call = Make(Expr::K::kCall, line);
        call->a.push_back(std::move(e));
        ParseArgs(call.get());
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

 public:
  // name [(args)] of a filter, into f->s, f->a[1..], f->kw.
  void ParseFilterTail(Expr* f) {
    const int line = Line();
    f->s = ExpectName("a filter name after '|'");
    if (!IsSupportedFilter(f->s)) Fail(line, "filter '" + f->s + "' is not supported");
    if (IsOp("(")) ParseArgs(f);
    // A filter or test named by a literal argument (map('upper'), select('odd'), selectattr('x',
    // 'defined')) is checked here too.
    const size_t named = f->s == "selectattr" || f->s == "rejectattr" ? 2 : 1;
    if ((f->s == "map" || f->s == "select" || f->s == "reject" || named == 2) &&
        f->a.size() > named && f->kw[named - 1].empty() && f->a[named]->k == Expr::K::kLit &&
        f->a[named]->lit.is_str()) {
      const std::string& n = f->a[named]->lit.s;
      if (f->s == "map" ? !IsSupportedFilter(n) : !IsSupportedTest(n)) {
        Fail(line, std::string(f->s == "map" ? "filter '" : "test '") + n + "' (in " + f->s +
                       ") is not supported");
      }
    }
  }

 private:
  static constexpr int kMaxNesting = 200;
  const std::vector<Tok>& t_;
  size_t p_ = 0;
  int nesting_ = 0;
};

// ---- statements ---------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body ParseAll() {
    std::string end;
    Body body = ParseBody({}, &end, 0, "");
    return body;
  }

 private:
  // Parses nodes until a block tag whose keyword is in `ends` (left in *end, its parser in
  // cur_), or the end of the template (an error when `ends` is not empty).
  Body ParseBody(const std::set<std::string>& ends, std::string* end, int open_line,
                 const std::string& opener) {
    Body body;
    while (i_ < pieces_.size()) {
      Piece& p = pieces_[i_++];
      if (p.k == Piece::K::kText) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::kText;
        n->line = p.line;
        n->text = std::move(p.text);
        body.push_back(std::move(n));
        continue;
      }
      cur_ = std::make_unique<ExprParser>(p.toks);
      if (p.k == Piece::K::kVar) {
        if (cur_->AtEnd()) Fail(p.line, "empty expression '{{ }}'");
        auto n = std::make_unique<Node>();
        n->k = Node::K::kOut;
        n->line = p.line;
        n->e.push_back(cur_->ParseTuple());
        cur_->ExpectEnd();
        body.push_back(std::move(n));
        continue;
      }
      const std::string kw = cur_->ExpectName("a statement name after '{%'");
      if (ends.count(kw)) {
        *end = kw;
        return body;
      }
      if (!ends.empty() && (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else")) {
        Fail(p.line, "'{% " + kw + " %}' found while '{% " + opener + " %}' of line " +
                         std::to_string(open_line) + " is still open (close it with '{% " +
                         *ends.rbegin() + " %}')");
      }
      body.push_back(ParseStatement(kw, p.line));
    }
    if (!ends.empty()) {
      Fail(open_line,
           "'{% " + opener + " %}' is never closed (expected '{% " + *ends.rbegin() + " %}')");
    }
    return body;
  }

  // long function: one branch per statement keyword (if, for, set, macro, ...), the grammar in one place
  NodeP ParseStatement(const std::string& kw, int line) {
    if (++nesting_ > kMaxNesting)
      Fail(line, "statements nested deeper than " + std::to_string(kMaxNesting) + " levels");
    struct Unnest {
      int* n;
      ~Unnest() { --*n; }
    } unnest{&nesting_};
    auto n = std::make_unique<Node>();
    n->line = line;
    ExprParser& x = *cur_;
    std::string end;
    if (kw == "if") {
      n->k = Node::K::kIf;
      n->e.push_back(x.ParseTuple());
      x.ExpectEnd();
      while (true) {
        n->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end, line, "if"));
        if (end == "elif") {
          n->e.push_back(cur_->ParseTuple());
          cur_->ExpectEnd();
          continue;
        }
        cur_->ExpectEnd();
        if (end == "else") {
          n->bodies.push_back(ParseBody({"endif"}, &end, line, "if"));
          cur_->ExpectEnd();
        }
        break;
      }
    } else if (kw == "for") {
      n->k = Node::K::kFor;
      do {
        if (!n->names.empty()) x.Next();
        n->names.push_back(x.ExpectName("a loop variable"));
      } while (x.IsOp(","));
      if (!x.IsName("in")) Fail(line, "expected 'in' in the for statement");
      x.Next();
      n->e.push_back(ParseIterable(x));
      if (x.IsName("if")) {
        x.Next();
        n->e.push_back(x.ParseExpr());
      }
      if (x.IsName("recursive")) Fail(line, "recursive for loops are not supported");
      x.ExpectEnd();
      n->bodies.push_back(ParseBody({"else", "endfor"}, &end, line, "for"));
      cur_->ExpectEnd();
      if (end == "else") {
        n->bodies.push_back(ParseBody({"endfor"}, &end, line, "for"));
        cur_->ExpectEnd();
      }
    } else if (kw == "set") {
      n->names.push_back(x.ExpectName("a variable name after 'set'"));
      if (x.IsOp(".")) {
        x.Next();
        n->attr = x.ExpectName("an attribute name");
      } else {
        while (x.IsOp(",")) {
          x.Next();
          n->names.push_back(x.ExpectName("a variable name"));
        }
      }
      if (x.IsOp("=")) {
        x.Next();
        n->k = Node::K::kSet;
        n->e.push_back(x.ParseTuple());
        x.ExpectEnd();
      } else {
        if (n->names.size() != 1 || !n->attr.empty())
          Fail(line, "a block set assigns one plain name");
        if (x.IsOp("|")) Fail(line, "filters on a block set are not supported");
        x.ExpectEnd();
        n->k = Node::K::kSetBlock;
        n->bodies.push_back(ParseBody({"endset"}, &end, line, "set"));
        cur_->ExpectEnd();
      }
    } else if (kw == "macro") {
      n->k = Node::K::kMacro;
      n->text = x.ExpectName("a macro name");
      x.Expect("(");
      while (!x.IsOp(")")) {
        n->names.push_back(x.ExpectName("a macro parameter"));
        if (x.IsOp("=")) {
          x.Next();
          n->e.push_back(x.ParseExpr());
        } else {
          n->e.push_back(nullptr);
        }
        if (!x.IsOp(",")) break;
        x.Next();
      }
      x.Expect(")");
      x.ExpectEnd();
      n->bodies.push_back(ParseBody({"endmacro"}, &end, line, "macro"));
      cur_->ExpectEnd();
    } else if (kw == "call") {
      n->k = Node::K::kCallBlock;
      if (x.IsOp("(")) Fail(line, "call blocks with caller arguments are not supported");
      ExprP call = x.ParseExpr();
      if (call->k != Expr::K::kCall) Fail(line, "'{% call %}' needs a macro call");
      n->e.push_back(std::move(call));
      x.ExpectEnd();
      n->bodies.push_back(ParseBody({"endcall"}, &end, line, "call"));
      cur_->ExpectEnd();
    } else if (kw == "filter") {
      n->k = Node::K::kFilter;
      auto f = std::make_unique<Expr>();
      f->k = Expr::K::kFilter;
      f->line = line;
      f->a.push_back(nullptr);
      x.ParseFilterTail(f.get());
      if (x.IsOp("|")) Fail(line, "chained filters in a filter block are not supported");
      x.ExpectEnd();
      n->e.push_back(std::move(f));
      n->bodies.push_back(ParseBody({"endfilter"}, &end, line, "filter"));
      cur_->ExpectEnd();
    } else if (kw == "generation") {
      n->k = Node::K::kScope;
      x.ExpectEnd();
      n->bodies.push_back(ParseBody({"endgeneration"}, &end, line, "generation"));
      cur_->ExpectEnd();
    } else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::kBreak : Node::K::kContinue;
      x.ExpectEnd();
    } else if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
      Fail(line, "'{% " + kw + " %}' without a matching opening statement");
    } else {
      Fail(line, "statement '" + kw + "' is not supported");
    }
    return n;
  }

  // The iterable of a for loop: an expression, or a tuple of them; stops before a loop filter.
  static ExprP ParseIterable(ExprParser& x) {
    const int line = x.Line();
    ExprP first = x.ParseNoCond();
    if (!x.IsOp(",")) return first;
    auto list = std::make_unique<Expr>();
    list->k = Expr::K::kList;
    list->line = line;
    list->a.push_back(std::move(first));
    while (x.IsOp(",")) {
      x.Next();
      if (x.AtEnd() || x.IsName("if")) break;
      list->a.push_back(x.ParseNoCond());
    }
    return list;
  }

  static constexpr int kMaxNesting = 100;
  std::vector<Piece> pieces_;
  size_t i_ = 0;
  int nesting_ = 0;
  std::unique_ptr<ExprParser> cur_;
};

}  // namespace

Program ParseProgram(std::string_view source) {
  Program prog;
  prog.body = Parser(Lexer(source).Run()).ParseAll();
  return prog;
}

}  // namespace traind::engine::chat_template_internal
