#!/usr/bin/env bash
# bench/gpu/start.sh — issue 37's part 6 record: process start -> first answer of `atlas
# serve` on an 8B-shaped random bf16 checkpoint from the page cache (done line: <= 1.0 s),
# with each phase of the start from the server's log (cli/startup.h): a page-cache read probe
# of the checkpoint (cat twice), N runs (default 5) of start, a one-token completion asked
# until answered, kill; then one run with `--host-cache 40`, whose first load must cost what
# a load without the tier costs (its image is filled after it), and how long after the answer
# the image was kept.  One device call, from the repository root after the build
# (ATLAS_BUILD, default build-gpu); the checkpoint is made in /tmp when absent (about half a
# minute to two).  About 1-3 minutes.  Results: $OUT/start.md (the table), $OUT/start.json,
# $OUT/start-logs.txt.
#   bench/gpu/start.sh               the GPU record
#   bench/gpu/start.sh --device cpu  a smoke run on the CPU with tests/data/tiny-llama3
set -u
OUT=${OUT:-/tmp/atlas-out}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
N=${N:-5}
if [ "${1:-}" = "--device" ] && [ "${2:-}" = "cpu" ]; then
  B=${ATLAS_BUILD:-build}
  M=tests/data/tiny-llama3
  DEV=(--device cpu)
else
  source scripts/gpu-deps.sh install
  M=/tmp/llama8b
  [ -f "$M/config.json" ] || timeout 300 python3 tools/make_checkpoint.py --shape 8b \
    --seed 1234 --out "$M" > "$OUT/make-llama8b.log" 2>&1
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$M/$f" ] || cp "tests/data/tiny-llama3/$f" "$M/"
  done
  DEV=()
fi
for i in 1 2; do # the second read is the page cache's rate
  t0=$(date +%s.%N)
  cat "$M"/*.safetensors > /dev/null
  t1=$(date +%s.%N)
  python3 -c "import glob,os,sys; n=sum(os.path.getsize(f) for f in glob.glob('$M/*.safetensors')); \
t=$t1-$t0; print(f'page-cache probe {sys.argv[1]}: {n/1e9:.2f} GB in {t:.3f} s, {n/t/1e9:.1f} GB/s')" "$i"
done | tee "$OUT/start-probe.txt"
python3 bench/gpu/start.py "$B/atlas" "$M" "$OUT" "$N" "${DEV[@]}" --host-cache 40
rc=$?
cat "$OUT/start-probe.txt" >> "$OUT/start.md" && rm -f "$OUT/start-probe.txt"
exit $rc
