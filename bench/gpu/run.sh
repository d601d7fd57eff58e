#!/usr/bin/env bash
# bench/gpu/run.sh — one session on the GPU machine (the device tool runs it in the repo root):
# GPU tests, the random checkpoints (tools/make_checkpoint.py), `atlas bench` on the 8B shape
# and transformers on the same checkpoint. Logs go to $OUT. Binaries come prebuilt in
# $ATLAS_BUILD (default build-h6-gpu); the libraries they need come from scripts/gpu-deps.sh.
#   STEPS="ops forward bench bench2 load profile attn batch hf serve" picks steps (default: ops
#   forward bench hf serve); profile, attn and batch time kernels with Nsight Compute; load times
#   the 8B checkpoint's swap load ($LOAD_RUNS processes).  "serve" is issue 6's
#   record: `atlas serve` with two 8B-shaped checkpoints (A = /tmp/llama8b, B = /tmp/llama8b-b,
#   another seed), --max-resident 1, driven by bench/serve/loadgen (Node where there is one,
#   else the Python twin) at concurrency 1/8/64/256, 128 in / 128 out, then swaps A->B->A; the
#   host-to-device rate of the same machine comes from the `atlas bench` run before it.
#   FORWARD_ENV="VAR=value;..." runs test-gpu-forward again with each entry set.
set -u
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-h6-gpu}
STEPS=${STEPS:-"ops forward bench hf serve"}
export ATLAS_TEST_DATA=$PWD/tests/data PYTHONUNBUFFERED=1
# cuBLASLt (optional) is not on the loader's path in every image
source scripts/gpu-deps.sh install
echo "cuBLASLt: ${GPU_DEPS_CUBLASLT:-not found}"
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $(date +%T) $*"; }
# waits up to $1 s for the 8B checkpoint being made in the background
wait_8b() {
  for i in $(seq 1 "$1"); do
    [ -f /tmp/llama8b/model.safetensors.index.json ] && ! pgrep -f make_checkpoint >/dev/null && break
    sleep 1
  done
}

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
  --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
ldd "$B/test-gpu-forward" | grep "not found"
BENCH="$B/atlas"; [ -x "$BENCH" ] || BENCH="$B/atlas-bench"

# the serve step's two models: the 8B checkpoints unless SERVE_A / SERVE_B name others (e.g. the
# fixtures, to try the step on a machine without a GPU)
SERVE_A=${SERVE_A:-/tmp/llama8b}
SERVE_B=${SERVE_B:-/tmp/llama8b-b}
SERVE_CONC=${SERVE_CONC:-1,8,64,256}
if has bench || has bench2 || { has load && [ "${LOAD_MODEL:-/tmp/llama8b}" = /tmp/llama8b ]; } || has hf || has profile || has attn || has batch || { has serve && [ "$SERVE_A" = /tmp/llama8b ]; }; then
  step "making the 8B checkpoint in the background"
  [ -f /tmp/llama8b/config.json ] || (python3 tools/make_checkpoint.py --shape 8b --out /tmp/llama8b \
    > "$OUT/make8b.log" 2>&1 &)
fi
if has forward && [ ! -f /tmp/llama-test/config.json ]; then
  step "making the test checkpoint"
  timeout 120 python3 tools/make_checkpoint.py --shape test --out /tmp/llama-test 2>&1 | tail -2
fi
if has ops; then
  step "test-gpu-ops"
  timeout 120 "$B/test-gpu-ops" > "$OUT/test-gpu-ops.log" 2>&1; rc=$?; echo "rc $rc"
  if [ $rc -ne 0 ] && [ "${SANITIZE:-1}" = 1 ]; then  # SANITIZE=0: not (saves 150 s)
    step "test-gpu-ops under compute-sanitizer (it failed)"
    timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$B/test-gpu-ops" > "$OUT/sanitizer.log" 2>&1
    grep -E "Invalid|ERROR SUMMARY|at 0x|by thread" "$OUT/sanitizer.log" | head -20
  fi
  grep -E "FAIL|CHECK failed|error|graphs|cuBLASLt|passed|checks" "$OUT/test-gpu-ops.log" | head -40
fi
if has forward; then
  step "test-gpu-forward"
  ATLAS_TEST_BIG_MODEL=/tmp/llama-test timeout 240 "$B/test-gpu-forward" > "$OUT/test-gpu-forward.log" 2>&1
  echo "rc $?"
  grep -E "CHECK failed|error|big|p0 |p6 |checks" "$OUT/test-gpu-forward.log" | head -40
  # FORWARD_ENV="A=1 B=2;C=3": again with each entry set (every GPU model of the test on it,
  # e.g. a kernel switch not yet the default), one log each
  IFS=';' read -ra fwd_envs <<< "${FORWARD_ENV:-}"
  for i in "${!fwd_envs[@]}"; do
    step "test-gpu-forward with ${fwd_envs[$i]}"
    env ${fwd_envs[$i]} ATLAS_TEST_BIG_MODEL=/tmp/llama-test timeout 240 "$B/test-gpu-forward" \
      > "$OUT/test-gpu-forward-env$i.log" 2>&1
    echo "rc $?"
    grep -E "CHECK failed|error|big step|checks" "$OUT/test-gpu-forward-env$i.log" | head -20
  done
fi
if has bench || has profile || has attn || has batch; then
  step "waiting for the 8B checkpoint"
  wait_8b 200
  tail -2 "$OUT/make8b.log"
fi
if has bench; then
  step "atlas bench"
  # the board's power and SM clock beside it: decode holds the H200 at its 700 W limit and
  # the clock dips under it (bench/RESULTS.md, sixth session)
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 \
    > "$OUT/smi-bench.csv" 2>/dev/null & SMI=$!
  timeout 240 "$BENCH" bench -m /tmp/llama8b -p 512,2048 -n 128 2>&1 | tee "$OUT/bench-8b.log"
  kill $SMI 2>/dev/null
  awk -F', ' '$3 > 600 { n++; p += $3; if (!lo || $2 < lo) lo = $2 }
    END { if (n) printf "power       %d samples over 600 W: mean %.0f W, SM clock down to %d MHz\n", n, p / n, lo }' \
    "$OUT/smi-bench.csv"
fi
if has bench2; then
  # the backend's diagnostics one at a time (atlas bench flags): PDL, graphs, cuBLASLt off
  for v in ${SWITCHES:-none --no-pdl --no-graphs --no-cublaslt}; do
    step "atlas bench with $v"
    [ "$v" = none ] && v=
    timeout 120 "$BENCH" bench -m /tmp/llama8b -p 512 -n 128 --reps 1 --read-gib 2 $v 2>&1 \
      | grep -E "^decode|ratio +decode" | tee -a "$OUT/bench-8b-switches.log"
  done
fi
if has load; then
  # issue 4's load aim (>= 40 GB/s as a swap, page-cached): each line is one process: a first
  # load, then 3 timed swaps
  step "test-gpu-load (a load and a swap give the same weights)"
  big=; [ -f /tmp/llama-test/config.json ] && big=/tmp/llama-test
  ATLAS_TEST_BIG_MODEL=$big timeout 200 "$B/test-gpu-load" > "$OUT/test-gpu-load.log" 2>&1
  echo "rc $?"
  grep -E "CHECK failed|rror|staged|checks" "$OUT/test-gpu-load.log" | head -20
  LOAD_MODEL=${LOAD_MODEL:-/tmp/llama8b}
  if [ "$LOAD_MODEL" = /tmp/llama8b ]; then step "waiting for the 8B checkpoint"; wait_8b 300; fi
  cat "$LOAD_MODEL"/*.safetensors > /dev/null  # page-cached
  # (each process also times the issue's reference loader over the same files: `load ref`)
  for v in $(seq 1 "${LOAD_RUNS:-3}"); do
    step "atlas bench --load-only 3, process $v"
    timeout 120 "$BENCH" bench -m "$LOAD_MODEL" --load-only 3 2>&1 \
      | grep -E "^load|^ratio +load|^atlas bench|rror" | sed "s|^|[$v] |" | tee -a "$OUT/load-8b.log"
  done
fi
if has profile; then
  # one decode step kernel by kernel (Nsight Compute, clocks left alone): which kernels take
  # the step's time; bench/gpu/ncu_table.py sums the last full step by kernel
  step "ncu: the kernels of decode steps"
  timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    -k regex:'gemv|rope|attn|add_rmsnorm|argmax|embed|gather|kv_store|qk_norm|swiglu' \
    --launch-count 2000 "$BENCH" bench -m /tmp/llama8b -p 512 -n 4 --reps 1 --read-gib 1 --gemm 1024 \
    > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err"; echo "rc $?"
  python3 bench/gpu/ncu_table.py "$OUT/ncu-decode.csv" | tee "$OUT/ncu-decode.txt"
fi
if has attn; then
  # the decode attention kernel alone: where its warps stall (its ~16 us do not follow its
  # instruction count: bench/RESULTS.md 2026-12-03); build with -DATLAS_NVCC_FLAGS=-lineinfo
  # for source lines
  step "ncu: decode attention, warp states and source counters"
  timeout 200 ncu --clock-control none --section WarpStateStats --section SourceCounters \
    --section LaunchStats --section MemoryWorkloadAnalysis -k regex:'attn_d' --launch-skip 40 \
    --launch-count 1 "$BENCH" bench -m /tmp/llama8b -p 512 -n 4 --reps 1 --read-gib 1 --gemm 1024 \
    > "$OUT/ncu-attn.txt" 2>&1; echo "rc $?"
  grep -vE "^==PROF==" "$OUT/ncu-attn.txt" | grep -E "Stall|Cycles|Duration|Throughput|Hit|Sectors" | head -40
fi
if has batch; then
  # decode steps of B sequences at once (the GPU side of the serve step's concurrency levels)
  # (a batch of one first and again last, the lines time-stamped and the board sampled beside
  # them: a one-time slow state — the seventh session's first b1, 0.5 ms a step slower — shows
  # as one b1 line off the other and the single sequence; bench/RESULTS.md)
  step "atlas bench --batch"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 \
    > "$OUT/smi-batch.csv" 2>/dev/null & SMI=$!
  timeout 200 stdbuf -oL "$BENCH" bench -m /tmp/llama8b -p 128 -n 36 --reps 1 --read-gib 1 \
    --gemm 2048 --batch 1,8,64,256,1 2>&1 | grep --line-buffered -E "^decode" \
    | while IFS= read -r l; do echo "$(date +%T.%N | cut -c1-12) $l"; done | tee "$OUT/bench-batch.log"
  kill $SMI 2>/dev/null
  step "ncu: the kernels of decode steps of 8 and 64 sequences"
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-count 6000 "$BENCH" bench -m /tmp/llama8b -p 128 -n 6 --reps 1 --read-gib 1 --gemm 1024 \
    --batch 8,64 > "$OUT/ncu-batch.csv" 2> "$OUT/ncu-batch.err"; echo "rc $?"
  for b in 8 64; do python3 bench/gpu/ncu_table.py "$OUT/ncu-batch.csv" $b | head -16; done | tee "$OUT/ncu-batch.txt"
fi
if has hf; then
  step "transformers"
  timeout 150 python3 bench/gpu/hf_bench.py /tmp/llama8b -p 512 -n 128 2>&1 | tail -3 | tee "$OUT/hf-8b.log"
fi
if has serve; then
  if [ "$SERVE_A" = /tmp/llama8b ]; then
    step "making checkpoint B (8B shape, another seed)"
    wait_8b 300
    [ -f /tmp/llama8b-b/config.json ] || timeout 300 python3 tools/make_checkpoint.py --shape 8b --seed 4321 \
      --out /tmp/llama8b-b > "$OUT/make8b-b.log" 2>&1
    tail -1 "$OUT/make8b-b.log"
  fi
  if ! has bench; then
    step "atlas bench (load and host-to-device rate of this machine)"
    timeout 200 "$BENCH" bench -m "$SERVE_A" -p 128 -n 16 --reps 1 2>&1 | tee "$OUT/bench-h2d.log" | grep -E "load|h2d|read bw"
  fi
  # the random checkpoints have no tokenizer: Llama 3's (the fixture's, same 128,256 ids)
  for d in "$SERVE_A" "$SERVE_B"; do
    [ -f "$d/tokenizer.json" ] || cp tests/data/tiny-llama3/tokenizer.json tests/data/tiny-llama3/tokenizer_config.json "$d/"
  done
  cat "$SERVE_A"/*.safetensors "$SERVE_B"/*.safetensors > /dev/null  # "from page cache"
  step "atlas serve, A and B, --max-resident 1"
  "$BENCH" serve --model "a=$SERVE_A" --model "b=$SERVE_B" --max-resident 1 --parallel 256 \
    --ctx-size 512 --port 18080 > "$OUT/serve.log" 2>&1 &
  srv=$!
  get() { python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
  for i in $(seq 1 120); do get http://127.0.0.1:18080/health >/dev/null 2>&1 && break; sleep 0.5; done
  LG="python3 bench/serve/loadgen.py"; command -v node >/dev/null && LG="node bench/serve/loadgen.mjs"
  echo "load generator: $LG"
  timeout 420 $LG --url http://127.0.0.1:18080 --model a --concurrency "$SERVE_CONC" --input-len 128 \
    --output-len 128 --swap-model b --swaps 3 --json "$OUT/serve.json" 2>&1 | tee "$OUT/loadgen.log"
  get http://127.0.0.1:18080/metrics > "$OUT/metrics.txt"
  kill "$srv"; wait "$srv"
  tail -3 "$OUT/serve.log"
fi
step done
