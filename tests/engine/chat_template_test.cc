// Chat templates (engine/src/data/chat_template.h) against references: Hugging Face's Jinja
// renderer (@huggingface/jinja, installed with npm ci from reference/chat_template into the build
// folder) renders the five real templates of ../shared/data/chat_templates and our own templates
// in the style of each family (chat_templates/) on the same conversations, byte for byte; where
// that renderer departs from Python's Jinja2 (which transformers uses), expected outputs recorded
// from Jinja2 3.1.6 with transformers' environment. Plus the errors a template can produce.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer_test_util.h"

namespace traind::engine {
namespace {

using nlohmann::ordered_json;
using testing::FileExists;
using testing::ReadAll;
using testing::Shell;
using testing::TempDir;
using testing::WriteAll;

std::string OwnDir() { return std::string(TRAIND_TESTS_DIR) + "/chat_templates"; }
std::string RealDir() { return std::string(TRAIND_SHARED_DATA) + "/chat_templates"; }

// The folder holding node_modules/@huggingface/jinja, installed on first use (npm ci, under a
// lock). Empty with *error set when it cannot be installed.
std::string ReferenceDir(std::string* error) {
  const std::string src = std::string(TRAIND_TESTS_DIR) + "/reference/chat_template";
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
    *error = "getcwd failed";
    return "";
  }
  const std::string dir = std::string(cwd) + "/chat-template-reference";
  const std::string check = "node -e \"require(\\\"@huggingface/jinja\\\")\"";
  const std::string cmd = "command -v node >/dev/null && command -v npm >/dev/null && mkdir -p '" +
                          dir + "' && flock '" + dir + ".lock' sh -c 'cd \"" + dir + "\" && cp \"" +
                          src + "/package.json\" \"" + src + "/package-lock.json\" \"" + src +
                          "/chat_template_ref.js\" . && (" + check +
                          " 2>/dev/null || npm ci --no-audit --no-fund --loglevel=error)' >'" +
                          dir + ".log' 2>&1";
  if (Shell(cmd) != 0 || Shell("cd '" + dir + "' && node -e 'require(\"@huggingface/jinja\")' >>'" +
                               dir + ".log' 2>&1") != 0) {
    *error =
        "the chat template reference (npm package @huggingface/jinja, for node) could not be "
        "installed or loaded in " +
        dir +
        " (needs node and npm: ./run.sh deps installs them, "
        "and npm registry access for npm ci); see " +
        dir + ".log:\n" + ReadAll(dir + ".log");
    return "";
  }
  return dir;
}

struct Case {
  std::string label;
  std::string source;
  ordered_json vars;
};

// Renders every case with the reference; one {"ok", "text"|"error"} per case.
bool RunReference(const std::vector<Case>& cases, std::vector<ordered_json>* out) {
  std::string error;
  const std::string dir = ReferenceDir(&error);
  if (dir.empty()) {
    ADD_FAILURE() << error;
    return false;
  }
  const std::string work = TempDir("traind-chatref");
  ordered_json req;
  req["cases"] = ordered_json::array();
  for (const Case& c : cases) req["cases"].push_back({{"template", c.source}, {"vars", c.vars}});
  WriteAll(work + "/req.json", req.dump());
  const std::string cmd = "node '" + dir + "/chat_template_ref.js' '" + work + "/req.json' '" +
                          work + "/out.json' >'" + work + "/log' 2>&1";
  if (Shell(cmd) != 0) {
    ADD_FAILURE() << "the reference failed: " << cmd << "\n" << ReadAll(work + "/log");
    return false;
  }
  const ordered_json res = ordered_json::parse(ReadAll(work + "/out.json"));
  *out = res["results"].get<std::vector<ordered_json>>();
  Shell("rm -rf '" + work + "'");
  return out->size() == cases.size();
}

std::string TemplatePath(const std::string& file) {
  const std::string own = OwnDir() + "/" + file;
  return FileExists(own) ? own : RealDir() + "/" + file;
}

// Every template of special_tokens.json (ours and the five real ones) on every conversation of
// conversations.json, with add_generation_prompt false and true, plus features.jinja.
std::vector<Case> ReferenceCases() {
  const ordered_json tokens = ordered_json::parse(ReadAll(OwnDir() + "/special_tokens.json"));
  const ordered_json data = ordered_json::parse(ReadAll(OwnDir() + "/conversations.json"));
  std::vector<Case> cases;
  for (auto t = tokens.begin(); t != tokens.end(); ++t) {
    const std::string source = ReadAll(TemplatePath(t.key()));
    EXPECT_FALSE(source.empty()) << "cannot read " << TemplatePath(t.key());
    for (auto c = data["conversations"].begin(); c != data["conversations"].end(); ++c) {
      for (bool agp : {false, true}) {
        Case k;
        k.label = t.key() + " / " + c.key() + (agp ? " / add_generation_prompt" : "");
        k.source = source;
        k.vars = ChatTemplateSpecialTokens(t.value());
        k.vars["messages"] = c.value();
        k.vars["add_generation_prompt"] = agp;
        if (c.key() == "tool_calls") k.vars["tools"] = data["tools"];
        cases.push_back(std::move(k));
      }
    }
  }
  Case f;
  f.label = "features.jinja";
  f.source = ReadAll(OwnDir() + "/features.jinja");
  f.vars = ordered_json::parse(ReadAll(OwnDir() + "/features.json"));
  cases.push_back(std::move(f));
  return cases;
}

TEST(ChatTemplateTest, TemplatesMatchHuggingFaceJinja) {
  if (!FileExists(RealDir() + "/README.md")) GTEST_SKIP() << "no " << RealDir();
  const std::vector<Case> cases = ReferenceCases();
  std::vector<ordered_json> ref;
  ASSERT_TRUE(RunReference(cases, &ref));
  int rendered = 0, raised = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    auto tmpl = ChatTemplate::Parse(c.source, c.label);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    auto out = tmpl->Render(c.vars);
    if (ref[k]["ok"].get<bool>()) {
      ++rendered;
      ASSERT_TRUE(out.ok()) << c.label << ": " << out.status().message();
      EXPECT_EQ(*out, ref[k]["text"].get<std::string>()) << c.label;
    } else {
      ++raised;
      const std::string msg = ref[k]["error"].get<std::string>();
      ASSERT_FALSE(out.ok()) << c.label << ": the reference raised '" << msg << "', we rendered:\n"
                             << *out;
      EXPECT_NE(out.status().message().find("raised an exception"), std::string::npos)
          << out.status().message();
      EXPECT_NE(out.status().message().find(msg), std::string::npos)
          << c.label << ": " << out.status().message() << " (reference: " << msg << ")";
    }
  }
  // The cases cover both outcomes: rendered conversations and templates raising on bad roles.
  EXPECT_GE(rendered, 120);
  EXPECT_GE(raised, 15);
}

// Where @huggingface/jinja departs from Python's Jinja2 (True vs true, -7 % 3, str.strip(chars),
// loop scoping, tests with arguments, select/map by name, {%+ ...): outputs of Jinja2 3.1.6 in
// transformers' environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, its tojson), with messages = [{"role": "user", "content": "a"}] and d = {}.
TEST(ChatTemplateTest, PythonJinjaSemantics) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"J({{ true }} {{ false }} {{ none }} {{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'q': "it's"} }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 7 / 2 }} {{ 2.5e-7 }} {{ 123456789.125 }})J",
       R"J(True False None [1, 'a', None, True, 1.5] {'k': 'v', 'q': "it's"} 1.0 0.30000000000000004 1e+20 3.5 2.5e-07 123456789.125)J"},
      {R"J({{ -7 % 3 }} {{ 7 % -3 }} {{ -7 // 2 }} {{ 7.5 // 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 'x' * 3 }} {{ [0] * 2 }} {{ -(3) }})J",
       R"J(2 -2 -4 3.0 1024 3.5 xxx [0, 0] -3)J"},
      {R"J({{ 'hELLO wORLD' | capitalize }}|{{ 'hELLO wORLD' | title }}|{{ "they're bill's" | title }}|{{ 'hello-world x2y' | title }})J",
       R"J(Hello world|Hello World|They're Bill's|Hello-World X2y)J"},
      {R"J({{ 'xxsxx'.strip('x') }}|{{ '\n\n  a'.lstrip('\n') }}|{{ 'abc..'.rstrip('.') }}|{{ ' \t a \n'.strip() }}|{{ 'a,b,c'.split(',', 1) }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(none, 1) }})J",
       R"J(s|  a|abc|a|['a', 'b,c']|['a', 'b']|['a', 'b c'])J"},
      {R"J({% set c = 1 %}{% for x in [1, 2] %}{% set c = c + x %}{{ c }}{% endfor %}{{ c }})J",
       R"J(231)J"},
      {R"J({{ ['a', 'b'] | map('upper') | join }} {{ [1, 2, 3, 4] | select('odd') | join }} {{ [1, 2, 3, 4] | reject('odd') | join }} {{ [1, 5, 9] | select('gt', 4) | join(',') }} {{ [0, 1, '', 'a'] | select | list }})J",
       R"J(AB 13 24 5,9 [1, 'a'])J"},
      {R"J({{ 9 is divisibleby 3 }} {{ 'a' is in ['a'] }} {{ 2 is sameas 2 }} {{ none is sameas none }} {{ 'A' is upper }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }} {{ true is true }})J",
       R"J(True True True True True True True True True)J"},
      {R"J(  {%+ if true %}x{% endif %}
  {% if true %}y{% endif %})J",
       R"J(  xy)J"},
      {R"J({% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %})J",
       R"J(a2|b13|a2|)J"},
      {R"J({% filter upper %}abc {{ 'd' }}{% endfilter %})J", R"J(ABC D)J"},
      {R"J({{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true) }} {{ 'é🤗' | tojson(ensure_ascii=true) }} {{ [1, {'a': 2}] | tojson(separators=[',', ':']) }} {{ 1.0 | tojson }} {{ [] | tojson(indent=2) }} {{ {'e': {}} | tojson(indent=2) }})J",
       R"J({"a": "é", "b": 1} "\u00e9\ud83e\udd17" [1,{"a":2}] 1.0 [] {
  "e": {}
})J"},
      {R"J({{ foo ~ 'x' }}|{{ foo | length }}|{% for x in foo %}no{% endfor %}|{{ foo | default('d') }}|{{ foo is defined }}|{{ d.missing is defined }}|{{ none.attr is defined }}|{{ 'abc'[5] is defined }}|{{ foo }}|{{ not foo }})J",
       R"J(x|0||d|False|False|False|False||True)J"},
      {R"J({% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }} {{ m('x', b='y') }} {{ m(b='z', a='w') }})J",
       R"J(xx! xy wz)J"},
      {R"J({% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inside {{ 1 + 1 }}{% endcall %})J",
       R"J([inside 2])J"},
      {R"J({{ 'abc' if false }}|{{ none if false else 'e' }}|{{ 1 if 0 else 2 if 0 else 3 }})J",
       R"J(|e|3)J"},
      {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (1, 2) %}{{ t | length }} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %})J",
       R"J(12 2 37)J"},
      {R"J({% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }} {% set ns2 = namespace({'x': 5}) %}{{ ns2.x }})J",
       R"J(12 5)J"},
      {R"J({{ range(3) | list }} {{ range(1, 7, 2) | join(',') }} {{ dict(a=1, b=2) }} {{ 'abc' | list }} {{ {'x': 1} | list }} {{ [3, 1, 2] | reverse | list }} {{ 'abc' | reverse }})J",
       R"J([0, 1, 2] 1,3,5 {'a': 1, 'b': 2} ['a', 'b', 'c'] ['x'] [2, 1, 3] cba)J"},
      {R"J({{ 'a\u00e9\x41\'' }} {{ '%' }} {{ 'ab'.find('b') }} {{ 'aXbXc'.count('X') }} {{ '-'.join(['a', 'b']) }} {{ 'ab' ~ none }})J",
       R"J(aéA' % 1 2 a-b abNone)J"},
      {R"J({{ 3 | abs }} {{ -2.5 | abs }} {{ '3.7' | float }} {{ 'x' | int }} {{ '12' | int(5) }} {{ 3.9 | int }} {{ 1 | float }} {{ 'line1\nline2\n\nline4' | indent(2) }}|{{ 'a\nb' | indent(2, true) }})J",
       R"J(3 2.5 3.7 0 12 3 1.0 line1
  line2

  line4|  a
  b)J"},
      {R"J({{ [{'a': 1}, {'a': 2}] | map(attribute='a') | list }} {{ [{'a': 1}, {}] | map(attribute='a', default=0) | list }} {{ [{'n': 'x'}, {'n': 'y'}] | join(', ', attribute='n') }})J",
       R"J([1, 2] [1, 0] x, y)J"},
      {R"J({{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 'b' > 'a' }} {{ 1 < 2.5 }} {{ true == 1 }})J",
       R"J(True True True True True True)J"},
      {R"J({% for m in messages %}{% if m.role == 'user' %}{% set ns = namespace(x=1) %}{% endif %}{% endfor %}{{ ns is defined }})J",
       R"J(False)J"},
      {R"J({{ '🤗é' | length }} {{ '🤗é'[0] }} {{ '🤗é'[::-1] }} {{ 'a🤗b'.find('b') }})J",
       R"J(2 🤗 é🤗 2)J"},
  };
  ordered_json vars;
  vars["messages"] = ordered_json::array({{{"role", "user"}, {"content", "a"}}});
  vars["d"] = ordered_json::object();
  for (const auto& [source, expected] : cases) {
    auto tmpl = ChatTemplate::Parse(source, "case");
    ASSERT_TRUE(tmpl.ok()) << source << "\n" << tmpl.status().message();
    auto out = tmpl->Render(vars);
    ASSERT_TRUE(out.ok()) << source << "\n" << out.status().message();
    EXPECT_EQ(*out, expected) << source;
  }
}

std::string ParseError(const std::string& source) {
  auto t = ChatTemplate::Parse(source, "t");
  EXPECT_FALSE(t.ok()) << source;
  return t.ok() ? "" : t.status().message();
}

std::string RenderError(const std::string& source,
                        const ordered_json& vars = ordered_json::object()) {
  auto t = ChatTemplate::Parse(source, "t");
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return "";
  auto out = t->Render(vars);
  EXPECT_FALSE(out.ok()) << source << " rendered " << *out;
  return out.ok() ? "" : out.status().message();
}

TEST(ChatTemplateTest, UnsupportedConstructsNameLineAndConstruct) {
  EXPECT_EQ(
      ParseError(
          "{{ bos_token }}\n{% for m in messages %}\n\n{{ m.content | wordcount }}\n{% endfor %}"),
      "chat template 't' line 4: filter 'wordcount' is not supported");
  EXPECT_EQ(ParseError("a\nb\n{% include 'other.jinja' %}"),
            "chat template 't' line 3: statement 'include' is not supported");
  EXPECT_EQ(ParseError("{% if x is prime %}{% endif %}"),
            "chat template 't' line 1: test 'prime' is not supported");
  EXPECT_EQ(ParseError("\n{% for x in xs recursive %}{% endfor %}"),
            "chat template 't' line 2: recursive for loops are not supported");
  EXPECT_EQ(ParseError("\n\n{{ xs | map('wordcount') | list }}"),
            "chat template 't' line 3: filter 'wordcount' (in map) is not supported");
  EXPECT_EQ(ParseError("{{ xs | selectattr('role', 'prime') | list }}"),
            "chat template 't' line 1: test 'prime' (in selectattr) is not supported");
  // A filter named by a variable is checked when it runs.
  EXPECT_EQ(RenderError("{% set f = 'wordcount' %}\n{{ ['a'] | map(f) | list }}"),
            "chat template 't' line 2: filter 'wordcount' (in map) is not supported");
  EXPECT_EQ(RenderError("{{ 'x' }}\n{{ 'a'.format(1) }}"),
            "chat template 't' line 2: 'str object' has no attribute 'format' (a method or "
            "function that is not supported)");
}

TEST(ChatTemplateTest, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(ParseError("line 1\n{% if messages %}\nnever closed\n"),
            "chat template 't' line 2: '{% if %}' is never closed (expected '{% endif %}')");
  EXPECT_EQ(ParseError("{% for m in messages %}\n{% if m %}\n{% endfor %}"),
            "chat template 't' line 3: '{% endfor %}' found while '{% if %}' of line 2 is still "
            "open (close "
            "it with '{% endif %}')");
  EXPECT_EQ(ParseError("ok\n\n{{ messages[0 }}"),
            "chat template 't' line 3: unexpected '}', expected ']'");
  EXPECT_EQ(ParseError("{{ 'a' \n+ }}"), "chat template 't' line 2: unexpected the end of the tag");
  EXPECT_EQ(ParseError("a\n{{ 'unclosed' "),
            "chat template 't' line 2: '{{' is never closed with '}}'");
  EXPECT_EQ(ParseError("a\n{# comment"),
            "chat template 't' line 2: comment '{#' is never closed with '#}'");
  EXPECT_EQ(ParseError("{% endif %}"),
            "chat template 't' line 1: '{% endif %}' without a matching opening statement");
  EXPECT_EQ(ParseError("{{ 'abc }}"), "chat template 't' line 1: string literal is never closed");
}

TEST(ChatTemplateTest, RecursionAndSizeAreBounded) {
  EXPECT_EQ(ParseError("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "chat template 't' line 1: expression nested deeper than 200 levels");
  std::string nested;
  for (int k = 0; k < 150; ++k) nested += "{% if true %}";
  EXPECT_EQ(ParseError(nested),
            "chat template 't' line 1: statements nested deeper than 100 levels");
  EXPECT_EQ(RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}"),
            "chat template 't' line 1: macro 'f': calls nested deeper than 100 levels");
  EXPECT_EQ(RenderError("{{ 'ab' * 1000000000 }}"),
            "chat template 't' line 1: a repetition of more than 2^28 items");
}

TEST(ChatTemplateTest, RaiseExceptionCarriesTheTemplatesMessage) {
  const std::string msg = RenderError(
      "x\n{% if messages[0].role != 'user' %}{{ raise_exception('Roles must start with user, got ' "
      "+ messages[0].role) }}{% endif %}",
      ordered_json::parse(R"({"messages": [{"role": "assistant", "content": "a"}]})"));
  EXPECT_EQ(
      msg,
      "chat template 't' raised an exception at line 2: Roles must start with user, got assistant");
}

TEST(ChatTemplateTest, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(RenderError("\n{{ foo.bar }}"), "chat template 't' line 2: 'foo' is undefined");
  EXPECT_EQ(RenderError("{% set x = 1 %}\n\n{{ 'a' + x }}"),
            "chat template 't' line 3: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(RenderError("{{ 1 // 0 }}"),
            "chat template 't' line 1: integer division or modulo by zero");
  EXPECT_EQ(RenderError("{% for x in none %}{% endfor %}"),
            "chat template 't' line 1: 'NoneType' object is not iterable");
  EXPECT_EQ(RenderError("{% set x = 1 %}{% set x.y = 2 %}"),
            "chat template 't' line 1: cannot assign attribute 'y' of 'x': not a namespace");
  EXPECT_EQ(RenderError("{{ nothing | tojson }}"),
            "chat template 't' line 1: tojson of an undefined value: 'nothing' is undefined");
  // Errors inside a macro name the macro's line.
  EXPECT_EQ(RenderError("{% macro m(x) %}\n{{ x.y.z }}\n{% endmacro %}\n{{ m({}) }}"),
            "chat template 't' line 2: 'dict object' has no attribute 'y'");
}

TEST(ChatTemplateTest, StrftimeNowIsTheLocalTime) {
  auto t =
      ChatTemplate::Parse("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}", "t");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(ordered_json::object());
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d|%d %b %Y", &tm);
  EXPECT_EQ(*out, buf);
}

TEST(ChatTemplateTest, SpecialTokensFromTokenizerConfig) {
  const ordered_json cfg = ordered_json::parse(R"({
    "add_bos_token": true, "bos_token": "<s>", "clean_up_tokenization_spaces": false,
    "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false, "normalized": false},
    "pad_token": null, "unk_token": "<unk>", "model_max_length": 1000000,
    "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}],
    "chat_template": "{{ bos_token }}"})");
  EXPECT_EQ(
      ChatTemplateSpecialTokens(cfg).dump(),
      R"({"bos_token":"<s>","eos_token":"</s>","unk_token":"<unk>","additional_special_tokens":["<|im_start|>","<|im_end|>"]})");
}

TEST(ChatTemplateTest, ObjectsKeepTheirOrderInToJson) {
  auto t = ChatTemplate::Parse("{{ tools | tojson }}", "t");
  ASSERT_TRUE(t.ok());
  const std::string tools =
      R"([{"type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": 2}}}])";
  auto out = t->Render(ordered_json::parse(R"({"tools": )" + tools + "}"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, tools);
  // nlohmann::json sorts its keys: the overload sees them sorted.
  auto sorted = t->Render(nlohmann::json::parse(R"({"tools": )" + tools + "}"));
  ASSERT_TRUE(sorted.ok());
  EXPECT_EQ(*sorted,
            R"([{"function": {"arguments": {"a": 2, "z": 1}, "name": "f"}, "type": "function"}])");
}

TEST(ChatTemplateTest, BytesPassThroughBothJsonTypes) {
  // Invalid UTF-8 is the data loader's to reject; the renderer neither throws nor alters it.
  auto t = ChatTemplate::Parse("{{ x }}|{{ x | length }}", "t");
  ASSERT_TRUE(t.ok());
  auto a = t->Render(nlohmann::json{{"x", "a\xff"}});
  auto b = t->Render(ordered_json{{"x", "a\xff"}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, "a\xff|2");
  EXPECT_EQ(*b, "a\xff|2");
  EXPECT_FALSE(t->Render(ordered_json::array()).ok());
}

TEST(ChatTemplateTest, ParsedTemplateRendersFromSeveralThreads) {
  auto t = ChatTemplate::Parse(ReadAll(OwnDir() + "/qwen3.jinja"), "qwen3");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const ordered_json data = ordered_json::parse(ReadAll(OwnDir() + "/conversations.json"));
  ordered_json vars = {{"messages", data["conversations"]["reasoning"]},
                       {"add_generation_prompt", false}};
  auto once = t->Render(vars);
  ASSERT_TRUE(once.ok());
  std::vector<std::string> outs(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < outs.size(); ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) outs[k] = *t->Render(vars);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& o : outs) EXPECT_EQ(o, *once);
}

}  // namespace
}  // namespace traind::engine
