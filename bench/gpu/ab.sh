#!/usr/bin/env bash
# bench/gpu/ab.sh — old and new builds side by side in one device call: decode, prefill and
# the 8B checkpoint's swap load, alternating new and old so that clocks and page cache treat
# both alike. The old tree comes as a tarball made here and carried:
#   git archive OLD -- . ':!tests/data' ':!bench/conformance/refs' | gzip > .carry/old.tar.gz
# It is built in /tmp/old/b (target atlas) unless that exists. Needs /tmp/llama8b
# (tools/make_checkpoint.py --shape 8b); the libraries come from scripts/gpu-deps.sh.
#   OLD_TAR=.carry/old.tar.gz ATLAS_BUILD=build-gpu RUNS=3 bench/gpu/ab.sh
set -u
source scripts/gpu-deps.sh install
B=${ATLAS_BUILD:-build-gpu}
OLD_TAR=${OLD_TAR:-.carry/old.tar.gz}
RUNS=${RUNS:-3}
MODEL=${MODEL:-/tmp/llama8b}
ARGS=${ARGS:-"-p 2048 -n 128 --reps 3 --read-gib 2 --gemm 4096"}
if [ ! -x /tmp/old/b/atlas ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf "$OLD_TAR" -C /tmp/old || exit 1
  cmake -S /tmp/old -B /tmp/old/b -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    cmake --build /tmp/old/b -j16 --target atlas > /tmp/old/build.log 2>&1 ||
    { tail -20 /tmp/old/build.log; exit 1; }
fi
bin() { if [ "$1" = old ]; then echo /tmp/old/b/atlas; else echo "$B/atlas"; fi; }
cat "$MODEL"/*.safetensors > /dev/null  # page-cached for both
for i in $(seq 1 "$RUNS"); do
  for v in new old; do
    echo "== $v run $i: atlas bench $ARGS"
    "$(bin $v)" bench -m "$MODEL" $ARGS 2>&1 | grep -vE "^(model|backend|device|memory) "
  done
done
for i in $(seq 1 "$RUNS"); do
  for v in new old; do
    echo "== $v load run $i: atlas bench --load-only 3"
    "$(bin $v)" bench -m "$MODEL" --load-only 3 2>&1 | grep -vE "^(model|backend|device|memory) "
  done
done
