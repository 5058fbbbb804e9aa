#!/usr/bin/env bash
# Pack binaries built here (Debian 12, nvcc) with the shared libraries they need that a GPU machine's
# image lacks, so they run there. The GPU machine receives only the project checkout, so the pack
# goes into a git-ignored folder of the checkout that you name in the device tool's `carry`.
#   usage: scripts/gpu_pack.sh BUILD_DIR OUT_DIR [BINARY...]
#   default binaries: every gpu_* test and the bench binaries found under BUILD_DIR
# Writes OUT_DIR/pack.tar.xz and OUT_DIR/run.sh; on the GPU machine run `bash OUT_DIR/run.sh CMD...`
# (it unpacks to a temporary folder, sets LD_LIBRARY_PATH, finds the CUDA libraries, runs CMD from the
# unpacked bin/). Add OUT_DIR to .git/info/exclude.
set -euo pipefail
build=${1:?usage: gpu_pack.sh BUILD_DIR OUT_DIR [BINARY...]}; out=${2:?usage: gpu_pack.sh BUILD_DIR OUT_DIR [BINARY...]}
shift 2
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  mapfile -t bins < <(find "$build" -type f -perm -u+x \( -name 'gpu_*' -o -name '*_bench' \) | sort)
fi
[ ${#bins[@]} -gt 0 ] || { echo "gpu_pack.sh: no binaries (build with -DTRAIND_GPU_TESTS=ON?)" >&2; exit 2; }
stage=$(mktemp -d); mkdir -p "$stage/pack/bin" "$stage/pack/lib" "$out"
for b in "${bins[@]}"; do cp "$b" "$stage/pack/bin/"; done
# Libraries the GPU image has itself (glibc, the compiler runtime, CUDA's own) stay behind.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -Ln "$path" "$stage/pack/lib/$name" 2>/dev/null || true; fi
  done
done
tar -C "$stage" -cJf "$out/pack.tar.xz" pack
rm -rf "$stage"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine: unpack and run a command with the packed libraries and CUDA's on the path.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=$(mktemp -d -t traind-gpu-XXXXXX)
tar -C "$dest" -xJf "$here/pack.tar.xz" 2>/dev/null || python3 -c \
  'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/pack.tar.xz" "$dest"
cudalibs=$(find / -xdev \( -name 'libcublasLt.so.*' -o -name 'libcudart.so.*' -o -name 'libcudnn.so.*' -o -name 'libnccl.so.*' \) \
  -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$dest/pack/lib:${cudalibs}${LD_LIBRARY_PATH:-}
cd "$dest/pack/bin"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for b in *; do ldd "./$b" | grep -q 'not found' && { echo "missing libraries for $b:"; ldd "./$b" | grep 'not found'; }; done
"$@"
RUN
chmod +x "$out/run.sh"
echo "gpu_pack.sh: $(du -h "$out/pack.tar.xz" | cut -f1) in $out/pack.tar.xz (${#bins[@]} binaries); carry '$out' and run: bash $out/run.sh ./gpu_kernels_test"
