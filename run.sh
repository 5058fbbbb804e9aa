#!/usr/bin/env bash
# traind's two entry points on a fresh Debian 12 machine:
#   ./run.sh demo   install what is missing, build, start traind on loopback, train the example job
#   ./run.sh test   install what is missing, build, run the whole test suite with ctest
# Also: ./run.sh deps | build | bench | fuzz [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
BUILD_DIR=${TRAIND_BUILD_DIR:-$ROOT/build}
JOBS=${TRAIND_JOBS:-$(nproc)}

PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev grpc-proto
  librocksdb-dev prometheus-cpp-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libdnnl-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  python3 python3-torch python3-numpy python3-grpcio prometheus
  python3-protobuf python3-yaml  # the Python client (client/python) and tests/deploy (prometheus: its e2e test)
  libsentencepiece-dev sentencepiece nodejs
  libcpp-httplib-dev  # traind's web page (server/http)
  chromium python3-websocket tmux  # tests/web: the page in headless Chromium (DevTools over a websocket), trainctl top under tmux
  fio  # bench/offload_bench: raw sequential bandwidth of the offload directory
  zsh  # tests/daemon/completion_test.sh parses client/trainctl/completion/_trainctl
)

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Appends to the array named $1 each later argument that dpkg does not list as installed.
add_missing() {
  local -n into=$1; shift
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || into+=("$p")
  done
}

# apt-get installs the packages given ($1: what they are for, for the log line).
apt_install() {
  local why=$1; shift
  log "installing $# Debian packages$why: $*"
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "$@"
}

deps() {
  local missing=()
  add_missing missing "${PACKAGES[@]}"
  # npm (the tokenizer tests' reference, HF tokenizers for Node): Debian's package, unless the
  # installed nodejs already brings npm (NodeSource's does, and conflicts with Debian's npm).
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  apt_install "" "${missing[@]}"
}

build() {
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
    # CI builds one architecture (time); release builds cover sm_80 and sm_90.
    if [ "${CI:-}" = "true" ]; then args+=(-DCMAKE_CUDA_ARCHITECTURES=80); fi
  fi
  log "configuring in $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" "${args[@]}" >"$BUILD_DIR.configure.log" 2>&1 \
    || { cat "$BUILD_DIR.configure.log"; exit 1; }
  log "building ${*:-everything} with $JOBS jobs"
  if [ $# -gt 0 ]; then
    cmake --build "$BUILD_DIR" -j "$JOBS" --target "$@"
  else
    cmake --build "$BUILD_DIR" -j "$JOBS"
  fi
}

run_tests() {
  log "running the test suite"
  # Tests share 2 cores with each other (ctest -j): OpenMP threads that spin-wait for a busy core
  # make every parallel region crawl, so they sleep instead. Results do not depend on it.
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
  cd "$BUILD_DIR"
  ctest --output-on-failure -j "$JOBS" --timeout 1200 "$@"
}

demo() {
  "$ROOT/scripts/demo.sh" "$BUILD_DIR"
}

# ./run.sh fuzz [SECONDS]: the libFuzzer targets of fuzz/ (fuzz/README.md), built with clang and
# ASan+UBSan in build-fuzz/, each run for SECONDS (default 60) from fuzz/corpus/<target> and
# fuzz/regressions/<target>. New interesting inputs stay in build-fuzz/corpus/<target>; a crash
# input is copied into fuzz/regressions/<target>/ and the command fails.
FUZZ_PACKAGES=(clang libclang-rt-14-dev libomp-dev llvm)  # llvm: llvm-symbolizer for the traces
fuzz() {
  local seconds=${1:-60}
  local dir=${TRAIND_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
  local missing=()
  add_missing missing "${FUZZ_PACKAGES[@]}"
  if [ ${#missing[@]} -gt 0 ]; then apt_install " for fuzzing" "${missing[@]}"; fi
  local san="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined"
  san+=" -fno-omit-frame-pointer -gline-tables-only"
  log "configuring the clang fuzz build in $dir"
  mkdir -p "$dir"
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER_LAUNCHER="$ROOT/fuzz/clang_launcher.sh" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$ROOT/fuzz/clang_launcher.sh" \
    -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" -DTRAIND_FUZZ_LIBFUZZER=ON \
    -DTRAIND_BUILD_SERVICES=OFF -DTRAIND_BUILD_CUDA=OFF -DTRAIND_BUILD_SIMT=OFF \
    -DTRAIND_BUILD_TESTS=OFF -DTRAIND_BUILD_BENCH=OFF >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; exit 1; }
  local targets=()
  for f in "$ROOT"/fuzz/*_fuzzer.cc; do
    f=${f##*/}
    targets+=("${f%_fuzzer.cc}")
  done
  log "building ${#targets[@]} fuzz targets with $JOBS jobs"
  cmake --build "$dir" -j "$JOBS" --target "${targets[@]/#/fuzz_}"
  local failed=() t
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
  for t in "${targets[@]}"; do
    local work="$dir/corpus/$t" art="$dir/artifacts/$t" out="$dir/fuzz-$t.log"
    mkdir -p "$work" "$art" "$ROOT/fuzz/regressions/$t"
    rm -f "$art"/*
    log "fuzzing $t for ${seconds}s"
    # The first folder is the writable working corpus; the repo's seeds and regressions are read.
    local rc=0
    "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=25 \
      -rss_limit_mb=2560 -max_len=16384 -artifact_prefix="$art/" \
      "$work" "$ROOT/fuzz/corpus/$t" "$ROOT/fuzz/regressions/$t" >"$out" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
      grep -v -E '^(#[0-9]|INFO:)' "$out" | head -n 40 >&2
      failed+=("$t")
    fi
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
      "$out" | sed "s/^/  $t /" >&2
    local a
    for a in "$art"/*; do
      [ -e "$a" ] || continue
      cp "$a" "$ROOT/fuzz/regressions/$t/"
      log "$t: kept $(basename "$a") in fuzz/regressions/$t/ (log: $out)"
      [[ " ${failed[*]} " == *" $t "* ]] || failed+=("$t")
    done
  done
  if [ ${#failed[@]} -gt 0 ]; then
    log "fuzzing found crashes in: ${failed[*]}"
    return 1
  fi
  log "fuzzing: no crash in ${#targets[@]} targets (${seconds}s each)"
}

cmd=${1:-}
shift || true
case "$cmd" in
  deps) deps ;;
  build) deps; build ;;
  test) deps; build; run_tests "$@" ;;
  demo) deps; build traind traind-job-runner trainctl; demo ;;
  bench) deps; build; "$ROOT/bench/run_all.sh" "$BUILD_DIR" "$@" ;;
  fuzz) deps; fuzz "$@" ;;
  *) echo "usage: ./run.sh demo | test | build | deps | bench | fuzz [SECONDS]" >&2; exit 2 ;;
esac
