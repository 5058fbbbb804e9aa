#!/usr/bin/env python3
"""Fails when a function of the engine (engine/: .h .cc .cu .cuh) is longer than LIMIT lines and
the comment just above it gives no reason.

A function is counted from the first line of its signature to its closing brace (lambdas and local
classes count toward the function that holds them). A longer function passes when the comment
block right above its signature holds a line
    // long function: <one line saying why it stays whole>
(docs/engine.md, "Style"). Usage:
    check_function_length.py [REPO_ROOT]     exit 1 and one line per long function
    check_function_length.py --self-test     plants a long function and checks it is caught
"""
import os
import re
import sys

LIMIT = 100
REASON = re.compile(r"//\s*long function:\s*\S")
EXTENSIONS = (".h", ".cc", ".cu", ".cuh")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b|\bextern\s*\"C")
ACCESS = re.compile(r"\s*(public|private|protected)\s*:(?!:)")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return)\b")


def strip(text):
    """The text with comments, string and character literals and preprocessor lines blanked
    (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        m = re.match(r'R"([^(\s]*)\(', text[i:i + 20]) if c == "R" else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text[i:end].count("\n"))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(text):
    """(first line, last line) of each function body outside another function's body."""
    code = strip(text)
    stack = []  # "scope", "fn" or "other" per open brace
    starts = []  # the first line of each open "fn"
    header_start = 0  # where the text since the last ; { } begins
    found = []
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        if c not in "{};":
            continue
        if c == ";":
            header_start = i + 1
            continue
        if c == "{":
            header = code[header_start:i]
            kind = "other"
            if "fn" not in stack:
                stripped = header.strip()
                if SCOPE.search(header.split("(", 1)[0]):
                    kind = "scope"
                elif ("(" in stripped and ")" in stripped and not stripped.endswith("=")
                      and not CONTROL.match(stripped) and "=" not in stripped.split("(", 1)[0]):
                    kind = "fn"
                    access = ACCESS.match(header)  # "public:" before a method is not its line
                    lead = access.end() if access else 0
                    lead += len(header[lead:]) - len(header[lead:].lstrip())
                    starts.append(line - code[header_start + lead:i].count("\n"))
            stack.append(kind)
        else:  # }
            kind = stack.pop() if stack else "other"
            if kind == "fn":
                found.append((starts.pop(), line))
        header_start = i + 1
    return found


def check_file(path, rel, violations):
    text = open(path, encoding="utf-8", errors="replace").read()
    lines = text.split("\n")
    for first, last in functions(text):
        length = last - first + 1
        if length <= LIMIT:
            continue
        k = first - 2  # the comment block right above the signature
        reason = False
        while k >= 0 and lines[k].strip().startswith("//"):
            reason = reason or bool(REASON.search(lines[k]))
            k -= 1
        if not reason:
            name = lines[first - 1].strip()[:70]
            violations.append(f"{rel}:{first}: {length} lines (over {LIMIT}), no '// long function: "
                              f"<reason>' above it: {name}")


def check(root, violations):
    engine = os.path.join(root, "engine")
    for dirpath, _, files in os.walk(engine):
        for name in sorted(files):
            if name.endswith(EXTENSIONS):
                path = os.path.join(dirpath, name)
                check_file(path, os.path.relpath(path, root), violations)


def self_test():
    """A planted 120-line function without a reason fails; with one, or at 100 lines, it passes;
    namespaces, classes, lambdas, strings and comments with braces do not confuse the count."""
    import tempfile
    body = "".join(f"  x += {k};  // {{ a brace in a comment\n" for k in range(117))
    long_fn = "int Long(int x) {\n" + body + "  return x;\n}\n"  # 120 lines
    ok_fn = "int Short(int x) {\n" + "".join(f"  x += {k};\n" for k in range(97)) + \
        "  return x;\n}\n"  # 100 lines
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        put("engine/src/train/bad.cc", "namespace a {\nnamespace {\n" + long_fn + "}\n}\n")
        put("engine/src/train/method.h", "class S {\n public:\n  const char* s = \"}\";\n  " +
            long_fn.replace("\n", "\n  ") + "\n};\n")
        put("engine/src/train/lambda.cc", "void F() {\n  auto f = [](int x) {\n" + body +
            "    return x;\n  };\n}\n")  # a 121-line function holding a lambda
        put("engine/src/train/reason.cc", "// Builds it.\n// long function: one table, row by row\n"
            + long_fn)
        put("engine/src/train/ok.cc", "namespace a {\n" + ok_fn + "}\n")
        violations = []
        check(root, violations)
        where = sorted(v.split(":", 1)[0] for v in violations)
        expected = ["engine/src/train/bad.cc", "engine/src/train/lambda.cc",
                    "engine/src/train/method.h"]
        if where != expected:
            print("self-test FAILED: expected", expected, "got", violations)
            return 1
    print(f"self-test: the checker finds the {len(expected)} planted long functions and passes the "
          "one with a reason and the one at the limit")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    violations = []
    check(root, violations)
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} function(s) over {LIMIT} lines without a reason (docs/engine.md)")
        return 1
    print(f"function length: every engine function is at most {LIMIT} lines or says why")
    return 0


if __name__ == "__main__":
    sys.exit(main())
