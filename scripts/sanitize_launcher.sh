#!/bin/sh
# Compiler launcher of the sanitizer builds (./run.sh sanitize: build-asan/, build-tsan/): runs the
# compile command with these flags appended, so they win over the targets' own options.
# -O1: over the engine's -O3 too. ASan+UBSan at -O3 doubles the compile time of the engine (on 2
#   cores the tree would take most of an hour) and -O1 keeps stack traces exact.
# -Wno-error: over traind_warnings' -Werror. gcc's
# sanitizer instrumentation changes what its flow analysis sees (-Wmaybe-uninitialized,
# -Wstringop-overflow, -Wnull-dereference on instrumented code); those warnings are not findings,
# and the normal build keeps -Werror.
exec "$@" -Wno-error -O1
