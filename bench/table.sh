#!/usr/bin/env bash
# bench/table.sh BUILD_DIR MODEL BATCH ACCUM STEPS ROUNDS CORETYPE [ARCH]: issue 4's techniques
# table, called by `bench/run_all.sh BUILD_DIR --table [--arch gpt2|llama]` (ARCH default gpt2).
# Every row (baseline, accum, ckpt, bf16, all) runs once per round on each side (traind:
# gpt2_table_bench, PyTorch: torch_gpt2_table.py), each in a fresh process so the RSS peak belongs to that row; table_summary.py prints the best round.
# TRAIND_TABLE_LOG=FILE appends the raw lines there too (table_summary.py FILE... merges runs).
set -euo pipefail
BUILD_DIR=$1 MODEL=$2 BATCH=$3 ACCUM=$4 STEPS=$5 ROUNDS=$6 CORETYPE=$7 ARCH=${8:-gpt2}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$BUILD_DIR/bench/gpt2_table_bench
PY=/usr/bin/python3
[ -x "$BENCH" ] || { echo "missing $BENCH: build the gpt2_table_bench target" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "PyTorch peer needs python3-torch for $PY" >&2; exit 1; }
if [ "$CORETYPE" != env ]; then export OPENBLAS_CORETYPE=$CORETYPE; fi
export OMP_WAIT_POLICY=PASSIVE
if [ "$ARCH" = llama ]; then FAMILY=Llama; else FAMILY=GPT-2; fi
echo "== techniques table: $FAMILY '$MODEL', batch $BATCH per optimizer step (accumulation rows:" \
     "$((BATCH / ACCUM)) x $ACCUM), $STEPS timed steps after 1 warm-up, 2 threads both sides"
echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
     "rounds=$ROUNDS host=$(hostname) cpus=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
if [ -n "${TRAIND_TABLE_LOG:-}" ]; then
  echo "== raw lines also appended to $TRAIND_TABLE_LOG"
fi
ARGS=(--model "$MODEL" --batch "$BATCH" --accum "$ACCUM" --steps "$STEPS" --warmup 1 --threads 2)
[ "$ARCH" = gpt2 ] || ARGS+=(--arch "$ARCH")
for ((r = 1; r <= ROUNDS; ++r)); do
  for row in baseline accum ckpt bf16 all; do
    "$BENCH" --row "$row" "${ARGS[@]}" | tee -a "$LOG"
    $PY "$HERE/torch_gpt2_table.py" --row "$row" "${ARGS[@]}" | tee -a "$LOG"
  done
done
echo
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -z "${TRAIND_TABLE_LOG:-}" ] || cat "$LOG" >> "$TRAIND_TABLE_LOG"
$PY "$HERE/table_summary.py" "$LOG"
