#!/usr/bin/env bash
# bench/bert_table.sh BUILD_DIR CONFIG BATCH ACCUM STEPS ROUNDS CORETYPE [SEQ]: the memory-anatomy
# guide's BERT experiment, called by `bench/run_all.sh BUILD_DIR --bert`. Every row (baseline,
# accum, ckpt, bf16, adafactor, adamw_8bit, all, mixtral) runs once per round on each side (traind:
# bert_table_bench, PyTorch: torch_bert_table.py, which says where it has no peer: adamw_8bit,
# mixtral), alternating, each in a fresh process so the RSS peak belongs to that row;
# bert_table_summary.py prints the best round. TRAIND_BERT_ROWS="baseline bf16" runs only those
# rows; TRAIND_TABLE_LOG=FILE appends the raw lines there too (bert_table_summary.py FILE... merges).
set -euo pipefail
BUILD_DIR=$1 CONFIG=$2 BATCH=$3 ACCUM=$4 STEPS=$5 ROUNDS=$6 CORETYPE=$7 SEQ=${8:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$BUILD_DIR/bench/bert_table_bench
PY=/usr/bin/python3
[ -x "$BENCH" ] || { echo "missing $BENCH: build the bert_table_bench target" >&2; exit 1; }
$PY -c "import torch" 2>/dev/null || { echo "PyTorch peer needs python3-torch for $PY" >&2; exit 1; }
if [ "$CORETYPE" != env ]; then export OPENBLAS_CORETYPE=$CORETYPE; fi
export OMP_WAIT_POLICY=PASSIVE
ROWS=${TRAIND_BERT_ROWS:-baseline accum ckpt bf16 adafactor adamw_8bit all mixtral dense}
echo "== BERT anatomy table: bert-$CONFIG sequence classification, batch $BATCH per optimizer step" \
     "(accumulation rows: $((BATCH / ACCUM)) x $ACCUM), $STEPS timed steps after 1 warm-up," \
     "2 threads both sides, rows: $ROWS"
echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
     "rounds=$ROUNDS host=$(hostname) cpus=$(nproc) load: $(uptime)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
if [ -n "${TRAIND_TABLE_LOG:-}" ]; then
  echo "== raw lines also appended to $TRAIND_TABLE_LOG"
fi
ARGS=(--config "$CONFIG" --batch "$BATCH" --accum "$ACCUM" --steps "$STEPS" --warmup 1 --threads 2)
[ "$SEQ" = 0 ] || ARGS+=(--seq "$SEQ")
for ((r = 1; r <= ROUNDS; ++r)); do
  for row in $ROWS; do
    echo "# load before $row round $r: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
    "$BENCH" --row "$row" "${ARGS[@]}" | tee -a "$LOG"
    $PY "$HERE/torch_bert_table.py" --row "$row" "${ARGS[@]}" | tee -a "$LOG"
  done
done
echo
echo "load at the end: $(uptime)"
[ -z "${TRAIND_TABLE_LOG:-}" ] || cat "$LOG" >> "$TRAIND_TABLE_LOG"
$PY "$HERE/bert_table_summary.py" "$LOG"
