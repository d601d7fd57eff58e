#!/usr/bin/env bash
# bench/gpu/serve.sh — the serving benchmark in one device call: a Llama-3.1-8B-shaped random
# bf16 checkpoint (tools/make_checkpoint.py, kept in /tmp for a second run) behind
# `atlas serve`, driven by bench/serve/loadgen.py through fixed 128/128 (concurrency 1, 16,
# 64, 256, 512; greedy, then sampled at temperature 0.7, top-p 0.95), 1,024/128 and 128/1,024
# (64 and 256), the mixed and shared-prefix workloads (256) and a Poisson sweep (a quarter,
# half and three quarters of the request rate 128/128 reached at 512); `atlas bench` first
# gives the decode rate at batch 1 and the matrix rate (--gemm) of the same call, from which
# every level's roofline is computed. Each workload runs with its own seed, so that no run's
# prompts are in the prefix cache from another's. Run from the repository root after the build:
#
#   bash bench/gpu/serve.sh [--out DIR] [--build DIR] [--model DIR] [--fp8] [--budget S]
#                           [--parallel N] [--batch-tokens N] [--port N] [--device cuda|cpu]
#
#   --out DIR        where everything goes (default $OUT, else /tmp/atlas-serve): bench.log,
#                    serve*.log, run-*.json / .log (one a workload), metrics-*.txt,
#                    ceilings.json, roofline.json, summary.md (the table) and summary.json
#   --build DIR      the binaries (default $ATLAS_BUILD, else build-gpu)
#   --model DIR      the bf16 checkpoint (default /tmp/llama8b, made when absent)
#   --fp8            also an FP8 (fp8-block) checkpoint of it (tools/quant/quantize_torch.py;
#                    /dev/shm/q8b/fp8-block from bench/gpu/quant.sh when there) through
#                    128/128 at 1 and 512, for the FP8 / bf16 row; about 90 s more
#   --budget S       a workload with less than half its estimate left of S s from the start
#                    is skipped, one running at S is cut, both named in the summary (default
#                    500: the call stays under 9 minutes)
#   --parallel N     the server's --parallel (default 512, the largest level; CPU 16)
#   --batch-tokens N the server's step budget (default 2048: 512 decodes leave 1,536 for
#                    prefill chunks; CPU 512)
#   --device cpu     a smoke run on this machine: the embedded default model, lengths and
#                    concurrencies cut to seconds, the prefill's rate for the matrix rate
#   --only LABELS    only these workloads (comma-separated labels: fixed-greedy,
#                    fixed-sampled, long-prompt, ...), the others named as not asked for
#   --serve-arg A    one more argument for `atlas serve` (repeat it: --serve-arg
#                    --step-ahead --serve-arg off), for an A/B of a server setting
# Needs tests/data/tiny-llama3/tokenizer.json (scripts/gpu-deps.sh fetch packs it; carry
# .carry/tok.tar.xz): the random checkpoints have no tokenizer and Llama 3's has their ids.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-serve}
B=${ATLAS_BUILD:-build-gpu}
M=/tmp/llama8b
FP8=0 BUDGET=500 PARALLEL= BATCH_TOKENS= PORT=18100 DEVICE=cuda ONLY=
SERVE_ARGS=()
die() { echo "serve.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift ;;
    --build) B=$2; shift ;;
    --model) M=$2; shift ;;
    --fp8) FP8=1 ;;
    --budget) BUDGET=$2; shift ;;
    --parallel) PARALLEL=$2; shift ;;
    --batch-tokens) BATCH_TOKENS=$2; shift ;;
    --port) PORT=$2; shift ;;
    --device) DEVICE=$2; shift ;;
    --only) ONLY=",$2,"; shift ;;
    --serve-arg) SERVE_ARGS+=("$2"); shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
  shift
done
case $DEVICE in
  cuda) PARALLEL=${PARALLEL:-512} BATCH_TOKENS=${BATCH_TOKENS:-2048} ;;
  cpu) PARALLEL=${PARALLEL:-16} BATCH_TOKENS=${BATCH_TOKENS:-512} ;;
  *) die "--device cuda|cpu, not $DEVICE" ;;
esac
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source scripts/gpu-deps.sh install
step() { echo "== $(date +%T) (+$(( $(date +%s) - T0 )) s) $*"; }
[ -x "$B/atlas" ] || die "no $B/atlas (build first, or --build DIR)"
URL=http://127.0.0.1:$PORT
LG="python3 bench/serve/loadgen.py"
SKIPPED=()
TOK=tests/data/tiny-llama3
get() { python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())" "$1"; }

# --- the checkpoints ------------------------------------------------------------------------
M8=
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
    --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
  [ -s "$TOK/tokenizer.json" ] || die "$TOK/tokenizer.json missing: carry .carry/tok.tar.xz (scripts/gpu-deps.sh fetch)"
  if [ ! -f "$M/config.json" ]; then
    step "making the 8B checkpoint $M"
    timeout 300 python3 tools/make_checkpoint.py --shape 8b --out "$M" > "$OUT/make8b.log" 2>&1 \
      || die "making the checkpoint failed: $(tail -3 "$OUT/make8b.log")"
  fi
  if [ "$FP8" = 1 ]; then
    M8=/dev/shm/q8b/fp8-block
    if [ ! -f "$M8/config.json" ]; then
      M8=$M-fp8
      step "quantizing to fp8-block: $M8"
      [ -f "$M8/config.json" ] || { timeout 300 python3 tools/quant/quantize_torch.py --layout fp8-block \
        --src "$M" --out "$M8.tmp" > "$OUT/quant-fp8.log" 2>&1 && mv "$M8.tmp" "$M8"; } \
        || { echo "quantizing failed (no FP8 rows): $(tail -3 "$OUT/quant-fp8.log")"; M8=; }
    fi
  fi
  for d in "$M" $M8; do
    [ -f "$d/tokenizer.json" ] || cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$d/"
    cat "$d"/*.safetensors > /dev/null  # page-cached: the loads read memory, not the disk
  done
fi

# --- the ceilings of this call: decode at batch 1 and the matrix rate ------------------------
step "atlas bench"
if [ "$DEVICE" = cuda ]; then
  # 128 decode steps after a 128-token prompt: the contexts a 128/128 stream at concurrency 1 sees
  timeout 240 "$B/atlas" bench -m "$M" -p 128 -n 132 --gemm 8192 --read-gib 4 > "$OUT/bench.log" 2>&1
  CFG=$M/config.json
else
  timeout 120 "$B/atlas" bench --device cpu -p 128 -n 36 --reps 1 > "$OUT/bench.log" 2>&1
  CFG=
fi
grep -E "^(model|device|decode  |prefill|read bw|matrix)" "$OUT/bench.log"
DEV=(); [ "$DEVICE" = cpu ] && DEV=("device=this machine's CPU (a smoke run)")
python3 bench/serve/report.py ceilings "$OUT" "$OUT/bench.log" $CFG "${DEV[@]}" \
  "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "server=--parallel $PARALLEL --batch-tokens $BATCH_TOKENS${SERVE_ARGS[*]:+ ${SERVE_ARGS[*]}}" > /dev/null || die "no ceilings from bench.log"
ROOF=(); [ -f "$OUT/roofline.json" ] && ROOF=(--roofline-from "$OUT/roofline.json")

# --- the server -------------------------------------------------------------------------------
SRV=
serve() {  # serve TAG [--model NAME=DIR]: starts the server, waits for /health
  local tag=$1; shift
  local ctx=4096; [ "$DEVICE" = cpu ] && ctx=1024
  step "atlas serve $* (--parallel $PARALLEL --batch-tokens $BATCH_TOKENS)"
  "$B/atlas" serve "$@" "${SERVE_ARGS[@]}" --device "$DEVICE" --parallel "$PARALLEL" --batch-tokens "$BATCH_TOKENS" \
    --ctx-size "$ctx" --max-connections-per-ip 0 --queue-limit 8192 --port "$PORT" \
    > "$OUT/serve-$tag.log" 2>&1 &
  SRV=$!
  for _ in $(seq 1 360); do get "$URL/health" > /dev/null 2>&1 && break; kill -0 $SRV 2>/dev/null || break; sleep 0.5; done
  kill -0 $SRV 2>/dev/null || { tail -5 "$OUT/serve-$tag.log"; die "the server did not start"; }
  grep -E "kv [0-9]+ tokens" "$OUT/serve-$tag.log" | tail -1
}
unserve() {  # unserve TAG: the server's counters kept, then stopped
  get "$URL/metrics" > "$OUT/metrics-$1.txt" 2>/dev/null
  kill -TERM $SRV; wait $SRV
  tail -2 "$OUT/serve-$1.log"
}
# run LABEL SECONDS SEED ARGS...: one loadgen.py report. SECONDS is an H200's guess: the run
# is skipped when less than half of it is left of --budget, and cut (--deadline: the level
# running then marked cut, the levels after it skipped) at twice it or at the budget
run() {
  local label=$1 est=$2 seed=$3; shift 3
  if [ -n "$ONLY" ] && [[ $ONLY != *",$label,"* ]]; then
    SKIPPED+=("$label (not asked for)"); return
  fi
  local left=$(( BUDGET - RESERVE - ($(date +%s) - T0) ))
  if [ $(( left * 2 )) -lt "$est" ]; then
    echo "skipped $label: ${left} s left, it takes about $est"; SKIPPED+=("$label (time budget: $left s left, about $est s needed)")
    return
  fi
  local cap=$(( est * 2 < left ? est * 2 : left ))
  step "$label (about $est s, cut at $cap s)"
  timeout $(( cap + 60 )) $LG --url "$URL" --model "$MODEL" --label "$label" --seed "$seed" \
    --deadline "$cap" --id-range "$IDS" "${ROOF[@]}" --json "$OUT/run-$label.json" "$@" 2>&1 \
    | tee "$OUT/run-$label.log" | grep -v "^#"
}
# the Poisson rates: fractions of the request rate of the closed-loop level named
rates() {
  python3 -c "
import json, sys
try:
    lv = json.load(open(sys.argv[1]))['levels'][-1]; r = lv['req_s']
except (OSError, ValueError, KeyError, IndexError):
    r = 0
r = r or float(sys.argv[2])  # a level whose every request failed has no rate to sweep under
print(','.join(f'{f * r:.3g}' for f in (0.25, 0.5, 0.75)))" "$OUT/run-fixed-greedy.json" "$1"
}

SAMPLED=(--temperature 0.7 --top-p 0.95)
RESERVE=0
if [ "$DEVICE" = cuda ]; then
  MODEL=llama IDS=1000-30000
  # the FP8 part's time is kept back from the bf16 runs
  [ -n "$M8" ] && RESERVE=50
  serve bf16 --model "llama=$M"
  run fixed-greedy 45 11 --concurrency 1,16,64,256,512 --requests 16,32,128,512,1024
  # sampled: the target's level first; while sampling is done on the host it can be many
  # times slower, and then it is cut at twice its estimate
  run fixed-sampled 40 12 --concurrency 512,256,64,16,1 --requests 1024,512,128,32,16 "${SAMPLED[@]}"
  run long-prompt 35 13 --input-len 1024 --output-len 128 --concurrency 64,256 --requests 128,256
  run long-answer 45 14 --input-len 128 --output-len 1024 --concurrency 64,256 --requests 64,256
  run mixed 25 15 --workload mixed --concurrency 256 --requests 512
  run shared-prefix 30 16 --workload shared-prefix --prefix-len 2000 --concurrency 256 --requests 512
  run poisson 35 17 --rate "$(rates 60)" --rate-seconds 10
  unserve bf16
  if [ -n "$M8" ]; then
    RESERVE=0
    serve fp8 --model "llama=$M8"
    run fp8-fixed-greedy 30 21 --concurrency 1,512 --requests 16,1024
    unserve fp8
  fi
else
  # the smoke form: the same runs, lengths and levels cut to seconds on a CPU
  MODEL=default IDS=100-4000
  serve cpu
  run fixed-greedy 15 11 --input-len 32 --output-len 16 --concurrency 1,4,16 --requests 4,8,32
  run fixed-sampled 15 12 --input-len 32 --output-len 16 --concurrency 16,4,1 --requests 32,8,4 "${SAMPLED[@]}"
  run long-prompt 10 13 --input-len 256 --output-len 16 --concurrency 4 --requests 8
  run long-answer 10 14 --input-len 16 --output-len 128 --concurrency 4 --requests 8
  run mixed 10 15 --workload mixed --mixed-input 16-512 --mixed-output 4-128 --concurrency 8 --requests 16
  run shared-prefix 10 16 --workload shared-prefix --prefix-len 200 --input-len 16 --output-len 16 \
    --concurrency 8 --requests 16
  run poisson 15 17 --rate "$(rates 4)" --rate-seconds 3 --input-len 32 --output-len 16
  unserve cpu
fi

# --- the table ----------------------------------------------------------------------------------
python3 - "$OUT/ceilings.json" "${SKIPPED[@]}" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["skipped"] = sys.argv[2:]
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
step "summary ($OUT/summary.md)"
python3 bench/serve/report.py "$OUT"
step done
