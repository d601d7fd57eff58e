#!/usr/bin/env bash
# bench/gpu/families.sh — issue 35's targets in one device call: random checkpoints of the
# published shapes (tools/make_checkpoint.py, written straight into /dev/shm), each through
# `atlas bench -p 128,2048 -n 128 --batch 64 --read-gib 4` (decode at batch 1 and 64 after 132
# tokens, prefill at 2,048, and the read bandwidth and matrix rate of the same run), then
# bench/gpu/families_table.py writes $OUT/families.md: one row a figure with its ceiling,
# ratio, target and met/missed (that script says how each figure is computed). A checkpoint is
# deleted after its run (KEEP=1 keeps it for a second call on the same machine).
#
# Default shapes and depths, with the time each piece should take on an H100/H200 (estimates:
# the writing rate, taken as 2-5 GB/s, is not measured yet; each shape's make.json records it
# and the table's notes print it):
#   gpt-oss-20b    MXFP4 experts, full depth (24), 13.8 GB: make ~5-10 s, bench ~30 s
#   qwen3-30b-a3b  full depth (48), 61.1 GB: make ~15-40 s, bench ~40 s (fewer layers when
#                  /dev/shm or the GPU cannot hold it: the table says "cut from 48 to N")
#   phi-4          10 of 40 layers, 8.9 GB: make ~4 s, bench ~25 s
#   gemma3-27b     12 of 62 (two of each six layers' pattern: 10 local, 2 global), 12.7 GB:
#                  make ~5 s, bench ~25 s
#   gemma3-12b     12 of 48 (10 local, 2 global), 7.4 GB: make ~3 s, bench ~25 s
#   gemma3-1b      full depth (26), 2.0 GB: make ~2 s, bench ~20 s
#   llama3.1-8b    full depth (32), 16.1 GB, the dense 8B beside the MoE for the b64 and
#                  serving rows: make ~6 s, bench ~25 s
#   SERVE=1: qwen3-30b-a3b and llama3.1-8b each under `atlas serve --parallel 64`, driven by
#            bench/serve/loadgen.py at 64 streams, 128 in / 128 out, 128 requests: ~30 s each
# In all ~5-6 min after the build; BUDGET_S (default 480) stops starting new shapes when the
# call's time runs short (their rows say "not run: time budget").
#
#   SHAPES="gpt-oss-20b phi-4"   a subset (any shape of tools/make_checkpoint.py); NAME=DIR
#                                uses the checkpoint in DIR as NAME (not made, not deleted:
#                                a dry run on the CPU with tests/data's small checkpoints)
#   STEP=make                    only makes the checkpoints and keeps them all (room allowing:
#                                later shapes are cut to fit), e.g. in a call before
#   DEPTH=full                   every shape at its published depth; LAYERS_<name> (name
#                                with - and . as _, e.g. LAYERS_gemma3_27b=62) one shape's
#   SERVE=1                      the serving rows (SERVE_SHAPES, default qwen3-30b-a3b
#                                llama3.1-8b); DEVICE=cpu passes --device cpu to both tools
#   MAKE_ARGS="--fill zeros"    sparse all-zero checkpoints (no torch: the make path on a CPU)
#   BENCH_ARGS, MAKE_TIMEOUT (200 s), BENCH_TIMEOUT (150 s), SERVE_TIMEOUT (150 s) a shape,
#   ATLAS_BUILD (build-gpu), CKPT_ROOT (/dev/shm/fam), OUT (/tmp/atlas-out)
# Out: $OUT/families.md; $OUT/families/NAME.{bench.log,config.json,make.json,serve.json,...}.
set -u
OUT=${OUT:-/tmp/atlas-out}
B=${ATLAS_BUILD:-build-gpu}
M=${CKPT_ROOT:-/dev/shm/fam}
SHAPES=${SHAPES:-"gpt-oss-20b qwen3-30b-a3b phi-4 gemma3-27b gemma3-12b gemma3-1b llama3.1-8b"}
BENCH_ARGS=${BENCH_ARGS:-"-p 128,2048 -n 128 --batch 64 --read-gib 4"}
SERVE_SHAPES=${SERVE_SHAPES:-"qwen3-30b-a3b llama3.1-8b"}
BUDGET_S=${BUDGET_S:-480}
DEV=()
[ -n "${DEVICE:-}" ] && DEV=(--device "$DEVICE")
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu-deps.sh
source scripts/gpu-deps.sh install
D=$OUT/families
mkdir -p "$D" "$M"
step() { echo "== $(date +%T) +${SECONDS}s $*"; }

# the depth a shape is made at: LAYERS_<name>, else the default above ("": published)
layers_of() {
  local v
  v="LAYERS_$(echo "$1" | tr -c 'a-zA-Z0-9\n' '_')"
  if [ -n "${!v:-}" ]; then echo "${!v}"; return; fi
  [ "${DEPTH:-}" = full ] && return
  case $1 in phi-4) echo 10 ;; gemma3-27b | gemma3-12b) echo 12 ;; esac
}
# bytes a checkpoint may take: /dev/shm's free space and the GPU's memory, less margins
room() {
  local shm gpu
  shm=$(( $(df -B1 --output=avail "$M" | tail -1) - (4 << 30) ))
  gpu=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1)
  if [ -n "$gpu" ] && [ $(( (gpu << 20) - (10 << 30) )) -lt "$shm" ]; then
    shm=$(( (gpu << 20) - (10 << 30) ))
  fi
  echo "$shm"
}
# makes shape $1 in $M/$1 unless it is there; its summary line in $D/$1.make.json
make_one() {
  local n=$1 dir=$M/$1 t=$2 l
  if [ -f "$dir/config.json" ] && [ -f "$M/$n.make.json" ]; then
    cp "$M/$n.make.json" "$D/$n.make.json"; return 0
  fi
  rm -rf "$dir" "$dir.tmp"
  l=$(layers_of "$n")
  step "making $n (${l:-published} layers, at most $(( $(room) >> 30 )) GiB)"
  # shellcheck disable=SC2086
  if timeout "$t" python3 tools/make_checkpoint.py --shape "$n" --out "$dir.tmp" \
      ${l:+--layers "$l"} --max-bytes "$(room)" ${MAKE_ARGS:-} > "$D/$n.make.log" 2>&1; then
    mv "$dir.tmp" "$dir"
    tail -1 "$D/$n.make.log" | tee "$D/$n.make.json" > "$M/$n.make.json"
    return 0
  fi
  echo "making $n failed or ran past ${t} s: $(tail -1 "$D/$n.make.log")" | tee "$D/$n.skip"
  rm -rf "$dir.tmp"
  return 1
}
# $1 under `atlas serve`, 64 streams of 128 in / 128 out from bench/serve/loadgen.py
serve_one() {
  local n=$1 dir=$2 tok=tests/data/tiny-llama3 port=18090 srv
  case $n in qwen*) tok=tests/data/tiny-qwen3 ;; esac
  if [ ! -f "$dir/tokenizer.json" ]; then  # random checkpoints have none: the family's own
    cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$dir/" || return 1
  fi
  step "atlas serve $n, 64 streams, 128 in / 128 out"
  "$B/atlas" serve --model "m=$dir" "${DEV[@]}" --parallel 64 --ctx-size 512 --port $port \
    > "$D/$n.serve.log" 2>&1 &
  srv=$!
  for _ in $(seq 1 240); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
      2> /dev/null && break
    kill -0 $srv 2> /dev/null || break
    sleep 0.5
  done
  timeout "${SERVE_TIMEOUT:-150}" python3 bench/serve/loadgen.py --url http://127.0.0.1:$port \
    --model m --concurrency 64 --input-len 128 --output-len 128 --requests 128 \
    --json "$D/$n.serve.json" 2>&1 | tee "$D/$n.loadgen.log" | tail -2
  kill $srv 2> /dev/null
  wait $srv 2> /dev/null
}

{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv; } > "$D/gpu.txt" 2>&1
cat "$D/gpu.txt"
df -h "$M" | tail -1
names=()
for s in $SHAPES; do
  n=${s%%=*}
  names+=("$n")
  rm -f "$D/$n".*
  if [ "$s" != "$n" ]; then dir=${s#*=}; else dir=$M/$n; fi
  left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 60 ]; then
    echo "time budget (${BUDGET_S} s) spent" > "$D/$n.skip"; step "$n skipped: time"; continue
  fi
  if [ "$s" = "$n" ]; then
    if [ "${KEEP:-0}" != 1 ] && [ "${STEP:-}" != make ]; then  # room for this one
      for o in "$M"/*/; do [ "$o" = "$dir/" ] || rm -rf "$o" "${o%/}.make.json"; done
    fi
    make_one "$n" $((left - 40 < ${MAKE_TIMEOUT:-200} ? left - 40 : ${MAKE_TIMEOUT:-200})) || continue
  fi
  [ "${STEP:-}" = make ] && continue
  cp "$dir/config.json" "$D/$n.config.json"
  left=$((BUDGET_S - SECONDS))
  step "atlas bench $n ($(grep -o '"num_hidden_layers": [0-9]*' "$dir/config.json"))"
  # shellcheck disable=SC2086
  timeout $((left - 10 < ${BENCH_TIMEOUT:-150} ? left - 10 : ${BENCH_TIMEOUT:-150})) \
    "$B/atlas" bench -m "$dir" $BENCH_ARGS "${DEV[@]}" > "$D/$n.bench.log" 2>&1
  echo "rc $?"
  grep -E "^(decode  |decode b|prefill|read bw|matrix|ratio)" "$D/$n.bench.log"
  if [ "${SERVE:-0}" = 1 ] && [[ " $SERVE_SHAPES " == *" $n "* ]] && [ $((BUDGET_S - SECONDS)) -gt 60 ]; then
    serve_one "$n" "$dir"
  fi
  if [ "$s" = "$n" ] && [ "${KEEP:-0}" != 1 ]; then rm -rf "$dir" "$M/$n.make.json"; fi
done
[ "${STEP:-}" = make ] && exit 0
python3 bench/gpu/families_table.py "$D" "${names[@]}" > "$OUT/families.md"
cat "$OUT/families.md"
step "done"
