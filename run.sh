#!/usr/bin/env bash
# traind's two entry points on a fresh Debian 12 machine:
#   ./run.sh demo   install what is missing, build, start traind on loopback, train the example job
#   ./run.sh test   install what is missing, build, run the whole test suite with ctest
# Also: ./run.sh deps | build | bench
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

deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm (the tokenizer tests' reference, HF tokenizers for Node): Debian's package, unless the
  # installed nodejs already brings npm (NodeSource's does, and conflicts with Debian's npm).
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  log "installing ${#missing[@]} Debian packages: ${missing[*]}"
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "${missing[@]}"
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

cmd=${1:-}
shift || true
case "$cmd" in
  deps) deps ;;
  build) deps; build ;;
  test) deps; build; run_tests "$@" ;;
  demo) deps; build traind traind-job-runner trainctl; demo ;;
  bench) deps; build; "$ROOT/bench/run_all.sh" "$BUILD_DIR" "$@" ;;
  *) echo "usage: ./run.sh demo | test | build | deps | bench" >&2; exit 2 ;;
esac
