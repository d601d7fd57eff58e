#!/usr/bin/env bash
# bench/gpu/portable.sh — the GPU targets check on the H200: build (kernels for sm_80 to
# sm_121 and the compute_80 PTX), `ctest -L gpu`, `atlas info` in both kernel modes, the
# conformance suite's GPU steps in both modes (cuda, serve, cuda-portable, serve-portable),
# and `atlas bench` on the 8B shape in both modes with the ceilings measured in the same run.
# Run from the repository root on the GPU machine, with .carry/debs carried
# (scripts/gpu-deps.sh) and the tokenizers of tests/data/tiny-*:
#
#   OUT=/tmp/x bash bench/gpu/portable.sh
#
# STEPS (default "build tests info conform bench") picks steps; B (build-gpu) is the build.
# Logs in $OUT: build.log, ctest.log, info.log, conformance.md and logs.tar.gz (from
# bench/conformance/run.sh), bench-native.log, bench-portable.log, gpu.txt.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${B:-build-gpu}
STEPS=${STEPS:-"build tests info conform bench"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $(date +%T) (+$(( $(date +%s) - T0 )) s) $*"; }
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# shellcheck disable=SC1091
source scripts/gpu-deps.sh install

if has bench && [ ! -f /tmp/llama8b/config.json ]; then
  step "making the 8B checkpoint in the background"
  python3 tools/make_checkpoint.py --shape 8b --out /tmp/llama8b > "$OUT/make8b.log" 2>&1 &
fi
if has build; then
  step "build ($B)"
  # nvcc --threads 0: a file's eight targets compiled at once
  { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DATLAS_CUDA=ON "-DATLAS_NVCC_FLAGS=--threads;0" &&
    cmake --build "$B" -j"$(nproc)"; } > "$OUT/build.log" 2>&1 || { rc=1; tail -30 "$OUT/build.log"; }
  grep -E "warning|CUDA kernels" "$OUT/build.log" | head -10
fi
if has tests; then
  step "ctest -L gpu"
  timeout 240 ctest --test-dir "$B" -L gpu --output-on-failure > "$OUT/ctest.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|Passed|Skipped|\*\*\*" "$OUT/ctest.log" | head -20
  timeout 60 ctest --test-dir "$B" -R test-cuda-arch --output-on-failure >> "$OUT/ctest.log" 2>&1 || rc=1
fi
if has info; then
  step "atlas info, native and portable"
  for k in native portable; do
    /usr/bin/time -f "%e s" "$B/atlas" info --load --device cuda --kernels $k 2>&1 | grep -E "kernels|backend|s$"
  done | tee "$OUT/info.log"
fi
if has conform; then
  step "conformance suite, GPU steps in both modes"
  STEPS="models cuda cuda-portable serve serve-portable" ATLAS_BUILD=$B OUT=$OUT \
    bash bench/conformance/run.sh > "$OUT/conform.log" 2>&1 || rc=1
  tail -25 "$OUT/conform.log"
fi
if has bench; then
  step "waiting for the 8B checkpoint"
  for _ in $(seq 1 240); do
    [ -f /tmp/llama8b/model.safetensors.index.json ] && ! pgrep -f make_checkpoint >/dev/null && break
    sleep 1
  done
  for k in native portable; do
    step "atlas bench --kernels $k"
    timeout 200 "$B/atlas" bench -m /tmp/llama8b -p 512,2048 -n 128 --kernels $k \
      > "$OUT/bench-$k.log" 2>&1 || rc=1
    grep -E "^(kernels|load |prefill|decode|ratio|read bw|matrix|h2d)" "$OUT/bench-$k.log"
  done
fi
step "done (rc $rc)"
exit $rc
