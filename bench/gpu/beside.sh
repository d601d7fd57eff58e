#!/usr/bin/env bash
# bench/gpu/beside.sh — issue 37's part 1 record: loads beside serving.  Three 8B-shaped
# random checkpoints behind `atlas serve --max-resident 2`: with A and B resident and C
# loading in place of B, A's inter-token p99 during C's load against its p99 without a load
# (done: <= 1.5x), and C's load time beside A's streams against a solo load of C (done:
# <= 1.2x); REPS repetitions of each (bench/gpu/beside.py drives it: standard library).
# Also issue 37's switching target: B's first token for a short request while A streams,
# less the same with A idle (<= 2 ms).
# One device call, from the repository root after the build:
#
#   OUT=/tmp/x [ATLAS_BUILD=build-gpu] bash bench/gpu/beside.sh
#
# The checkpoints (/tmp/llama8b, /tmp/llama8b-b as bench/gpu/pair8b.sh makes them, and
# /tmp/llama8b-c, seed 777) are made when absent or half made (one after another; in /dev/shm,
# linked from /tmp, where /dev/shm has 20 GB free) and read once, so that every load starts
# from the page cache.  `--device cpu` serves the tiny fixtures
# instead (tests/data/tiny-llama3 under three names): a smoke run of the script on a machine
# without a GPU, its figures meaningless.  Knobs: REPS (5), STREAMS (4: A's streams),
# MAX_TOKENS (128 a request), KV_GIB (8 a model), HOST_CACHE (0 GiB: every load reads the
# files from the page cache; 40 puts B's and C's weights in the host tier, so that a load is
# one stream of copies), BUDGET_S (330: the whole script; the
# measuring stops in time and what it has is written).  About 2 minutes with the
# checkpoints in /tmp, 5 with them made.  Results (4 files): $OUT/beside.md (the summary,
# also printed), $OUT/beside.json, $OUT/beside-serve.log (the server's JSON log: each load,
# release and how long it took), $OUT/beside-metrics.txt (/metrics at the end).
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
REPS=${REPS:-5}
STREAMS=${STREAMS:-4}
MAX_TOKENS=${MAX_TOKENS:-128}
KV_GIB=${KV_GIB:-8}
HOST_CACHE=${HOST_CACHE:-0}
BUDGET_S=${BUDGET_S:-330}
PORT=${PORT:-18097}
DEVICE=cuda
[ "${1:-}" = "--device" ] && DEVICE=${2:-cuda}
die() { echo "beside.sh: $*" >&2; exit 2; }
[ -x "$B/atlas" ] || die "no $B/atlas (build first, or set ATLAS_BUILD)"
if [ "$DEVICE" = cpu ]; then
  # the smoke run: one tiny fixture under three names (distinct directories)
  TOK=tests/data/tiny-llama3
  [ -s "$TOK/tokenizer.json" ] || die "$TOK/tokenizer.json missing: run scripts/setup.sh"
  SMOKE=$(mktemp -d /tmp/beside-smoke.XXXXXX)
  for m in a b c; do
    mkdir -p "$SMOKE/$m" && ln -s "$PWD/$TOK"/* "$SMOKE/$m/"
  done
  DIR_A=$SMOKE/a DIR_B=$SMOKE/b DIR_C=$SMOKE/c
  KV_GIB=0.01
  MAX_TOKENS=${MAX_TOKENS_SMOKE:-64}
else
  source scripts/gpu-deps.sh install
  # A and B as bench/gpu/pair8b.sh makes them (the other swap benchmarks reuse them), and C;
  # made one after another (the GPU draws them: three at once need 85 GB, more than an
  # H100 has), their logs in /tmp: $OUT keeps four files
  DIR_A=/tmp/llama8b DIR_B=/tmp/llama8b-b DIR_C=/tmp/llama8b-c
  # a checkpoint is made when it has its config and its index (written after the shards)
  # or one file: else it is half made (a disk that filled) and made again
  made() { [ -f "$1/config.json" ] && { [ -f "$1/model.safetensors.index.json" ] ||
                                        [ -f "$1/model.safetensors" ]; }; }
  for d in "$DIR_A:1234" "$DIR_B:4321" "$DIR_C:777"; do
    dir=${d%:*}
    made "$dir" && continue
    rm -rf "$dir" "/dev/shm/$(basename "$dir")"
    # 16 GB each: in /dev/shm where it has the room, reached through /tmp (what a page-cache
    # hit reads), so that the device's 64 GB disk keeps room for the conformance suite's
    if [ "$(df --output=avail -k /dev/shm | tail -1)" -ge $(( 20 << 20 )) ]; then
      mkdir -p "/dev/shm/$(basename "$dir")" && ln -s "/dev/shm/$(basename "$dir")" "$dir"
    fi
    timeout 300 python3 tools/make_checkpoint.py --shape 8b \
      --seed "${d#*:}" --out "$dir" > "/tmp/make-$(basename "$dir").log" 2>&1
  done
  for dir in "$DIR_A" "$DIR_B" "$DIR_C"; do
    made "$dir" || die "making $dir failed: /tmp/make-$(basename "$dir").log"
    for f in tokenizer.json tokenizer_config.json; do
      [ -f "$dir/$f" ] || cp "tests/data/tiny-llama3/$f" "$dir/"
    done
    cat "$dir"/*.safetensors > /dev/null
  done
fi
LEFT=$(( BUDGET_S - ($(date +%s) - T0) - 20 ))
[ "$LEFT" -gt 30 ] || die "no time left to measure after making the checkpoints"
"$B/atlas" serve --device "$DEVICE" --model a="$DIR_A" --model b="$DIR_B" --model c="$DIR_C" \
  --max-resident 2 --kv-memory "$KV_GIB" --host-cache "$HOST_CACHE" --ctx-size 1024 \
  --parallel "$STREAMS" \
  --log-format json --port "$PORT" > "$OUT/beside-serve.log" 2>&1 &
SRV=$!
# the measure stops itself in time (--budget); timeout is the backstop: its TERM makes it
# write and print what it has
timeout -s TERM "$LEFT" python3 bench/gpu/beside.py "http://127.0.0.1:$PORT" \
  "$OUT/beside-serve.log" "$OUT" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
  --reps "$REPS" --budget $(( LEFT - 15 ))
RC=$?
curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" > "$OUT/beside-metrics.txt" 2>/dev/null ||
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
    "http://127.0.0.1:$PORT/metrics" > "$OUT/beside-metrics.txt" 2>/dev/null
kill "$SRV" 2>/dev/null
wait "$SRV" 2>/dev/null
[ -n "${SMOKE:-}" ] && rm -rf "$SMOKE"
echo "beside.sh: $(( $(date +%s) - T0 )) s; results in $OUT (beside.md, beside.json, beside-serve.log, beside-metrics.txt)"
exit "$RC"
