#!/usr/bin/env python3
"""Clang's thread-safety analysis over traind's own code (the `thread_safety` test).

Every translation unit of server/, worker/ and offload/ in the build's compile_commands.json, and
every one of engine/ and comm/ that uses the mutex (names Mutex, itself or its header of the same
name), is compiled again with clang++ -fsyntax-only -Wthread-safety, thread-safety warnings as
errors: a member TRAIND_GUARDED_BY(mu_) touched without mu_ held, a TRAIND_REQUIRES(mu_) function
called without it, a lock not released. The mutexes there must be the annotated ones
(engine/include/traind/engine/mutex.h): a plain std::mutex, std::shared_mutex or
std::condition_variable would escape the analysis, so one found in those folders fails the check
too. (GCC, which builds the project, ignores the annotations.)

Before that, a self-test compiles a deliberate violation and requires clang to report it, so the
check cannot pass by checking nothing.

Usage: check_thread_safety.py SOURCE_DIR BUILD_DIR [--jobs N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

FOLDERS = ("server", "worker", "offload", "engine", "comm")
ALL_UNITS = ("server", "worker", "offload")  # the rest: the units that use the mutex
ANNOTATED_HEADER = "engine/include/traind/engine/mutex.h"
PLAIN_MUTEX = re.compile(r"\bstd::(recursive_|shared_|timed_)?mutex\b|\bstd::condition_variable\b")


def clang_command(entry, clang):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]
    skip_next = False
    for i, a in enumerate(args[1:], start=1):
        if skip_next:
            skip_next = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip_next = True
            continue
        if a == "-c" or a.startswith("-W") or a in ("-MD", "-MMD") or a.startswith("-O"):
            continue
        if a == entry["file"] or os.path.join(entry["directory"], a) == entry["file"]:
            continue
        out.append(a)
    out.append(entry["file"])
    return out


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stderr


def self_test(clang, header_dir):
    bad = """
#include "traind/engine/mutex.h"
struct Counter {
  traind::Mutex mu;
  int n TRAIND_GUARDED_BY(mu) = 0;
  void Bump() { ++n; }  // written without mu held: the analysis must say so
};
int main() { Counter c; c.Bump(); }
"""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "violation.cc")
        with open(src, "w") as f:
            f.write(bad)
        code, err = run([clang, "-fsyntax-only", "-std=gnu++20", "-Wthread-safety", "-Werror=thread-safety",
                         "-I", header_dir, src], d)
    if code == 0 or "thread-safety" not in err:
        print("self-test FAILED: clang did not report a write of a GUARDED_BY member without its mutex:\n" + err)
        return False
    print("self-test: clang reports an unguarded write (" + err.strip().splitlines()[0].split(": ", 1)[-1] + ")")
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source_dir")
    ap.add_argument("build_dir")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    src = os.path.realpath(a.source_dir)
    clang = shutil.which("clang++")
    if clang is None:
        print("clang++ not found: install the Debian package clang (./run.sh deps does)")
        return 1
    if not self_test(clang, os.path.join(src, "engine", "include")):
        return 1

    failures = 0
    for folder in FOLDERS:
        for root, _, files in os.walk(os.path.join(src, folder)):
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, src)
                if not name.endswith((".h", ".cc", ".cu", ".cuh")) or rel == ANNOTATED_HEADER:
                    continue
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        code = line.split("//", 1)[0]
                        if PLAIN_MUTEX.search(code):
                            print(f"{rel}:{n}: a plain std mutex or condition variable escapes the analysis; "
                                  f"use traind::Mutex / SharedMutex / CondVar ({ANNOTATED_HEADER})")
                            failures += 1

    db_path = os.path.join(a.build_dir, "compile_commands.json")
    with open(db_path) as f:
        db = json.load(f)
    def in_folder(path, folders):
        return any(path.startswith(os.path.join(src, d) + os.sep) for d in folders)

    def uses_mutex(path):
        for p in (path, os.path.splitext(path)[0] + ".h"):
            if os.path.exists(p):
                with open(p, encoding="utf-8") as f:
                    if re.search(r"\bMutex\b|traind/engine/mutex\.h", f.read()):
                        return True
        return False

    units = []
    for e in db:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if in_folder(path, ALL_UNITS) or (in_folder(path, FOLDERS) and uses_mutex(path)):
            units.append(e)
    if not any(in_folder(os.path.realpath(os.path.join(e["directory"], e["file"])), ("server", "worker"))
               for e in units):
        print(f"no server/ or worker/ sources in {db_path}")
        return 1
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda e: (e, run(clang_command(e, clang), e["directory"])), units))
    for e, (code, err) in results:
        rel = os.path.relpath(os.path.realpath(e["file"]), src)
        if code != 0:
            failures += 1
            print(f"{rel}: FAILED\n{err}")
    print(f"thread-safety analysis: {len(units)} translation units of {', '.join(f + '/' for f in FOLDERS)}, "
          f"{failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
