#!/bin/bash
# bench/offload_gpu.sh: training.offload nvme against none on a GPU machine (docs/gpu.md "training.offload
# nvme on the H100"): copy it and the data into .gpu-off/ beside the pack, run from the pack's bin/.
# On the GPU machine, from the unpacked bin/: traind on cuda:0, the same bf16 job with offload none and
# nvme through trainctl, then: are the weights bit-identical, and the tokens/s of each.
R=$1; B=$(pwd); W=$OUT/w; mkdir -p "$W"
cp "$R/.gpu-off/data.txt" "$W/data.txt"  # tinyshakespeare, copied there before packing
for m in none nvme; do
  {
    echo "name: gpu-offload-$m"
    echo "model:"
    echo "  arch: gpt2"
    echo "  config: {vocab_size: 256, n_positions: 256, n_embd: 512, n_layer: 6, n_head: 8}"
    echo "data:"
    echo "  train_file: $W/data.txt"
    echo "  seq_len: 256"
    echo "training:"
    echo "  max_steps: ${STEPS:-60}"
    echo "  per_device_train_batch_size: 16"
    echo "  bf16: true"
    echo "  learning_rate: 1.0e-3"
    echo "  logging_steps: 20"
    echo "  save_steps: 30"
    if [ $m = nvme ]; then echo "  offload: nvme"; echo "  offload_dir: $W/offload-store"; fi
    echo "output_dir: $W/runs/$m"
  } > "$W/$m.yaml"
done
"$B/traind" --state-dir "$W/state" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --device ${DEV:-cuda:0} > "$W/traind.log" 2>&1 &
TPID=$!
for i in $(seq 150); do [ -s "$W/state/ports.json" ] && break; sleep 0.2; done
PORT=$(python3 -c "import json;print(json.load(open('$W/state/ports.json'))['grpc'])")
CTL=("$B/trainctl" --addr 127.0.0.1:$PORT --state-dir "$W/state")
for m in none nvme; do
  id=$("${CTL[@]}" submit "$W/$m.yaml" | head -1 | awk '{print $1}')
  "${CTL[@]}" logs "$id" -f > "$W/$m.logs" 2>&1
  "${CTL[@]}" status "$id" > "$W/$m.status.txt" 2>&1
  "${CTL[@]}" -o json status "$id" > "$W/$m.status.json" 2>&1
  echo "== $m ($id)"; grep -E "state|train_tokens_per_second|peak_memory|offload|plan|error" "$W/$m.status.txt"
done
if cmp -s "$W/runs/none/model.safetensors" "$W/runs/nvme/model.safetensors"; then echo "WEIGHTS BIT-IDENTICAL"; else echo "WEIGHTS DIFFER"; fi
cmp -s "$W/runs/none/checkpoint-60/optimizer.safetensors" "$W/runs/nvme/checkpoint-60/optimizer.safetensors" && echo "OPTIMIZER STATE BIT-IDENTICAL" || echo "OPTIMIZER STATE DIFFERS"
grep -h "offload\|step 60\|done" "$W"/*.logs | head -20
kill $TPID 2>/dev/null; wait
rm -rf "$W/offload-store" "$W/data.txt"
