#!/usr/bin/env bash
# bench/gpu/kvhost.sh — issue 37's part 5 record: a 4,000-token conversation on 8B-shaped
# model A resumed after a swap to B and back (`--max-resident 1`), its next turn's time to
# first token with `--host-cache 8` (its prefix copied back from host memory) and with none
# (prefilled again), beside the same turn while A stayed resident; test-gpu-kvcopy's copy
# rates of the same machine first.  One device call, from the repository root after the build
# (ATLAS_BUILD, default build-gpu); the checkpoints are made in /tmp when absent (about 2
# minutes each).  Results: $OUT/kvhost.json and the servers' logs.
set -u
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
WORDS=${WORDS:-4000}
source scripts/gpu-deps.sh install
"$B/test-gpu-kvcopy" 2>&1 | tee "$OUT/kvcopy.log" | grep -E "blocks|CHECK|ok:"
source bench/gpu/pair8b.sh
for cache in 8 0; do
  "$B/atlas" serve --model a=/tmp/llama8b --model b=/tmp/llama8b-b --max-resident 1 \
    --ctx-size 8192 --parallel 8 --host-cache "$cache" --port 18095 > "$OUT/serve-$cache.log" 2>&1 &
  srv=$!
  for i in $(seq 1 120); do curl -sf localhost:18095/health > /dev/null && break; sleep 0.5; done
  echo "host cache $cache GiB: $(python3 bench/gpu/kvhost.py http://localhost:18095 "$WORDS")" |
    tee -a "$OUT/kvhost.json"
  curl -s localhost:18095/metrics | grep -E "^atlas_kv_host" > "$OUT/metrics-$cache.txt"
  kill "$srv"; wait "$srv"
done
