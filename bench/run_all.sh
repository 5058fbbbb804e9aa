#!/usr/bin/env bash
# bench/run_all.sh BUILD_DIR [--coretype SkylakeX|Haswell|env] [--rounds N] [--config tiny|small|all]
# Runs the traind GPT-2 training-step bench and its PyTorch peer in the same run, alternating the
# two sides for N rounds (default 2; the best round of each side counts, which damps noise from
# other processes), and prints tokens/s, the traind/torch ratio and each side's MFU against the
# sgemm rate it measured itself. Both sides: 2 threads, OMP_WAIT_POLICY=PASSIVE (PyTorch's best
# setting on 2-core machines), and the same OPENBLAS_CORETYPE (default SkylakeX: OpenBLAS at its
# best for PyTorch; traind's fp32 GEMMs go to oneDNN, which does not read it).
set -euo pipefail
BUILD_DIR=${1:?usage: bench/run_all.sh BUILD_DIR [--coretype SkylakeX|Haswell|env] [--rounds N]}
shift
CORETYPE=SkylakeX
ROUNDS=2
CONFIG=all
while [ $# -gt 0 ]; do
  case "$1" in
    --coretype) CORETYPE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$BUILD_DIR/bench/gpt2_step_bench
PY=/usr/bin/python3
[ -x "$BENCH" ] || { echo "missing $BENCH: build the gpt2_step_bench target first" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "PyTorch peer needs python3-torch for $PY" >&2; exit 1; }

if [ "$CORETYPE" != env ]; then export OPENBLAS_CORETYPE=$CORETYPE; fi
export OMP_WAIT_POLICY=PASSIVE
echo "== traind vs PyTorch, fp32 GPT-2 training step, 2 threads"
echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
     "rounds=$ROUNDS host=$(hostname) cpus=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for ((r = 1; r <= ROUNDS; ++r)); do
  for c in tiny small; do
    [ "$CONFIG" = all ] || [ "$CONFIG" = "$c" ] || continue
    "$BENCH" --config "$c" --threads 2 | tee -a "$LOG"
    $PY "$HERE/torch_gpt2_step.py" --config "$c" --threads 2 | tee -a "$LOG"
  done
done
echo
$PY - "$LOG" <<'PYEOF'
import sys
best = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    key = (kv["config"], kv["side"])
    if key not in best or float(kv["tok_s"]) > float(best[key]["tok_s"]):
        best[key] = kv
print(f"{'config':8} {'traind tok/s':>13} {'torch tok/s':>12} {'ratio':>7} "
      f"{'traind MFU':>11} {'torch MFU':>10} {'traind sgemm':>13} {'torch sgemm':>12} "
      f"{'tok/CPU-s ratio':>16}")
for c in ("tiny", "small"):
    if (c, "traind") not in best or (c, "torch") not in best:
        continue
    a, b = best[(c, "traind")], best[(c, "torch")]
    ratio = float(a["tok_s"]) / float(b["tok_s"])
    print(f"{c:8} {float(a['tok_s']):13.0f} {float(b['tok_s']):12.0f} {ratio:6.2f}x "
          f"{100 * float(a['mfu']):10.1f}% {100 * float(b['mfu']):9.1f}% "
          f"{float(a['sgemm_gflops']):10.0f} GF {float(b['sgemm_gflops']):9.0f} GF "
          f"{float(a['tok_per_cpu_s']) / float(b['tok_per_cpu_s']):15.2f}x")
print("(best round of each side by tok/s. MFU: model FLOPs/s over the side's own sgemm 1024^3 "
      "rate measured in this run. tok/CPU-s ratio: tokens per process CPU-second, traind over "
      "torch, a cross-check that other processes' load distorts less)")
PYEOF
