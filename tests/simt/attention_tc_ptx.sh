#!/usr/bin/env bash
# ctest attention_tc_ptx (label ptx): compiles engine/src/backend/cuda/attention_tc.cu with nvcc for
# sm_80 and sm_90 and checks that its PTX issues tensor-core MMA (mma.sync.aligned.m16n8k16 with
# bf16 and f16 operands), ldmatrix (plain and .trans) and cp.async, and that `ptxas -v` reports
# 0 bytes of spill stores and loads for every kernel of the file (44 per architecture: forward,
# backward and its row-delta and dq passes for 2 types x 5 head sizes, and the fp32 boundary casts).
# Forcing spills (__launch_bounds__(128, 6) on the forward) made it fail (tried once).
# Usage: attention_tc_ptx.sh <nvcc> <repository root> <scratch dir>
set -euo pipefail
nvcc="$1"; root="$2"; dir="$3"
echo "nvcc found: $nvcc ($("$nvcc" --version | tail -n 1))"
mkdir -p "$dir"
fail=0
for arch in 80 90; do
  out="$dir/sm_$arch"
  rm -rf "$out" && mkdir -p "$out"
  "$nvcc" -std=c++17 -O3 -arch=sm_$arch -cubin -keep -keep-dir "$out" -Xptxas -v \
    -I"$root/engine/src" -I"$root/engine/include" \
    "$root/engine/src/backend/cuda/attention_tc.cu" -o "$out/attention_tc.cubin" \
    > "$out/ptxas.log" 2>&1 || { cat "$out/ptxas.log"; echo "FAIL sm_$arch: nvcc failed"; exit 1; }
  ptx=$(ls "$out"/*.ptx | head -n 1)
  for pattern in 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' \
                 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32' \
                 'ldmatrix.sync.aligned.m8n8.x4.shared.b16' \
                 'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16' \
                 'cp.async.cg.shared.global' 'cp.async.wait_group'; do
    n=$(grep -c -F "$pattern" "$ptx" || true)
    echo "sm_$arch: $n PTX lines with $pattern"
    if [ "$n" -eq 0 ]; then echo "FAIL sm_$arch: no $pattern"; fail=1; fi
  done
  # ptxas -v: "Compiling entry function '<name>'" ... "N bytes stack frame, S bytes spill stores, L bytes spill loads"
  report=$(awk '
    /Compiling entry function/ { match($0, /attn_tc_[a-z_]+kernel/); name = substr($0, RSTART, RLENGTH); next }
    /spill stores/ && name != "" { print name ": " $0; name = "" }' "$out/ptxas.log")
  kernels=$(printf '%s\n' "$report" | grep -c 'attn_tc_' || true)
  spilling=$(printf '%s\n' "$report" | grep -v ' 0 bytes spill stores, 0 bytes spill loads' | grep -c 'attn_tc_' || true)
  regs=$(grep -o 'Used [0-9]* registers' "$out/ptxas.log" | awk '{print $2}' | sort -n | tail -n 1)
  echo "sm_$arch: $kernels attention kernels, $spilling with spills, at most $regs registers"
  if [ "$kernels" -ne 44 ]; then echo "FAIL sm_$arch: expected 44 kernels"; fail=1; fi
  if [ "$spilling" -ne 0 ]; then printf '%s\n' "$report" | grep -v ' 0 bytes spill'; fail=1; fi
done
[ "$fail" -eq 0 ] && echo "PASS" || { echo "FAIL"; exit 1; }
