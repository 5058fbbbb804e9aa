#!/usr/bin/env bash
# bench/run_all.sh BUILD_DIR [--coretype SkylakeX|Haswell|env] [--rounds N] [--config tiny|small|llama_tiny|llama_small|all]
#                            [--dtype fp32|bf16|both] [--seq T]
# bench/run_all.sh BUILD_DIR --table [--arch gpt2|llama] [--model tiny|small] [--batch B]
#                                    [--accum K] [--steps N] [--rounds N] [--coretype ...]
# bench/run_all.sh BUILD_DIR --bert [--config tiny|base|large] [--batch B] [--accum K] [--steps N]
#                                   [--rounds N] [--seq T] [--coretype ...]
# bench/run_all.sh BUILD_DIR [--rounds N] --tokenize   # GPT-2 BPE MB/s vs HF tokenizers, 2 threads
# bench/run_all.sh BUILD_DIR [--rounds N] --packing    # packing vs padding, loss tokens/s, vs PyTorch
# bench/run_all.sh BUILD_DIR [--rounds N] [--steps N] --dp   # data parallel: dp_scaling.py
# Default: the traind GPT-2 training-step bench and its PyTorch peer in the same run, alternating the
# two sides for N rounds (default 3; each side's median round counts), and prints tokens/s, the
# traind/torch ratio and each side's MFU against the GEMM rate of the step's precision it measured
# itself (fp32: sgemm; bf16: bf16 x bf16 -> fp32), for tiny, small, small at T=1024 and the llama
# configs of tiny's and small's sizes (llama_tiny, llama_small), each in fp32 and bf16 (autocast on
# the PyTorch side); --config, --dtype and --seq T (every config at T) narrow it. Both sides: 2 threads, OMP_WAIT_POLICY=PASSIVE (PyTorch's best
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
ROUNDS=3
CONFIG=all
TABLE=0
DP=0
BERT=0
SEQ=0
DTYPES="fp32 bf16"
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
    --dtype) case "$2" in fp32|bf16) DTYPES=$2 ;; both) DTYPES="fp32 bf16" ;;
               *) echo "--dtype $2: fp32, bf16 or both" >&2; exit 2 ;; esac; shift 2 ;;
    --table) TABLE=1; shift ;;
    --model) MODEL=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --batch) BATCH=$2; BATCH_SET=1; shift 2 ;;
    --accum) ACCUM=$2; shift 2 ;;
    --steps) STEPS=$2; STEPS_SET=1; shift 2 ;;
    --dp) DP=1; shift ;;
    --tokenize) exec "$BUILD_DIR/bench/tokenize_bench" --threads 2 --rounds "$ROUNDS" ;;
    --packing) OMP_WAIT_POLICY=PASSIVE exec "$BUILD_DIR/bench/packing_bench" --threads 2 --rounds "$ROUNDS" ;;
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
echo "== traind vs PyTorch, GPT-2 training step ($DTYPES), 2 threads"
echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
     "rounds=$ROUNDS host=$(hostname) cpus=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# config:T (0: the config's own T)
if [ "$SEQ" != 0 ]; then
  CASES="tiny:$SEQ small:$SEQ llama_tiny:$SEQ llama_small:$SEQ"
else
  CASES="tiny:0 small:0 small:1024 llama_tiny:0 llama_small:0"
fi
for ((r = 1; r <= ROUNDS; ++r)); do
  for cs in $CASES; do
    c=${cs%%:*} t=${cs##*:}
    [ "$CONFIG" = all ] || [ "$CONFIG" = "$c" ] || continue
    SEQ_ARGS=()
    [ "$t" != 0 ] && SEQ_ARGS=(--seq "$t")
    for dt in $DTYPES; do
      "$BENCH" --config "$c" --threads 2 --dtype "$dt" "${SEQ_ARGS[@]}" | tee -a "$LOG"
      $PY "$HERE/torch_gpt2_step.py" --config "$c" --threads 2 --dtype "$dt" "${SEQ_ARGS[@]}" \
        | tee -a "$LOG"
    done
  done
done
echo
$PY - "$LOG" <<'PYEOF'
import sys
runs = {}  # (config, T, dtype, side) -> list of RESULT dicts
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        kv = dict(f.split("=", 1) for f in line.split()[1:])
        runs.setdefault((kv["config"], kv["seq"], kv["dtype"], kv["side"]), []).append(kv)

def median(key, side, metric):  # the median round of one side for one metric
    v = sorted(float(r[metric]) for r in runs[key + (side,)])
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])

# Issue 14's targets: fp32 MFU >= 85% (tiny) / 93% (small, its own T); bf16 >= 75% of the bf16
# GEMM rate; every row >= 2x PyTorch eager.
def target(config, T, dtype):
    if dtype == "bf16":
        return 0.75
    return {"tiny": 0.85, "small": 0.93, "llama_tiny": 0.85, "llama_small": 0.93}.get(config) \
        if T in ("128", "256") else None

print(f"{'config':11} {'T':>5} {'dtype':5} {'rounds':>6} {'traind tok/s':>13} {'torch tok/s':>12} {'ratio':>7} "
      f"{'GEMM GF/s':>10} {'traind MFU':>11} {'torch MFU':>10} {'traind MFU(CPU)':>16} "
      f"{'torch MFU(CPU)':>15} {'MFU target':>11} {'ratio>=2':>9}")
ORDER = ["tiny", "small", "llama_tiny", "llama_small"]
keys = sorted({k[:3] for k in runs},
              key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 9, int(k[1]), k[2]))
for key in keys:
    if key + ("traind",) not in runs or key + ("torch",) not in runs:
        continue
    n = min(len(runs[key + ("traind",)]), len(runs[key + ("torch",)]))
    a_tok, b_tok = median(key, "traind", "tok_s"), median(key, "torch", "tok_s")
    ratio = a_tok / b_tok
    mfu = median(key, "traind", "gemm_mfu")
    t = target(*key)
    tgt = "-" if t is None else f"{100 * t:.0f}% {'met' if mfu >= t else 'NOT met'}"
    print(f"{key[0]:11} {key[1]:>5} {key[2]:5} {n:6d} {a_tok:13.0f} {b_tok:12.0f} "
          f"{ratio:6.2f}x {median(key, 'traind', 'gemm_gflops'):10.1f} {100 * mfu:10.1f}% "
          f"{100 * median(key, 'torch', 'gemm_mfu'):9.1f}% "
          f"{100 * median(key, 'traind', 'gemm_mfu_cpu'):15.1f}% "
          f"{100 * median(key, 'torch', 'gemm_mfu_cpu'):14.1f}% {tgt:>11} "
          f"{'met' if ratio >= 2 else 'NOT met':>9}")
print("Every column is the median over the rounds of each side (alternating rounds, one process "
      "per row and side). MFU: model FLOPs/s over the 1024^3 GEMM rate of the step's precision "
      "that side measured (best of 10 runs) in the same process (GEMM GF/s: traind's); MFU(CPU): "
      "model FLOPs per process CPU-second over GEMM FLOPs per CPU-second (the GEMM's CPU time "
      "covers all 10 runs, its wall rate only the best, so this column can exceed 100%: compare it "
      "between the sides only).")
PYEOF
