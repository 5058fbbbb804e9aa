#!/bin/sh
# Compiler launcher of the clang fuzz build (./run.sh fuzz, build-fuzz/): runs the compile command
# with these flags appended, so they win over the engine's own target options.
# -Wno-error: the engine's -Werror is tuned for gcc (the gcc build keeps it); clang warns about
#   other things. -Wno-pass-failed: `#pragma omp simd` loops it does not vectorize under ASan.
# -O1: what libFuzzer's docs use with the sanitizers; the engine's -O3 makes the build slower
#   and buys nothing for parsers.
exec "$@" -Wno-error -Wno-pass-failed -O1
