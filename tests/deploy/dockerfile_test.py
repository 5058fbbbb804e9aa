#!/usr/bin/env python3
"""deploy/Dockerfile read as text (docker is not run here): NCCL is installed in both stages from
NVIDIA's repository, built for the image's CUDA version, and the runtime stage's last check covers
it.

usage: dockerfile_test.py DOCKERFILE

- build stage: libnccl-dev (nccl.h, libnccl.so) and libnccl2 installed at one pinned version whose
  suffix is +cuda${CUDA_MAJOR}.${CUDA_MINOR} (from NCCL_VERSION or apt-cache madison), recorded in
  /out/nccl-version; the CMake step fails unless CMake found NCCL (TRAIND_NCCL_LIBRARY and
  TRAIND_NCCL_INCLUDE_DIR in CMakeCache.txt);
- runtime stage: libnccl2 of the recorded version (the file copied from the build stage before the
  apt-get that installs it), no libnccl-dev; its last RUN with ldd also checks libnccl.so.2 in the
  loader's cache and the package's +cuda suffix.
"""
import re
import sys

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)


def stages(text):
    """{stage name: its instructions (continuation lines joined, comments dropped)}."""
    out, name = {}, None
    logical, cur = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not cur:
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            logical.append(cur.strip())
        cur = ""
    for ins in logical:
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", ins, re.I)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(ins)
    return out


def main():
    text = open(sys.argv[1]).read()
    st = stages(text)
    check(set(st) >= {"build", "runtime"}, "stages build and runtime, got %s" % sorted(st))
    build, runtime = st.get("build", []), st.get("runtime", [])
    suffix = "+cuda${CUDA_MAJOR}.${CUDA_MINOR}"

    # build: one RUN resolves the pin for this CUDA and installs both packages at it.
    runs = [i for i in build if i.startswith("RUN ") and "libnccl-dev=" in i]
    check(len(runs) == 1, "build stage: one RUN installs libnccl-dev=<pin>, found %d" % len(runs))
    if runs:
        r = runs[0]
        check(suffix in r, "build stage: the NCCL pin carries " + suffix)
        check("apt-cache madison libnccl-dev" in r, "build stage: the pin comes from the repository")
        check("${NCCL_VERSION}" in r, "build stage: NCCL_VERSION overrides the pin")
        check(re.search(r'libnccl-dev="\$\{NCCL_PIN\}"', r) is not None,
              "build stage: libnccl-dev installed at the pin")
        check(re.search(r'libnccl2="\$\{NCCL_PIN\}"', r) is not None,
              "build stage: libnccl2 installed at the same pin")
        check("exit 1" in r, "build stage: no package for this CUDA fails the build")
        check("> /out/nccl-version" in r, "build stage: the pin recorded for the runtime stage")
        check(r.find("cuda-keyring") < r.find("libnccl-dev="),
              "build stage: NCCL from NVIDIA's repository (after its keyring)")
    check("ARG NCCL_VERSION" in build, "build stage: ARG NCCL_VERSION")
    cmake = [i for i in build if i.startswith("RUN ") and "cmake -S" in i]
    check(len(cmake) == 1 and "TRAIND_NCCL_LIBRARY:FILEPATH=/" in cmake[0]
          and "TRAIND_NCCL_INCLUDE_DIR:PATH=/" in cmake[0]
          and cmake[0].find("CMakeCache") < cmake[0].find("cmake --build"),
          "build stage: the CMake step fails before building unless NCCL was found")

    # runtime: libnccl2 at the recorded version, the file copied in first; no dev package.
    copy_at = next((k for k, i in enumerate(runtime)
                    if i.startswith("COPY --from=build /out/nccl-version")), None)
    install_at = next((k for k, i in enumerate(runtime)
                       if i.startswith("RUN ") and 'libnccl2="$(cat /tmp/nccl-version)"' in i), None)
    check(install_at is not None, "runtime stage: libnccl2 installed at the build stage's version")
    check(copy_at is not None and install_at is not None and copy_at < install_at,
          "runtime stage: /out/nccl-version copied before libnccl2 is installed")
    check(not any("libnccl-dev" in i for i in runtime), "runtime stage: no libnccl-dev")
    ldd = [i for i in runtime if i.startswith("RUN ") and "ldd " in i]
    check(len(ldd) == 1, "runtime stage: one RUN checks the libraries, found %d" % len(ldd))
    if ldd:
        r = ldd[0]
        check(re.search(r"ldconfig -p \| grep -q 'libnccl\\\.so\\\.2 '", r) is not None,
              "runtime stage: the library check covers libnccl.so.2")
        check("dpkg-query -W -f='${Version}' libnccl2" in r and suffix in r,
              "runtime stage: the library check requires libnccl2 built for this CUDA")
        copy_bin = next((k for k, i in enumerate(runtime) if "COPY --from=build /out/bin/" in i), -1)
        check(copy_bin != -1 and copy_bin < runtime.index(r),
              "runtime stage: the check runs on the copied binaries")

    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("deploy/Dockerfile: NCCL in the build and runtime stages, pinned to the image's CUDA, "
          "checked at the end: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
