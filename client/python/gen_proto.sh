#!/usr/bin/env bash
# Compiles proto/traind/v1/*.proto for Python into OUT_DIR (default client/python/gen):
#   client/python/gen_proto.sh [OUT_DIR]
# then: PYTHONPATH=OUT_DIR:client/python /usr/bin/python3 client/python/examples/submit_and_follow.py ...
# CMake does the same at build time into <build>/python (target traind_python_proto).
# Uses Debian's protoc (protobuf-compiler) and grpc_python_plugin (protobuf-compiler-grpc): their
# versions match the runtime (python3-protobuf 3.21, python3-grpcio 1.51). python3-grpc-tools would
# also work (/usr/bin/python3 -m grpc_tools.protoc ...) but bundles the older libprotoc 3.5.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/gen}
mkdir -p "$OUT"
protoc -I "$ROOT/proto" --python_out="$OUT" --grpc_out="$OUT" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" \
  "$ROOT"/proto/traind/v1/job.proto "$ROOT"/proto/traind/v1/job_service.proto
echo "generated Python modules for traind.v1 in $OUT"
