#!/usr/bin/env bash
# bench/gpu/hosttier.sh — issue 37's part 4 record: swaps between two 8B-shaped models
# (`--max-resident 1`) with their weights in the host tier (`--host-cache 40`: both images
# fit), each swap timed from the request to the incoming model's first token, against the
# host-to-device copy time of B's weight bytes from pinned memory measured first in the same
# call (torch, 256 MiB copies, best of 3); then the same swaps without the tier (page cache)
# for reference.  The done line: every swap to B's first token <= that copy time + 80 ms.
# One device call, from the repository root after the build (ATLAS_BUILD, default build-gpu);
# the checkpoints are made in /tmp when absent (about 2 minutes each).  Results:
# $OUT/hosttier.json, the servers' logs (each load's line says where it read from) and
# their /metrics.
set -u
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
SWAPS=${SWAPS:-6}
source scripts/gpu-deps.sh install
source bench/gpu/pair8b.sh
# B's weights as the device holds them are its safetensors' tensor bytes (bf16 as stored)
COPY_S=$(python3 - /tmp/llama8b-b <<'PY'
import glob, os, sys, time, torch
n = sum(os.path.getsize(f) for f in glob.glob(sys.argv[1] + "/*.safetensors"))
piece = 256 << 20
src = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(piece, dtype=torch.uint8, device="cuda")
best = None
for _ in range(3):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for off in range(0, n, piece):
        dst[: min(piece, n - off)].copy_(src[: min(piece, n - off)], non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    best = t if best is None or t < best else best
print(f"{best:.4f}")
print(f"B: {n / 1e9:.2f} GB copied host to device in {best:.4f} s, {n / best / 1e9:.1f} GB/s",
      file=sys.stderr)
PY
)
echo "copy of B's weights: $COPY_S s" | tee "$OUT/hosttier-copy.txt"
for cache in 40 0; do
  "$B/atlas" serve --model a=/tmp/llama8b --model b=/tmp/llama8b-b --max-resident 1 \
    --ctx-size 4096 --parallel 4 --host-cache "$cache" --port 18096 > "$OUT/hosttier-serve-$cache.log" 2>&1 &
  srv=$!
  for i in $(seq 1 120); do curl -sf localhost:18096/health > /dev/null && break; sleep 0.5; done
  fills=0; [ "$cache" != 0 ] && fills=1 # wait for each first load's image (filled after it)
  echo "host cache $cache GiB: $(python3 bench/gpu/hosttier.py http://localhost:18096 "$COPY_S" "$SWAPS" "$fills")" |
    tee -a "$OUT/hosttier.json"
  curl -s localhost:18096/metrics | grep -E "^atlas_(model_load|host_tier|model_swap)" > "$OUT/hosttier-metrics-$cache.txt"
  # the first two loads (their images filled after them, beside serving); the rest are swaps
  grep -E "loaded in" "$OUT/hosttier-serve-$cache.log" | sed -n '1,2p;$p' 
  kill "$srv"; wait "$srv"
done
