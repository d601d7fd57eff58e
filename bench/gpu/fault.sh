#!/usr/bin/env bash
# bench/gpu/fault.sh — the fault walk on the GPU (issue 25, part 7): a Release build with
# fault injection and the kernels, then tests/test-fault.c with -d cuda: every allocation, file
# read, device allocation and kernel launch of a request and of a model swap fails once, each
# ending in a clean error or absorbed, with device memory back at its baseline after every
# run; then the same with -a (every hit, not one of each pair of sites) when the first run
# says it fits in the time left. Run from the repository root on the GPU machine, with
# .carry/debs (scripts/gpu-deps.sh) and tests/data/tiny-llama3/tokenizer.json carried:
#
#   OUT=/tmp/x bash bench/gpu/fault.sh
#
# B (build-fault) is the build; BUDGET_S (420) the seconds the whole script may take, so that
# it ends well within 8 minutes. Logs in $OUT: gpu.txt, build.log, fault.log, fault-all.log
# (when -a ran), summary.txt.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${B:-build-fault}
BUDGET_S=${BUDGET_S:-420}
elapsed() { echo $(( $(date +%s) - T0 )); }
step() { echo "== $(date +%T) (+$(elapsed) s) $*"; }
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# shellcheck disable=SC1091
source scripts/gpu-deps.sh install
for f in tests/data/tiny-llama3/tokenizer.json models/default/model.safetensors; do
  [ -s "$f" ] || { echo "missing $f: carry it (scripts/gpu-deps.sh fetch packs the tokenizers)"; exit 1; }
done
export ATLAS_SOURCE_DIR=$PWD ATLAS_TEST_DATA=$PWD/tests/data

step "build ($B: Release, ATLAS_FAULT, kernels)"
# nvcc --threads 0: a file's eight targets compiled at once; only the walk's program is built
{ cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DATLAS_FAULT=ON -DATLAS_CUDA=ON \
    "-DATLAS_NVCC_FLAGS=--threads;0" &&
  cmake --build "$B" -j"$(nproc)" --target test-fault; } > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; step "build failed"; exit 1; }
grep -E "warning|CUDA kernels" "$OUT/build.log" | head -10

step "test-fault -d cuda"
left=$(( BUDGET_S - $(elapsed) ))
t=$(date +%s)
timeout "$left" "$B/test-fault" -d cuda > "$OUT/fault.log" 2>&1
frc=$?
walk_s=$(( $(date +%s) - t ))
# the summary lines, and the first failures
grep -E "^(SKIP|device|warm-up|walk|swap|cuda|ok|FAILED)|not failed|CHECK failed" "$OUT/fault.log" | head -40
case $frc in
  0) ;;
  77) echo "skipped (77): no usable GPU or no fault build"; rc=1 ;;
  124) echo "test-fault -d cuda: timed out after $left s"; rc=1 ;;
  *) echo "test-fault -d cuda: rc $frc (log: $OUT/fault.log)"; rc=1 ;;
esac
echo "test-fault -d cuda: rc $frc, $walk_s s" > "$OUT/summary.txt"

# -a fails every hit: about hits / runs times the walk's runs (the swap part is the same).
if [ "$frc" = 0 ]; then
  hits=$(sed -nE 's/^walk: ([0-9]+) hits.*/\1/p' "$OUT/fault.log" | head -1)
  runs=$(sed -nE 's/^walk: [0-9]+ hits of [0-9]+ distinct sites; ([0-9]+) runs.*/\1/p' "$OUT/fault.log" | head -1)
  est=$(( walk_s * ${hits:-0} / (${runs:-1} > 0 ? ${runs:-1} : 1) + 10 ))
  left=$(( BUDGET_S - $(elapsed) ))
  if [ "${hits:-0}" -gt 0 ] && [ "$est" -lt "$left" ]; then
    step "test-fault -d cuda -a (estimated $est s of $left s left)"
    t=$(date +%s)
    timeout "$left" "$B/test-fault" -d cuda -a > "$OUT/fault-all.log" 2>&1
    arc=$?
    all_s=$(( $(date +%s) - t ))
    grep -E "^(walk|swap|cuda|device memory|ok|FAILED)|not failed|CHECK failed" "$OUT/fault-all.log" | head -40
    [ "$arc" = 0 ] || { echo "test-fault -d cuda -a: rc $arc (log: $OUT/fault-all.log)"; rc=1; }
    echo "test-fault -d cuda -a: rc $arc, $all_s s (estimated $est s)" >> "$OUT/summary.txt"
  else
    echo "-a not run: estimated $est s, $left s left" | tee -a "$OUT/summary.txt"
  fi
fi
step "done (rc $rc)"
cat "$OUT/summary.txt"
exit $rc
