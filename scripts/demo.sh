#!/usr/bin/env bash
# scripts/demo.sh BUILD_DIR: the whole path on one machine. Starts traind on loopback (free ports,
# state in BUILD_DIR/traind-demo), submits examples/tiny-shakespeare.yaml, follows it to the end with the
# progress bar, prints where the model is, and stops traind. Called by `./run.sh demo`.
# Without ../shared/data/tinyshakespeare.txt it trains on /usr/share/common-licenses and says so.
set -euo pipefail
BUILD_DIR=${1:?usage: scripts/demo.sh BUILD_DIR}
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"   # the example spec's relative paths are relative to the repository root
TRAIND=$BUILD_DIR/server/traind
TRAINCTL=$BUILD_DIR/client/trainctl
STATE=$BUILD_DIR/traind-demo
SPEC=$ROOT/examples/tiny-shakespeare.yaml
DATA=$ROOT/../shared/data/tinyshakespeare.txt

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
for b in "$TRAIND" "$TRAINCTL"; do
  [ -x "$b" ] || { echo "demo: $b is missing; build first (./run.sh build)" >&2; exit 1; }
done
mkdir -p "$STATE"

if [ ! -f "$DATA" ]; then
  say "$DATA is not here: training on the license texts of /usr/share/common-licenses instead"
  cat /usr/share/common-licenses/* > "$STATE/common-licenses.txt"
  sed -e "s#^  train_file: .*#  train_file: $STATE/common-licenses.txt#" \
      -e "s#^output_dir: .*#output_dir: $ROOT/runs/tiny-common-licenses#" \
      -e "s#^name: .*#name: tiny-common-licenses#" "$SPEC" > "$STATE/job.yaml"
  SPEC=$STATE/job.yaml
fi

say "starting traind (state in $STATE)"
rm -f "$STATE/ports.json"
"$TRAIND" --state-dir "$STATE" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  2>>"$STATE/traind.stderr" &
TRAIND_PID=$!
stop() {
  if kill -0 "$TRAIND_PID" 2>/dev/null; then
    say "stopping traind"
    kill -TERM "$TRAIND_PID"
    wait "$TRAIND_PID" || true
  fi
}
trap stop EXIT
for _ in $(seq 1 200); do
  if [ -f "$STATE/ports.json" ] && grep -q "\"pid\":$TRAIND_PID}" "$STATE/ports.json"; then break; fi
  kill -0 "$TRAIND_PID" 2>/dev/null || { echo "demo: traind exited; see $STATE/traind.stderr" >&2; exit 1; }
  sleep 0.1
done
GRPC_PORT=$(sed -E 's/.*"grpc":([0-9]+).*/\1/' "$STATE/ports.json")
METRICS_PORT=$(sed -E 's/.*"metrics":([0-9]+).*/\1/' "$STATE/ports.json")
CTL=("$TRAINCTL" --addr "127.0.0.1:$GRPC_PORT" --state-dir "$STATE")
say "traind is up: gRPC 127.0.0.1:$GRPC_PORT, metrics http://127.0.0.1:$METRICS_PORT/metrics"
"${CTL[@]}" health

say "memory plan (trainctl estimate)"
"${CTL[@]}" estimate "$SPEC"

say "submitting $(basename "$SPEC") and following it (trainctl submit, then trainctl logs -f)"
JOB=$("${CTL[@]}" submit "$SPEC")
echo "$JOB"
"${CTL[@]}" logs "$JOB" -f
say "final status"
"${CTL[@]}" status "$JOB"
STATUS_JSON=$("${CTL[@]}" -o json status "$JOB")
OUT=$(printf '%s' "$STATUS_JSON" | sed -E 's/.*"output_dir":"([^"]+)".*/\1/')
if printf '%s' "$STATUS_JSON" | grep -q '"state":"SUCCEEDED"'; then
  say "the model is in $OUT (config.json + model.safetensors, loadable by HF transformers)"
  # The example model has 64 positions: a 6-byte prompt leaves room for 58 new bytes.
  say "a sample from it (trainctl generate $OUT --prompt 'ROMEO:' --max-new-tokens 58 --temperature 0.8)"
  printf 'ROMEO:'
  "${CTL[@]}" generate "$OUT" --prompt 'ROMEO:' --max-new-tokens 58 --temperature 0.8 --seed 1 ||
    say "generation failed (the model above is unaffected)"
  exit 0
fi
say "the job did not succeed; see its events with: ${CTL[*]} logs $JOB"
exit 1
