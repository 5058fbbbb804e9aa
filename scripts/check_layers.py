#!/usr/bin/env python3
"""Fails when a source file includes a header of a higher layer (docs/engine.md, "Layers").

Engine layers, bottom to top; a folder may include its own layer and those below it, never a peer:
  api      engine/include/traind/engine/*.h   (public; std and other public headers only)
  core     engine/src/core/                   (status, dtypes, 16-bit floats, file formats)
  backend  engine/src/backend/ (cpu/ cuda/ simt/; the arena)
  nn, optim, data                             (peers: none includes another)
  models   engine/src/models/
  train    engine/src/train/, engine/tools/
Also: engine/ never includes RocksDB, gRPC, protobuf or Gloo; server/ never includes engine internals
(kernels, backends) - only the engine's public headers.
Usage: check_layers.py REPO_ROOT    (exit 1 and one line per violation)
"""
import os
import re
import sys

LAYER_OF_FOLDER = {
    "core": 1, "backend": 2, "nn": 3, "optim": 3, "data": 3, "models": 4, "train": 5,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
FOREIGN = ("rocksdb/", "grpc", "grpcpp/", "google/protobuf/", "prometheus/", "gloo/")


def layer_of_header(header):
    """(layer name, level) of an engine-internal include path like "backend/arena.h", else None."""
    if header.startswith("traind/engine/"):
        return ("api", 0)
    top = header.split("/", 1)[0]
    if top in LAYER_OF_FOLDER and "/" in header:
        return (top, LAYER_OF_FOLDER[top])
    return None


def check_engine(root, violations):
    engine = os.path.join(root, "engine")
    for dirpath, _, files in os.walk(engine):
        for name in files:
            if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, engine)
            parts = rel.split(os.sep)
            if parts[0] == "include":
                mine = ("api", 0)
            elif parts[0] == "src" and parts[1] in LAYER_OF_FOLDER:
                mine = (parts[1], LAYER_OF_FOLDER[parts[1]])
            elif parts[0] == "tools":
                mine = ("train", 5)
            else:
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
            for inc in INCLUDE.findall(text):
                if inc.startswith(FOREIGN):
                    violations.append(f"engine/{rel}: includes <{inc}>: the engine knows nothing of "
                                      "RocksDB, gRPC, protobuf, Prometheus or Gloo")
                    continue
                theirs = layer_of_header(inc)
                if theirs is None:
                    continue
                if mine[0] == "api" and theirs[0] != "api":
                    violations.append(f"engine/{rel}: public header includes internal \"{inc}\"")
                elif theirs[1] > mine[1]:
                    violations.append(f"engine/{rel}: layer {mine[0]} includes \"{inc}\" of higher "
                                      f"layer {theirs[0]}")
                elif theirs[1] == mine[1] and theirs[0] != mine[0]:
                    violations.append(f"engine/{rel}: layer {mine[0]} includes \"{inc}\" of peer "
                                      f"layer {theirs[0]}")


def check_server(root, violations):
    server = os.path.join(root, "server")
    for dirpath, _, files in os.walk(server):
        for name in files:
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.join(dirpath, name)
            text = open(path, encoding="utf-8", errors="replace").read()
            for inc in INCLUDE.findall(text):
                layer = layer_of_header(inc)
                if layer is not None and layer[0] != "api":
                    rel = os.path.relpath(path, root)
                    violations.append(f"{rel}: includes engine internal \"{inc}\" (server/ knows "
                                      "nothing of kernels: use traind/engine/*.h)")


def self_test():
    """The checker itself: a tree with one violation of each kind must fail with each named."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        put("engine/src/optim/bad.h", '#include "models/model.h"\n')    # up a layer
        put("engine/src/nn/peer.h", '#include "data/token_data.h"\n')   # a peer
        put("engine/src/core/ok.h", '#include "traind/engine/status.h"\n')
        put("engine/src/backend/db.cc", "#include <rocksdb/db.h>\n")
        put("engine/include/traind/engine/pub.h", '#include "core/dtype.h"\n')
        put("server/handler.cc", '#include "backend/backend.h"\n')
        violations = []
        check_engine(root, violations)
        check_server(root, violations)
        expected = ["optim/bad.h", "nn/peer.h", "backend/db.cc", "traind/engine/pub.h",
                    "server/handler.cc"]
        missing = [e for e in expected if not any(e in v for v in violations)]
        if missing or len(violations) != len(expected):
            print("self-test FAILED: missing", missing, "got", violations)
            return 1
    print(f"self-test: the checker finds all {len(expected)} planted violations")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    violations = []
    check_engine(root, violations)
    check_server(root, violations)
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} layering violation(s); the map is in docs/engine.md")
        return 1
    print("layering: every include goes down the map (docs/engine.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
