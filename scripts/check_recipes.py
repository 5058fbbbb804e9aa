#!/usr/bin/env python3
"""The "how to add X" recipes hold for what is already there (the `recipes_check` test).

Each recipe's steps that the build does not catch by itself are checked here over the tree:
  cuda        engine/src/backend/cuda/README.md's file table names every file of the folder and
              only files that exist (brace forms `gpu_backend.{h,cc}` expand).
  tokenizer   every `<kind>_tokenizer.cc` in engine/src/data/tokenizers defines a Make... declared
              in internal.h, factory.cc routes to one of them, and a
              tests/engine/tokenizer_<kind>_test.cc exists (or the kind is in NO_OWN_TEST with a reason).
  offload     every offload/src/<name>_store.cc (but nvme_store.cc, which picks between them) is
              in traind_offload's sources, defines a Make<Name>Store declared in
              include/traind/offload/offload.h that validates its options, which
              tests/offload/store_contract_test.cc runs in its `Factories` list and offload/README.md
              names; every kind MakeNvmeStore accepts is named in its error.
The op recipe's profiling step is the build's: bench/profiling_backend.h static_asserts that
ProfilingBackend overrides every op of TRAIND_BACKEND_OPS. The self-test plants one omission of
each kind in a copy of the real files (and, with a C++ compiler, compiles a ProfilingBackend with
one override removed) and requires each to be reported.

Usage: check_recipes.py REPO_ROOT | --self-test [REPO_ROOT]   (exit 1 and one line per violation)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

CUDA_DIR = "engine/src/backend/cuda"
TOKENIZER_DIR = "engine/src/data/tokenizers"
# Tokenizer kinds without a tests/engine/tokenizer_<kind>_test.cc, and where they are tested.
NO_OWN_TEST = {
    "byte": "the identity on bytes, no published implementation to compare with: "
            "example_data_test and instruction_data_test train and decode through it",
}


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def expand_braces(name):
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(name[:m.start()] + alt + name[m.end():])
    return out


def check_cuda(root, violations):
    readme = f"{CUDA_DIR}/README.md"
    text = read(root, readme)
    named = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first_cell):
            named.update(expand_braces(token))
    files = {f for f in os.listdir(os.path.join(root, CUDA_DIR))
             if f != "README.md" and os.path.isfile(os.path.join(root, CUDA_DIR, f))}
    for f in sorted(files - named):
        violations.append(f"{CUDA_DIR}/{f}: not in {readme}'s file table (add a row: what it holds)")
    for f in sorted(named - files):
        violations.append(f"{readme}: its file table names {f}, which is not in {CUDA_DIR}")


def defined_makers(text):
    return re.findall(r"^[A-Za-z][^\n;]*?\b(Make\w+)\(", text, re.M)


def check_tokenizers(root, violations):
    internal = read(root, f"{TOKENIZER_DIR}/internal.h")
    factory = read(root, f"{TOKENIZER_DIR}/factory.cc")
    for name in sorted(os.listdir(os.path.join(root, TOKENIZER_DIR))):
        m = re.fullmatch(r"(\w+)_tokenizer\.cc", name)
        if not m:
            continue
        kind, rel = m.group(1), f"{TOKENIZER_DIR}/{name}"
        makers = [f for f in defined_makers(read(root, rel)) if re.search(rf"\b{f}\(", internal)]
        if not makers:
            violations.append(f"{rel}: defines no Make... constructor declared in {TOKENIZER_DIR}/internal.h")
        elif not any(re.search(rf"\b{f}\(", factory) for f in makers):
            violations.append(f"{rel}: factory.cc routes to none of {', '.join(makers)}")
        test = f"tests/engine/tokenizer_{kind}_test.cc"
        if kind not in NO_OWN_TEST and not os.path.exists(os.path.join(root, test)):
            violations.append(f"{rel}: no {test} (compare with a published implementation, plus bad input)")


def check_offload(root, violations):
    cmake = read(root, "offload/CMakeLists.txt")
    header = read(root, "offload/include/traind/offload/offload.h")
    contract = read(root, "tests/offload/store_contract_test.cc")
    readme = read(root, "offload/README.md")
    m = re.search(r"using Factories = ::testing::Types<([^>]*)>", contract)
    listed = [s.strip() for s in m.group(1).split(",")] if m else []
    if not m:
        violations.append("tests/offload/store_contract_test.cc: no `using Factories = ::testing::Types<...>`")
    # Each factory struct of the contract test and the Make...Store its Open calls.
    factory_of = {}
    for s in listed:
        body = re.search(rf"struct {s}\b.*?\n}};", contract, re.S)
        for f in re.findall(r"\b(Make\w+Store)\(", body.group(0) if body else ""):
            factory_of[f] = s
    for name in sorted(os.listdir(os.path.join(root, "offload/src"))):
        if not name.endswith("_store.cc") or name == "nvme_store.cc":
            continue
        rel = f"offload/src/{name}"
        text = read(root, rel)
        if not re.search(rf"^\s*src/{re.escape(name)}\b", cmake, re.M):
            violations.append(f"{rel}: not in traind_offload's sources (offload/CMakeLists.txt)")
        makers = [f for f in defined_makers(text) if f.endswith("Store")]
        if not makers:
            violations.append(f"{rel}: defines no Make<Name>Store factory")
        for f in makers:
            if not re.search(rf"\b{f}\(", header):
                violations.append(f"{rel}: {f} is not declared in offload/include/traind/offload/offload.h")
            if "ValidateOptions(" not in text:
                violations.append(f"{rel}: {f} does not validate its StoreOptions (ValidateOptions)")
            if f not in factory_of:
                violations.append(f"{rel}: {f} is not in store_contract_test.cc's Factories list")
            if f not in readme:
                violations.append(f"{rel}: offload/README.md does not name {f}")
    nvme = read(root, "offload/src/nvme_store.cc")
    error = re.search(r"Status::InvalidArgument\((.*?)\);", nvme, re.S)
    for kind in re.findall(r'kind == "(\w+)"', nvme):
        if not error or kind not in error.group(1):
            violations.append(f"offload/src/nvme_store.cc: MakeNvmeStore accepts kind '{kind}' but its error "
                              f"does not name it")


def check(root):
    violations = []
    check_cuda(root, violations)
    check_tokenizers(root, violations)
    check_offload(root, violations)
    return violations


PROFILING_PROBE = '#include "profiling_backend.h"\nint main() { return 0; }\n'


def profiling_self_test(repo):
    """Compiles bench/profiling_backend.h with its Scale override removed: the build must fail
    naming Scale. Returns an error string, or None."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        return "no C++ compiler to compile the planted ProfilingBackend"
    text = read(repo, "bench/profiling_backend.h")
    planted, n = re.subn(r"\n  void Scale\(float\* p, float s, int64_t n\) override \{.*?\n  \}", "", text,
                         count=1, flags=re.S)
    if n != 1:
        return "bench/profiling_backend.h: its Scale override (the op the self-test removes) was not found"
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "profiling_backend.h"), "w").write(planted)
        open(os.path.join(d, "probe.cc"), "w").write(PROFILING_PROBE)
        p = subprocess.run([cxx, "-std=gnu++20", "-fsyntax-only", "-I", d,
                            "-I", os.path.join(repo, "engine/src"), "-I", os.path.join(repo, "engine/include"),
                            os.path.join(d, "probe.cc")], capture_output=True, text=True)
    if p.returncode == 0 or "no override of Scale" not in p.stderr:
        return "a ProfilingBackend without its Scale override was not refused by the build:\n" + p.stderr[-2000:]
    return None


def self_test(repo):
    """The checker itself: the real files pass, and each planted omission is reported."""
    files = [f"{CUDA_DIR}/README.md", f"{TOKENIZER_DIR}/internal.h", f"{TOKENIZER_DIR}/factory.cc",
             "offload/CMakeLists.txt", "offload/include/traind/offload/offload.h",
             "tests/offload/store_contract_test.cc", "offload/README.md", "offload/src/nvme_store.cc"]
    files += [f"{CUDA_DIR}/{f}" for f in os.listdir(os.path.join(repo, CUDA_DIR))]
    files += [f"{TOKENIZER_DIR}/{f}" for f in os.listdir(os.path.join(repo, TOKENIZER_DIR))
              if f.endswith("_tokenizer.cc")]
    files += [f"tests/engine/{f}" for f in os.listdir(os.path.join(repo, "tests/engine"))
              if f.startswith("tokenizer_") and f.endswith("_test.cc")]
    files += [f"offload/src/{f}" for f in os.listdir(os.path.join(repo, "offload/src")) if f.endswith("_store.cc")]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for rel in set(files):
            if os.path.isfile(os.path.join(repo, rel)):
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                shutil.copy(os.path.join(repo, rel), os.path.join(root, rel))
        base = check(root)
        if base:
            failures.append("the unmodified files already fail: " + "; ".join(base))

        def plant(what, edit, expect):
            edit()
            got = check(root)
            if not any(expect in v for v in got):
                failures.append(f"{what}: not reported (expected a line naming '{expect}', got {got})")
            return got

        def write(rel, text):
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)

        def sub(rel, pattern, repl):
            text = read(root, rel)
            new, n = re.subn(pattern, repl, text, count=1, flags=re.S)
            if n != 1:
                failures.append(f"self-test setup: '{pattern}' not found in {rel}")
            write(rel, new)

        # cuda: a new kernel file without a row, then a row whose file is gone.
        plant("a .cu file missing from the CUDA README's table",
              lambda: write(f"{CUDA_DIR}/newop.cu", "// a new kernel\n"), "newop.cu")
        os.remove(os.path.join(root, CUDA_DIR, "newop.cu"))
        plant("a CUDA README row whose file is gone",
              lambda: os.remove(os.path.join(root, CUDA_DIR, "rope.cu")), "rope.cu")
        shutil.copy(os.path.join(repo, CUDA_DIR, "rope.cu"), os.path.join(root, CUDA_DIR, "rope.cu"))
        # tokenizer: a kind not routed in factory.cc; a kind without its test; a kind with no Make.
        saved = read(root, f"{TOKENIZER_DIR}/factory.cc")
        plant("a tokenizer kind factory.cc does not route to",
              lambda: sub(f"{TOKENIZER_DIR}/factory.cc", r"\bMakeWordPieceFromJson\(", "MakeSomethingElse("),
              "wordpiece_tokenizer.cc: factory.cc routes to none")
        write(f"{TOKENIZER_DIR}/factory.cc", saved)
        plant("a tokenizer kind without its test",
              lambda: os.remove(os.path.join(root, "tests/engine/tokenizer_sentencepiece_test.cc")),
              "tests/engine/tokenizer_sentencepiece_test.cc")
        shutil.copy(os.path.join(repo, "tests/engine/tokenizer_sentencepiece_test.cc"),
                    os.path.join(root, "tests/engine/tokenizer_sentencepiece_test.cc"))
        plant("a tokenizer kind with no constructor in internal.h",
              lambda: write(f"{TOKENIZER_DIR}/unigram_tokenizer.cc",
                            "std::unique_ptr<Tokenizer> MakeUnigram(const std::string& path) { return {}; }\n"),
              "unigram_tokenizer.cc: defines no Make")
        os.remove(os.path.join(root, TOKENIZER_DIR, "unigram_tokenizer.cc"))
        # offload: a store missing from the contract test's list; from the sources; an nvme kind
        # its error does not name.
        saved = read(root, "tests/offload/store_contract_test.cc")
        plant("a store missing from the contract test's Factories",
              lambda: sub("tests/offload/store_contract_test.cc", r"(using Factories = ::testing::Types<[^>]*?), ValueLogFactory",
                          r"\1"),
              "MakeValueLogStore is not in store_contract_test.cc")
        write("tests/offload/store_contract_test.cc", saved)
        saved = read(root, "offload/CMakeLists.txt")
        plant("a store missing from traind_offload's sources",
              lambda: sub("offload/CMakeLists.txt", r"\n  src/host_store\.cc", ""), "host_store.cc: not in traind_offload")
        write("offload/CMakeLists.txt", saved)
        plant("an nvme kind its error does not name",
              lambda: sub("offload/src/nvme_store.cc", r'(  if \(kind == "rocksdb"\))',
                          r'  if (kind == "tiered") return MakeRocksDbStore(dir, options);\n\1'),
              "kind 'tiered'")
    err = profiling_self_test(repo)
    if err:
        failures.append(err)
    if failures:
        print("self-test FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("self-test: the real recipes pass; every planted omission is reported (cuda table x2, "
          "tokenizer x3, offload store x3) and a ProfilingBackend missing an op does not compile")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "--self-test":
        repo = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        return self_test(os.path.abspath(repo))
    if len(argv) != 2:
        print(__doc__)
        return 2
    violations = check(argv[1])
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} recipe violation(s): fix the tree or the recipe")
        return 1
    print("recipes: the CUDA file table, the tokenizer kinds and the offload stores are as their recipes say")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
