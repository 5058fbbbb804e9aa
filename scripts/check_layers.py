#!/usr/bin/env python3
"""Fails when a source file includes a header of a higher layer (docs/engine.md, "Layers").

Engine layers, bottom to top; a folder may include its own layer and those below it, never a peer:
  api      engine/include/traind/engine/*.h   (public; std and other public headers only; each
                                               public header sits at the layer of what it
                                               declares: PUBLIC_LAYER)
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
# The layer of each public header: where what it declares lives, so that a folder includes a
# public header only at or below its own layer (data may not include trainer.h). The vocabulary
# every layer may name (Status, the job spec's structs, plan bytes) is "api", level 0. A public
# header missing here is a violation: place it when you add it.
PUBLIC_LAYER = {
    "status.h": ("api", 0),         # Status, Result
    "plan.h": ("api", 0),           # MemoryBytes, MemoryPlan: plain structs
    "mutex.h": ("api", 0),          # Mutex/CondVar with thread-safety annotations: std only
    "job_spec.h": ("api", 0),       # the spec's structs (the parser, in train/, reads into them)
    "devices.h": ("backend", 2),    # DeviceOptions, QueryDevice: the device registry
    "communicator.h": ("backend", 2),  # collectives over device buffers (a seam: Gloo, NCCL)
    "optimizer_state_store.h": ("optim", 3),  # the optimizers' offload seam
    "tokenizer.h": ("data", 3),     # tokenizers and tokenizing progress
    "spec_examples.h": ("data", 3),  # a spec's training examples (`trainctl tokenize --spec`)
    "trainer.h": ("train", 5),      # RunJob, EstimateJob, the run's reports
    "local_run.h": ("train", 5),    # `traind run`
    "generate.h": ("train", 5),     # text from a trained model
    "signal_thread.h": ("train", 5),  # the job's signal thread
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
FOREIGN = ("rocksdb/", "grpc", "grpcpp/", "google/protobuf/", "prometheus/", "gloo/")


def layer_of_header(header):
    """(layer name, level) of an engine-internal include path like "backend/arena.h", else None."""
    if header.startswith("traind/engine/"):
        return PUBLIC_LAYER.get(header[len("traind/engine/"):], ("unplaced", 0))
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
            public = False
            if parts[0] == "include":
                public = True
                mine = layer_of_header("/".join(parts[1:]))
                if mine[0] == "unplaced":
                    violations.append(f"engine/{rel}: public header without a layer: add it to "
                                      "PUBLIC_LAYER in scripts/check_layers.py")
                    continue
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
                if public and not inc.startswith("traind/engine/"):
                    violations.append(f"engine/{rel}: public header includes internal \"{inc}\"")
                elif theirs[0] == "unplaced":
                    continue  # reported once, at the header itself
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
                if layer is not None and not inc.startswith("traind/engine/"):
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
        put("engine/include/traind/engine/status.h", '#include "core/dtype.h"\n')  # internal
        put("server/handler.cc", '#include "backend/backend.h"\n')
        # Public headers sit at their own layers (issue 41): data includes the train layer's
        # trainer.h (up), optim includes data's tokenizer.h (a peer), a lower public header
        # includes a higher one, and a public header nobody placed; each fails. Including
        # job_spec.h or a public header of a lower layer is fine.
        put("engine/src/data/token_data.h", '#include "traind/engine/trainer.h"\n')
        put("engine/src/optim/tok.h", '#include "traind/engine/tokenizer.h"\n')
        put("engine/include/traind/engine/plan.h", '#include "traind/engine/devices.h"\n')
        put("engine/include/traind/engine/new_api.h", '#include "traind/engine/status.h"\n')
        put("engine/src/data/ok.h", '#include "traind/engine/job_spec.h"\n'
                                    '#include "traind/engine/tokenizer.h"\n'
                                    '#include "traind/engine/devices.h"\n')
        put("engine/include/traind/engine/trainer.h", '#include "traind/engine/tokenizer.h"\n')
        violations = []
        check_engine(root, violations)
        check_server(root, violations)
        expected = ["engine/src/optim/bad.h", "engine/src/nn/peer.h", "engine/src/backend/db.cc",
                    "engine/include/traind/engine/status.h", "server/handler.cc",
                    "engine/src/data/token_data.h", "engine/src/optim/tok.h",
                    "engine/include/traind/engine/plan.h",
                    "engine/include/traind/engine/new_api.h"]
        where = sorted(v.split(":", 1)[0] for v in violations)  # the file each names
        missing = [e for e in expected if e not in where]
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
