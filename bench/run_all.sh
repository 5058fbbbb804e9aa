#!/usr/bin/env bash
# bench/run_all.sh BUILD_DIR [--coretype SkylakeX|Haswell|env] [--rounds N] [--config tiny|small|all]
# bench/run_all.sh BUILD_DIR --table [--arch gpt2|llama] [--model tiny|small] [--batch B]
#                                    [--accum K] [--steps N] [--rounds N] [--coretype ...]
# bench/run_all.sh BUILD_DIR --bert [--config tiny|base|large] [--batch B] [--accum K] [--steps N]
#                                   [--rounds N] [--seq T] [--coretype ...]
# bench/run_all.sh BUILD_DIR [--rounds N] --tokenize   # GPT-2 BPE MB/s vs HF tokenizers, 2 threads
# bench/run_all.sh BUILD_DIR [--rounds N] [--steps N] --dp   # data parallel: dp_scaling.py
# Default: the traind GPT-2 training-step bench and its PyTorch peer in the same run, alternating the
# two sides for N rounds (default 2; the best round of each side counts, which damps noise from
# other processes), and prints tokens/s, the traind/torch ratio and each side's MFU against the
# sgemm rate it measured itself. Both sides: 2 threads, OMP_WAIT_POLICY=PASSIVE (PyTorch's best
# setting on 2-core machines), and the same OPENBLAS_CORETYPE (default SkylakeX: OpenBLAS at its
# best for PyTorch; traind's fp32 GEMMs go to oneDNN, which does not read it).
# --table: issue 4's techniques table (baseline, + accumulation, + checkpointing, + bf16, + all),
# every row by traind (gpt2_table_bench) and PyTorch eager (torch_gpt2_table.py), one process per
# row and side, alternating, N rounds (default 3), best round of each side; see bench/README.md.
# --arch llama: the same table for a llama config of the same size (GQA, SwiGLU, RMSNorm, rotary,
# untied lm_head; the PyTorch peer is HF LlamaForCausalLM's math); default gpt2.
# --bert: the memory-anatomy guide's BERT experiment (bert-large by default, seq 512, batch 4):
# baseline, + accumulation (1 x 4), + checkpointing, + bf16, + Adafactor, + 8-bit AdamW, + all, by
# traind (bert_table_bench) and PyTorch eager (torch_bert_table.py), one process per row and side,
# alternating, N rounds (default 1), steps default 2; TRAIND_BERT_ROWS="baseline bf16" picks rows.
# --dp: data-parallel scaling (dp_scaling.py: 1 process x 1 / x 2 threads vs world 2 x 1 thread,
# with and without the overlapped all-reduce, N rounds (default 3), medians; then allreduce_bench
# --spawn 2, the Gloo all-reduce's bus bandwidth against memcpy); see bench/README.md.
set -euo pipefail
BUILD_DIR=${1:?usage: bench/run_all.sh BUILD_DIR [--coretype SkylakeX|Haswell|env] [--rounds N]}
shift
CORETYPE=SkylakeX
ROUNDS=2
CONFIG=all
TABLE=0
DP=0
BERT=0
SEQ=0
CONFIG_SET=0
BATCH_SET=0
STEPS_SET=0
MODEL=small
ARCH=gpt2
BATCH=8
ACCUM=4
STEPS=3
ROUNDS_SET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --coretype) CORETYPE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; ROUNDS_SET=1; shift 2 ;;
    --config) CONFIG=$2; CONFIG_SET=1; shift 2 ;;
    --bert) BERT=1; shift ;;
    --seq) SEQ=$2; shift 2 ;;
    --table) TABLE=1; shift ;;
    --model) MODEL=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --batch) BATCH=$2; BATCH_SET=1; shift 2 ;;
    --accum) ACCUM=$2; shift 2 ;;
    --steps) STEPS=$2; STEPS_SET=1; shift 2 ;;
    --dp) DP=1; shift ;;
    --tokenize) exec "$BUILD_DIR/bench/tokenize_bench" --threads 2 --rounds "$ROUNDS" ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
if [ "$DP" = 1 ]; then
  DP_ARGS=()
  [ "$ROUNDS_SET" = 1 ] && DP_ARGS+=(--rounds "$ROUNDS")
  [ "$STEPS_SET" = 1 ] && DP_ARGS+=(--steps "$STEPS")
  exec $PY "$HERE/dp_scaling.py" "$BUILD_DIR" "${DP_ARGS[@]}"
fi
if [ "$BERT" = 1 ]; then
  [ "$ROUNDS_SET" = 1 ] || ROUNDS=1
  [ "$STEPS_SET" = 1 ] || STEPS=2
  [ "$CONFIG_SET" = 1 ] || CONFIG=large
  [ "$BATCH_SET" = 1 ] || BATCH=4
  exec "$HERE/bert_table.sh" "$BUILD_DIR" "$CONFIG" "$BATCH" "$ACCUM" "$STEPS" "$ROUNDS" \
       "$CORETYPE" "$SEQ"
fi
if [ "$TABLE" = 1 ]; then
  [ "$ROUNDS_SET" = 1 ] || ROUNDS=3
  case "$ARCH" in gpt2|llama) ;; *) echo "unknown --arch $ARCH (gpt2, llama)" >&2; exit 2 ;; esac
  exec "$HERE/table.sh" "$BUILD_DIR" "$MODEL" "$BATCH" "$ACCUM" "$STEPS" "$ROUNDS" "$CORETYPE" \
       "$ARCH"
fi
BENCH=$BUILD_DIR/bench/gpt2_step_bench
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
runs = {}  # (config, side) -> list of RESULT dicts
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        kv = dict(f.split("=", 1) for f in line.split()[1:])
        runs.setdefault((kv["config"], kv["side"]), []).append(kv)

def best(config, side, key):  # the best round of one side for one metric
    return max(float(r[key]) for r in runs[(config, side)])

def best_row(config, side):  # the round with the best tok/s (its MFU and sgemm go with it)
    return max(runs[(config, side)], key=lambda r: float(r["tok_s"]))

print(f"{'config':8} {'traind tok/s':>13} {'torch tok/s':>12} {'ratio':>7} {'traind MFU':>11} "
      f"{'torch MFU':>10} {'traind tok/CPU-s':>17} {'torch tok/CPU-s':>16} {'ratio':>7} "
      f"{'traind MFU(CPU)':>16} {'torch MFU(CPU)':>15}")
for c in ("tiny", "small"):
    if (c, "traind") not in runs or (c, "torch") not in runs:
        continue
    a, b = best_row(c, "traind"), best_row(c, "torch")
    ca, cb = best(c, "traind", "tok_per_cpu_s"), best(c, "torch", "tok_per_cpu_s")
    print(f"{c:8} {float(a['tok_s']):13.0f} {float(b['tok_s']):12.0f} "
          f"{float(a['tok_s']) / float(b['tok_s']):6.2f}x {100 * float(a['mfu']):10.1f}% "
          f"{100 * float(b['mfu']):9.1f}% {ca:17.0f} {cb:16.0f} {ca / cb:6.2f}x "
          f"{100 * best(c, 'traind', 'mfu_cpu'):15.1f}% {100 * best(c, 'torch', 'mfu_cpu'):14.1f}%")
print("tok/s: the round with the best tok/s of each side; MFU: its model FLOPs/s over the sgemm "
      "1024^3 rate that side measured (best of 10 runs) in the same round. tok/CPU-s: tokens per "
      "process CPU-second, best round of each side; MFU(CPU): model FLOPs per CPU-second over "
      "sgemm FLOPs per CPU-second. The CPU-time columns are distorted less by other processes' "
      "load than wall-clock ones.")
PYEOF
