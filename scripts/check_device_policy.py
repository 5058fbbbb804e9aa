#!/usr/bin/env python3
"""Fails when policy is decided from a device's name, or when the engine reads the environment
outside its one reader.

1. Device names are not policy. What differs between devices (whether ops finish when they
   return, whether the device has its own memory, tensor cores, which communicator reduces its
   memory) is a capability: Backend::capabilities() on an open backend, DeviceCapabilitiesOf
   (traind/engine/devices.h) for a name before one is open. A comparison of a device name with
   "cpu", "cuda...", "simt" or "auto" (==, !=, rfind/starts_with/compare of "cuda") in engine/,
   worker/, comm/, server/ or bench/ fails, except in the device registry (engine/src/backend/
   device_registry.cc), which parses the names and holds the capabilities table.
2. Environment variables: engine/ reads them in engine/src/core/environment.cc
   (ReadEngineEnvironment) only; a getenv anywhere else in engine/ fails.
Usage: check_device_policy.py [REPO_ROOT] | --self-test   (exit 1 and one line per violation)
"""
import os
import re
import sys

FOLDERS = ("engine", "worker", "comm", "server", "bench")
EXTENSIONS = (".h", ".cc", ".cu", ".cuh")
REGISTRY = "engine/src/backend/device_registry.cc"
ENV_READER = "engine/src/core/environment.cc"
NAME = r'"(?:cpu|simt|auto|cuda(?::\d*)?)"'
# A value named like a device (device, device_, s->device, opts.device, name(), resolved) compared
# with a device name, either way round; any prefix test for "cuda".
DEVICE_VALUE = (r'(?:\w+(?:\(\))?(?:\.|->))*(?:\w*device\w*|resolved|name\(\))'
                r'(?:\(\))?(?:(?:\.|->)\w+(?:\(\))?)*')
COMPARISONS = [
    re.compile(DEVICE_VALUE + r'\s*(?:==|!=)\s*' + NAME),
    re.compile(NAME + r'\s*(?:==|!=)\s*' + DEVICE_VALUE),
    re.compile(r'\b(?:rfind|starts_with|compare|find)\(\s*"cuda'),
    re.compile(r'(?:==|!=)\s*"(?:simt|cuda(?::\d*)?)"'),  # whatever holds it
]
GETENV = re.compile(r'\b(?:std::)?(?:secure_)?getenv\s*\(')


def code_lines(text):
    """The lines with // comments cut off (string literals kept: the names are in them)."""
    out = []
    for line in text.split("\n"):
        cut = line.find("//")
        out.append(line if cut < 0 else line[:cut])
    return out


def check(root, violations):
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(EXTENSIONS):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                lines = code_lines(open(path, encoding="utf-8", errors="replace").read())
                for no, line in enumerate(lines, 1):
                    if rel != REGISTRY and any(c.search(line) for c in COMPARISONS):
                        violations.append(f"{rel}:{no}: decides from a device's name (ask the "
                                          f"device's capabilities): {line.strip()}")
                    if folder == "engine" and rel != ENV_READER and GETENV.search(line):
                        violations.append(f"{rel}:{no}: reads the environment (add the variable "
                                          f"to core/environment.h): {line.strip()}")


def self_test():
    """Each planted violation fails, naming its file; the registry, offload's "cpu" (not a device)
    and comments pass."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        put("engine/src/train/a.cc", '  update = s->device == "cpu";\n')
        put("engine/src/train/b.cc", '  if (device.rfind("cuda:", 0) == 0) return;\n')
        put("worker/src/c.cc", '  if (device == "simt") return Refuse();\n')
        put("comm/src/d.cc", '  if ("auto" == opts.device) x();\n')
        put("server/e.cc", '  if (device->device != "cpu") budget = free;\n')
        put("bench/g_bench.cc", '  mo.pack_weights = f.pack && f.device == "cpu";\n')
        put("engine/src/data/f.cc", '  const char* d = std::getenv("TRAIND_X");\n')
        put(REGISTRY, '  if (device == "cpu" || device.empty()) return d;\n'
                      '  const char* v = getenv("X");\n')  # a getenv there is still one
        put(ENV_READER, '  const char* v = std::getenv(name);\n')
        put("engine/src/train/ok.cc", '  if (t.offload == "cpu") open();  // device == "cpu"\n'
                                      '  caps.has_own_memory;\n')
        violations = []
        check(root, violations)
        where = sorted(v.split(":", 1)[0] for v in violations)
        expected = sorted(["engine/src/train/a.cc", "engine/src/train/b.cc", "worker/src/c.cc",
                           "comm/src/d.cc", "server/e.cc", "bench/g_bench.cc",
                           "engine/src/data/f.cc", REGISTRY])
        if where != expected:
            print("self-test FAILED: expected", expected, "got", violations)
            return 1
    print(f"self-test: the checker finds all {len(expected)} planted violations")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    violations = []
    check(root, violations)
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} violation(s): device names as policy, or getenv outside "
              "core/environment.cc")
        return 1
    print("device policy: capabilities, not names; the environment read in one place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
