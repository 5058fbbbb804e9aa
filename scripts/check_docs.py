#!/usr/bin/env python3
"""Fails when the repository's documentation stops being self-contained and current.

Rules (README.md's front page, docs/ as references, nothing pointing outside the checkout):
  1. README.md has at most 150 lines, and no line over 200 characters outside fenced code blocks.
  2. No file outside .ci/ and tests/ names a path into the sibling folder "shared" of the
     checkout (two dots, a slash, "shared") other than its data/ folder: a user who clones the
     repository has no such folder, so contracts and runbooks live in docs/. Benches and the demo
     may read the reference data there.
  3. No file under docs/ names an issue ("issue 14", "issue #14"): docs are references in the
     present tense; history belongs in commits and bench/results/.
  4. Every relative link of README.md and docs/*.md ([text](path), outside code blocks) points at an
     existing file or folder.
Usage: check_docs.py REPO_ROOT    (exit 1 and one line per violation)
       check_docs.py --self-test  (plants each violation in a temporary copy and checks it is found)
"""
import os
import re
import shutil
import sys
import tempfile

README_MAX_LINES = 150
README_MAX_WIDTH = 200
# Built in two pieces so that this file does not name the path it forbids.
OUTSIDE = re.compile(re.escape("../") + "shared" + r"(?!/data\b)")
ISSUE = re.compile(r"\bissue\s+#?\d+|\bissues\s+#\d+", re.I)  # "issue 14", "issue #14", "issues #14"; not "it issues 3 kernels"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# Folders never scanned for rule 2: allowed to point outside (.ci/, tests/), or not ours (build
# trees, the git directory, state and packs a run leaves in the checkout: hidden folders).
SKIP_DIRS = {".ci", "tests", ".git", "node_modules", "runs"}


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None  # binary files (fuzz corpora, images) name no paths we check


def check_readme(root, violations):
    path = os.path.join(root, "README.md")
    text = read_text(path)
    if text is None:
        violations.append("README.md: missing")
        return
    lines = text.rstrip("\n").split("\n")
    if len(lines) > README_MAX_LINES:
        violations.append(f"README.md: {len(lines)} lines, more than {README_MAX_LINES} (move detail to docs/)")
    for number, line in prose_lines(text):
        if len(line) > README_MAX_WIDTH:
            violations.append(f"README.md:{number}: a line of {len(line)} characters, more than "
                              f"{README_MAX_WIDTH} outside code blocks")


def check_outside_paths(root, violations):
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
                       and not d.startswith("build")]
        else:
            dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            text = read_text(path)
            if text is None:
                continue
            for number, line in enumerate(text.split("\n"), 1):
                if OUTSIDE.search(line):
                    rel = os.path.relpath(path, root)
                    violations.append(f"{rel}:{number}: names a path outside the repository "
                                      f"(only the data folder may be read there): {line.strip()[:120]}")


def doc_files(root):
    docs = os.path.join(root, "docs")
    names = sorted(n for n in os.listdir(docs) if n.endswith(".md")) if os.path.isdir(docs) else []
    return [os.path.join(docs, n) for n in names]


def check_issue_numbers(root, violations):
    for path in doc_files(root):
        text = read_text(path) or ""
        for number, line in enumerate(text.split("\n"), 1):
            m = ISSUE.search(line)
            if m:
                rel = os.path.relpath(path, root)
                violations.append(f"{rel}:{number}: names an issue ('{m.group(0)}'): write what is true now")


def check_links(root, violations):
    for path in [os.path.join(root, "README.md")] + doc_files(root):
        text = read_text(path)
        if text is None:
            continue
        base = os.path.dirname(path)
        for number, line in prose_lines(text):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                    continue  # a URL (http:, mailto:) or an anchor in the same file
                file_part = target.split("#", 1)[0]
                if not file_part:
                    continue
                if not os.path.exists(os.path.normpath(os.path.join(base, file_part))):
                    rel = os.path.relpath(path, root)
                    violations.append(f"{rel}:{number}: link to a missing file: {target}")


def check(root):
    violations = []
    check_readme(root, violations)
    check_outside_paths(root, violations)
    check_issue_numbers(root, violations)
    check_links(root, violations)
    return violations


def copy_docs(src, dst):
    """README.md and docs/ of src, and an empty stand-in for every file their links name."""
    os.makedirs(os.path.join(dst, "docs"), exist_ok=True)
    shutil.copy(os.path.join(src, "README.md"), os.path.join(dst, "README.md"))
    for path in doc_files(src):
        shutil.copy(path, os.path.join(dst, "docs", os.path.basename(path)))
    for path in [os.path.join(src, "README.md")] + doc_files(src):
        base = os.path.relpath(os.path.dirname(path), src)
        for _, line in prose_lines(read_text(path) or ""):
            for target in LINK.findall(line):
                file_part = target.split("#", 1)[0]
                if not file_part or re.match(r"^[a-z][a-z0-9+.-]*:", file_part, re.I):
                    continue
                real = os.path.normpath(os.path.join(src, base, file_part))
                copy = os.path.normpath(os.path.join(dst, base, file_part))
                if not copy.startswith(dst) or os.path.exists(copy) or not os.path.exists(real):
                    continue
                if os.path.isdir(real):
                    os.makedirs(copy, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(copy), exist_ok=True)
                    open(copy, "w").close()


def self_test():
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outside = "../" + "shared"
    plants = [
        # (what, file, text appended, a phrase the violation's line must hold)
        ("README over 150 lines", "README.md", "\n".join(["more"] * 200) + "\n", "lines, more than"),
        ("README line over 200 characters", "README.md", "x" * 201 + "\n", "a line of 201 characters"),
        ("a contract path in code", "engine/src/x.cc", f"// see {outside}/contracts/JOBSPEC.md\n",
         "engine/src/x.cc:1: names a path outside"),
        ("the GPU runbook's path in a doc", "docs/gpu.md", f"\nRun {outside}/gpu/pack.sh.\n",
         "docs/gpu.md:"),
        ("a bare sibling folder in a script", "scripts/x.sh", f"ls {outside}\n", "scripts/x.sh:1:"),
        ("an issue number in docs/", "docs/engine.md", "\nAs issue 14 asked.\n", "names an issue ('issue 14')"),
        ("an issue # in docs/", "docs/engine.md", "\nSee Issue #7.\n", "names an issue ('Issue #7')"),
        ("a broken link in README", "README.md", "\nSee [x](docs/nope.md).\n", "link to a missing file: docs/nope.md"),
        ("a broken link in docs/", "docs/engine.md", "\nSee [y](../engine/gone.h#L3).\n",
         "link to a missing file: ../engine/gone.h#L3"),
    ]
    allowed = [
        ("the data folder from a bench", "bench/x.sh", f"cat {outside}/data/tinyshakespeare.txt\n"),
        ("a contract path in tests/", "tests/x.cc", f"// {outside}/contracts/JOBSPEC.md\n"),
        ("a contract path in .ci/", ".ci/run", f"# {outside}/gpu/README.md\n"),
        ("a long line in a README code block", "README.md", "```\n" + "y" * 300 + "\n```\n"),
        ("a URL and an anchor", "README.md", "[a](https://example.com/x) [b](#features)\n"),
        ("issues without a number", "docs/engine.md", "\nIt issues 3 kernels; known issues: none.\n"),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as base:
        clean = os.path.join(base, "clean")
        copy_docs(src, clean)
        found = check(clean)
        # The real README and docs may be mid-edit; the self-test needs a clean start of its own.
        for path in [os.path.join(clean, "README.md")] + doc_files(clean):
            text = read_text(path)
            kept = [l for l in text.split("\n")
                    if not OUTSIDE.search(l) and not ISSUE.search(l) and len(l) <= README_MAX_WIDTH]
            with open(path, "w") as f:
                f.write("\n".join(kept[:120]) + "\n")
        for line in check(clean):  # links the trimming cut or that were broken: drop those lines
            rel, number = line.split(":")[0], int(line.split(":")[1])
            path = os.path.join(clean, rel)
            lines = read_text(path).split("\n")
            lines[number - 1] = ""
            with open(path, "w") as f:
                f.write("\n".join(lines))
        start = check(clean)
        if start:
            failures.append(f"the clean copy is not clean: {start}")
        for i, (what, rel, text, phrase) in enumerate(plants + [(w, r, t, None) for w, r, t in allowed]):
            work = os.path.join(base, f"case{i}")
            shutil.copytree(clean, work)
            path = os.path.join(work, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(text)
            got = check(work)
            if phrase is None:
                if got:
                    failures.append(f"{what}: allowed, but reported: {got}")
            elif not any(phrase in g for g in got):
                failures.append(f"{what}: not caught (wanted '{phrase}', got {got})")
    if failures:
        for f in failures:
            print("self-test FAILED:", f)
        return 1
    print(f"self-test: the checker finds all {len(plants)} planted violations and passes "
          f"{len(allowed)} allowed cases (the real tree had {len(found)} violation(s) at the start)")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    violations = check(os.path.abspath(sys.argv[1]))
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} documentation violation(s): see scripts/check_docs.py's rules")
        return 1
    print("docs: README front page, self-contained paths, no issue numbers in docs/, every link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
