#!/usr/bin/env bash
# bench/gpu/ab.sh — the same call's A/B of a change: builds the tree with $PATCH reversed (the
# change, made here by `git diff OLD HEAD -- src kernels > .carry/new.patch`) in /tmp/old, then
# alternates `atlas bench` runs of the new build ($ATLAS_BUILD) and the old one, $RUNS each,
# printing each run's decode lines. Needs /tmp/llama8b (bench/gpu/run.sh) and the CUDA libs on
# LD_LIBRARY_PATH.   PATCH=.carry/new.patch ATLAS_BUILD=build-gpu RUNS=3 bench/gpu/ab.sh
set -u
B=${ATLAS_BUILD:-build-gpu}
PATCH=${PATCH:-.carry/new.patch}
RUNS=${RUNS:-3}
MODEL=${MODEL:-/tmp/llama8b}
ARGS=${ARGS:-"-p 512 -n 128 --reps 1 --read-gib 1 --gemm 1024"}
if [ ! -x /tmp/old/b/atlas ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old
  tar --exclude=./build-gpu --exclude=./.carry -cf - . | tar -xf - -C /tmp/old
  (cd /tmp/old && patch -s -R -p1 < "$OLDPWD/$PATCH") || { echo "ab: the patch does not reverse"; exit 1; }
  cmake -S /tmp/old -B /tmp/old/b -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    cmake --build /tmp/old/b -j16 --target atlas > /tmp/old/build.log 2>&1 ||
    { tail -20 /tmp/old/build.log; exit 1; }
fi
for i in $(seq 1 "$RUNS"); do
  for v in new old; do
    bin=$B/atlas; [ $v = old ] && bin=/tmp/old/b/atlas
    echo "== $v run $i"
    $bin bench -m "$MODEL" $ARGS 2>&1 | grep -E "^decode |^decode q|^decode gpu"
  done
done
