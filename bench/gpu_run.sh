#!/usr/bin/env bash
# bench/gpu_run.sh REPO_ROOT [tests|bench|job|profile|all] [...]: the GPU-machine half of docs/gpu.md's runbook.
# Run from the unpacked bin/ of a pack (`bash .gpu/run.sh bash "$PWD/bench/gpu_run.sh" "$PWD" all`):
# the gpu_* tests (gtest XML and logs under $OUT), then gpt2_step_bench --device cuda:0 beside its
# PyTorch eager peer (bench/torch_gpu_step.py) on the same GPU, cuBLASLt epilogues on and off,
# graphs on and off, and the bf16 GEMM peak for MFU; a whole job through traind-run --device cuda:0
# on tinyshakespeare (DATA, default REPO_ROOT/.gpu/data/tinyshakespeare.txt); prints one table at
# the end.
set -u
REPO=${1:?usage: gpu_run.sh REPO_ROOT [tests|bench|all]}
WHAT=${2:-all}
has() { [ "$WHAT" = all ] || [[ ",$WHAT," == *",$1,"* ]]; }  # WHAT: all or a comma list
# Logs go to a scratch folder; at the end $OUT gets summary.txt and logs.tar.gz (the device tool
# brings back at most 8 files).
RESULTS=${OUT:-/tmp/gpu_out}
OUT=$(mktemp -d -t traind-gpu-logs-XXXXXX)
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
CONFIG=${GPU_BENCH_CONFIG:-gpt2}
STEPS=${GPU_BENCH_STEPS:-20}
summary=$OUT/summary.txt
: > "$summary"

if has tests; then
  # gpu_attention_tc_test first: the tensor-core attention against the CPU on this GPU (the 16-bit
  # step's timings below mean something only if it passes) and its fwd+bwd TFLOP/s line; then
  # gpu_cudnn_sdpa_test: cuDNN's fused SDPA self-checked against that kernel and both timed
  # (TIMING cudnn_sdpa_forward lines: what decides whether TRAIND_CUDNN_SDPA=1 is worth setting).
  seen=" "
  for t in ./gpu_attention_tc_test ./gpu_cudnn_sdpa_test ./gpu_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    case "$seen" in *" $name "*) continue ;; esac
    seen="$seen$name "
    start=$(date +%s)
    timeout 150 "$t" --gtest_output="xml:$OUT/$name.xml" > "$OUT/$name.log" 2>&1
    rc=$?
    passed=$(grep -c '^\[       OK \]' "$OUT/$name.log")
    failed=$(grep -c '^\[  FAILED  \]' "$OUT/$name.log")
    echo "TEST $name rc=$rc ok=$passed failed_lines=$failed seconds=$(( $(date +%s) - start ))" | tee -a "$summary"
    grep '^\[  FAILED  \]' "$OUT/$name.log" | sort -u | head -20 | tee -a "$summary"
    grep '^TIMING ' "$OUT/$name.log" | tee -a "$summary"
  done
fi

if has job; then
  data=${DATA:-$REPO/.gpu/data/tinyshakespeare.txt}
  cat > "$OUT/gpu-job.yaml" <<JOB
name: gpu-shakespeare
model:
  arch: gpt2
  config: {vocab_size: 256, n_positions: 1024, n_embd: 768, n_layer: 12, n_head: 12}
data: {train_file: $data, format: text, tokenizer: byte, seq_len: 512, validation_split: 0.02}
training:
  max_steps: 300
  per_device_train_batch_size: 16
  learning_rate: 6.0e-4
  warmup_steps: 30
  weight_decay: 0.1
  bf16: true
  logging_steps: 50
  eval_steps: 300
  save_steps: 300
  seed: 42
output_dir: /tmp/gpu-job
JOB
  start=$(date +%s)
  timeout 200 ./traind-run --device cuda:0 "$OUT/gpu-job.yaml" > "$OUT/gpu-job.log" 2>&1
  rc=$?
  echo "JOB traind-run --device cuda:0 rc=$rc seconds=$(( $(date +%s) - start ))" | tee -a "$summary"
  tail -n 12 "$OUT/gpu-job.log" | tee -a "$summary"
  ls -la /tmp/gpu-job 2>&1 | tail -n 6 >> "$summary"
fi

if has profile; then
  # Per-op device time (each op synchronised; graphs and fused epilogues off through the decorator).
  for dt in bf16 fp32; do
    timeout 120 ./gpt2_step_bench --device cuda:0 --config "$CONFIG" --dtype $dt --steps 3 --warmup 1 \
      --profile > "$OUT/profile-$dt.log" 2>&1
    echo "PROFILE $dt rc=$?" | tee -a "$summary"
    grep -A40 '  op ' "$OUT/profile-$dt.log" | head -40 | tee -a "$summary"
  done
fi

if has bench; then
  log=$OUT/bench.log
  : > "$log"
  "$PY" "$REPO/bench/torch_gpu_step.py" --peak 2>&1 | tee -a "$log"
  peak=$(grep -o 'bf16_matmul_8192_tflops=[0-9.]*' "$log" | tail -1 | cut -d= -f2)
  traind() {  # label, env, args...
    local label=$1 envs=$2; shift 2
    echo "== traind $label ($envs $*)" >> "$log"
    timeout 120 env $envs ./gpt2_step_bench --device cuda:0 --config "$CONFIG" --steps "$STEPS" --warmup 3 "$@" > "$OUT/one.log" 2>&1
    cat "$OUT/one.log" >> "$log"
    local r; r=$(grep '^RESULT side=traind' "$OUT/one.log" | tail -1)
    echo "ROW traind $label $r" >> "$log.rows"
  }
  torchpeer() {
    local label=$1; shift
    echo "== torch $label ($*)" >> "$log"
    timeout 120 "$PY" "$REPO/bench/torch_gpu_step.py" --config "$CONFIG" --steps "$STEPS" "$@" > "$OUT/one.log" 2>&1
    cat "$OUT/one.log" >> "$log"
    local r; r=$(grep '^RESULT side=torch' "$OUT/one.log" | tail -1)
    echo "ROW torch $label $r" >> "$log.rows"
  }
  : > "$log.rows"
  # Alternate sides so drift in clocks hits both alike.
  traind bf16 "TRAIND_CUBLASLT_EPILOGUES=1" --dtype bf16
  torchpeer bf16-sdpa --precision bf16 --attn sdpa
  traind bf16-noepilogue "TRAIND_CUBLASLT_EPILOGUES=0" --dtype bf16
  torchpeer bf16-math --precision bf16 --attn math
  traind bf16-nographs "TRAIND_CUBLASLT_EPILOGUES=1" --dtype bf16 --no-graphs
  torchpeer bf16-sdpa-fused --precision bf16 --attn sdpa --optim fused
  traind tf32 "TRAIND_CUBLASLT_EPILOGUES=1" --dtype fp32 --tf32
  torchpeer tf32-sdpa --precision tf32 --attn sdpa
  traind fp32 "TRAIND_CUBLASLT_EPILOGUES=1" --dtype fp32
  torchpeer fp32-sdpa --precision fp32 --attn sdpa
  traind fp32-noepilogue "TRAIND_CUBLASLT_EPILOGUES=0" --dtype fp32
  traind bf16-again "TRAIND_CUBLASLT_EPILOGUES=1" --dtype bf16
  # The same tokens per step at T=256 (B=32): attention's share is a quarter.
  traind bf16-T256-B32 "TRAIND_CUBLASLT_EPILOGUES=1" --dtype bf16 --seq 256 --batch 32
  torchpeer bf16-sdpa-T256-B32 --precision bf16 --attn sdpa --seq 256 --batch 32
  {
    echo "config=$CONFIG steps=$STEPS bf16 peak ${peak:-?} TFLOP/s (torch.matmul 8192^3, same run)"
    printf '%-8s %-20s %12s %10s %12s %8s %8s\n' side row tok/s step_ms model_TFLOP/s MFU loss
    while read -r _ side label rest; do
      tok=$(echo "$rest" | grep -o 'tok_s=[0-9.]*' | cut -d= -f2)
      ms=$(echo "$rest" | grep -o 'step_ms=[0-9.]*' | cut -d= -f2)
      tf=$(echo "$rest" | grep -o 'model_tflops=[0-9.]*' | cut -d= -f2)
      loss=$(echo "$rest" | grep -o 'loss=[0-9.na]*' | cut -d= -f2)
      mfu=$(awk -v a="${tf:-0}" -v b="${peak:-0}" 'BEGIN{ if (b > 0) printf "%.1f%%", 100*a/b; else print "?" }')
      printf '%-8s %-20s %12s %10s %12s %8s %8s\n' "$side" "$label" "${tok:-FAILED}" "${ms:--}" "${tf:--}" "$mfu" "${loss:--}"
    done < "$log.rows"
  } | tee -a "$summary"
  rm -f "$OUT/one.log"
fi

cp "$summary" "$RESULTS/summary.txt"
tar -C "$OUT" -czf "$RESULTS/logs.tar.gz" .
