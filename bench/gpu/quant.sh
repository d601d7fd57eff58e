#!/usr/bin/env bash
# bench/gpu/quant.sh — issue 34's benchmark on the GPU machine: one Llama-3.1-8B-shaped random
# checkpoint (tools/make_checkpoint.py) in bf16 and quantized into each layout
# (tools/quant/quantize_torch.py), each through `atlas bench` (decode at batch 1, 16 and 64,
# prefill at 2,048 tokens) in the same call, with the read bandwidth and matrix rate that
# `atlas bench` measures beside each run. Checkpoints in /dev/shm (the disk is 64 GB).
#   STEP=make   makes the checkpoints only (in the background of another call's work)
#   LAYOUTS="fp8-block gptq awq mxfp4 nvfp4" (default), ATLAS_BUILD (default build-gpu)
#   BIG=1       then Llama-3.3-70B's shape in AutoGPTQ's 4-bit layout at full depth (80 layers,
#               38 GB: tools/make_checkpoint.py --quant gptq, written straight at 4 bits) in
#               /dev/shm/l70, decode at batch 1 only; the 8B checkpoints are deleted first
#               when /dev/shm has no room for it beside them
# Out: $OUT/quant-bench.log (every run's output) and quant-bench.md (one row a format).
set -u
OUT=${OUT:-/tmp/atlas-out}
B=${ATLAS_BUILD:-build-gpu}
M=/dev/shm/q8b
LAYOUTS=${LAYOUTS:-"fp8-block gptq awq mxfp4 nvfp4"}
export PYTHONUNBUFFERED=1
source scripts/gpu-deps.sh install
mkdir -p "$OUT" "$M"
args() { case $1 in gptq) echo "--sym";; *) echo;; esac; }  # GPTQ as most are published
make_all() {
  touch $M/.making
  [ -f $M/bf16/config.json ] || python3 tools/make_checkpoint.py --shape 8b --out $M/bf16 \
    || { rm -f $M/.making; return 1; }
  for L in $LAYOUTS; do
    [ -f $M/$L/config.json ] && continue
    # shellcheck disable=SC2046
    python3 tools/quant/quantize_torch.py --layout "$L" --src $M/bf16 --out $M/$L.tmp $(args "$L") \
      > $M/$L.log 2>&1 && mv $M/$L.tmp $M/$L || { echo "quantize $L failed:"; tail -5 $M/$L.log; }
  done
  rm -f $M/.making
}
if [ "${STEP:-}" = make ]; then make_all; exit; fi
for _ in $(seq 200); do [ -f $M/.making ] && sleep 2; done  # a STEP=make still running
make_all
LOG=$OUT/quant-bench.log
: > "$LOG"
{
  echo "| format | GB a token (weights + KV) | decode b1 tok/s | / read bw | b1 int8 x tok/s | b16 step ms | b64 step ms | prefill 2048 tok/s | / matrix | read GB/s | matrix TFLOP/s |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} > "$OUT/quant-bench.md"
g() { grep -E -m1 "$1" /tmp/qb.log | sed -E "$2"; }  # a figure of the last run's output
row() {  # the table's row for $1 from the last run's output, "-" for what it did not measure
  local gb tps rr x8 b16 b64 pf pr bw mx
  gb=$(g "^decode  " 's/.*tok\/s \(([0-9.]+) GB of weights a token, ([0-9.]+) GB of KV.*/\1 + \2/')
  tps=$(g "^decode  " 's/.*ms\/token, ([0-9.]+) tok\/s.*/\1/')
  rr=$(g "decode  [0-9.]+% of read" 's/.*decode  ([0-9.]+%).*/\1/')
  x8=$(g "^decode x8" 's/.*ms\/token, ([0-9.]+) tok\/s.*/\1/')
  b16=$(g "^decode b16" 's/.*after [0-9]+ tokens: ([0-9.]+) ms\/step.*/\1/')
  b64=$(g "^decode b64" 's/.*after [0-9]+ tokens: ([0-9.]+) ms\/step.*/\1/')
  pf=$(g "^prefill  *2048" 's/.*ms +([0-9]+) tok\/s.*/\1/')
  pr=$(g "prefill 2048:" 's/.*2048: ([0-9.]+%).*/\1/')
  bw=$(g "^read bw" 's/read bw +([0-9]+) GB.*/\1/')
  mx=$(g "^matrix" 's/.*cuBLASLt .* ([0-9]+) TFLOP.*/\1/')
  echo "| $1 | $gb | $tps | $rr | ${x8:--} | ${b16:--} | ${b64:--} | ${pf:--} | ${pr:--} | $bw |" \
       "${mx:--} |" >> "$OUT/quant-bench.md"
}
for L in bf16 $LAYOUTS; do
  [ -f $M/$L/config.json ] || continue
  echo "== $L" | tee -a "$LOG"
  timeout 300 "$B/atlas" bench -m $M/$L -p 2048 -n 128 --batch 1,16,64 --read-gib 4 2>&1 \
    | tee /tmp/qb.log >> "$LOG"
  row "$L"
done
if [ "${BIG:-0}" = 1 ]; then
  L70=/dev/shm/l70
  if [ ! -f $L70/config.json ]; then
    [ "$(df --output=avail -B1G /dev/shm | tail -1)" -lt 42 ] && rm -rf "$M"
    python3 tools/make_checkpoint.py --shape llama3.3-70b --quant gptq --out $L70.tmp \
      > $OUT/l70-make.log 2>&1 && mv $L70.tmp $L70 || { echo "70B: make failed:"; tail -5 $OUT/l70-make.log; }
  fi
  if [ -f $L70/config.json ]; then
    echo "== gptq-70b" | tee -a "$LOG"
    timeout 400 "$B/atlas" bench -m $L70 -p 128 -n 64 --batch 1 --read-gib 4 2>&1 \
      | tee /tmp/qb.log >> "$LOG"
    row "gptq-70b (80 layers)"
  fi
fi
cat "$OUT/quant-bench.md"
