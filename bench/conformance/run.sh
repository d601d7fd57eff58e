#!/usr/bin/env bash
# bench/conformance/run.sh — the conformance suite (issue 23) on the GPU machine, after the
# build. Results in $OUT: conformance.md (the commit, one row a model, device and prompt
# length, the steps' times; its failing rows printed at the end), logs.tar.gz, and with the
# small step small.tar.gz (the small set made again: tests/data/small's models and
# references), with MAKE_REFS=1 refs.tar.gz (bench/conformance/refs). Exit 1 when a row fails.
#   STEPS="models cuda cpu serve small" (default: these; "cuda-portable serve-portable" run
#          the cuda and serve steps again with --kernels portable: the compute_80 PTX with
#          an RTX card's kernel choices)
#   models: the big set's checkpoints in $CONF (tools/conformance/make.py, fixed seeds; kept
#           between calls on a warm machine), each with its stored reference
#           (bench/conformance/refs/NAME/); MAKE_REFS=1 computes the references with
#           transformers instead (and uses those; brought back in refs.tar.gz).
#   cuda:   atlas-conform on the GPU, every model and length, bound 5e-2.
#   cpu:    atlas-conform on the CPU up to CPU_MAX_LEN tokens (default 2,600), bound 2e-3.
#   serve:  atlas serve with every model (--max-resident 1), 8 requests at once a model
#           (bench/conformance/serve_local.sh, serve_check.py), bound 5e-2.
#   small:  the small-width set and its references (tests/data/small in the repository)
#           made again (small.tar.gz; weights compared with the committed ones), and
#           checked on the CPU in 16-token steps, bound 2e-3, and on the GPU, bound 5e-2.
# KV=fp8: every step with an FP8 KV cache (--kv-cache-dtype fp8) against the references made
#   with K and V rounded the same way (reference-kvfp8.safetensors, make.py --kv fp8): the
#   models step makes them (stored ones from bench/conformance/refs/NAME/ where there are, else
#   make.py --kv-only computes them; MAKE_REFS=1 makes both kinds), the small step makes them
#   beside the small set's. The rows' device column ends in -kvfp8. CPU_BOUND (default 2e-3)
#   and GPU_BOUND (5e-2) set the bounds: a rounding that a hair's difference in K flips moves a
#   key by one e4m3 step, which the bf16 GPU path meets more often than the fp32 CPU.
# Each atlas step runs under a time limit (CUDA_TIMEOUT, CPU_TIMEOUT, SERVE_TIMEOUT seconds)
# so that the table is written whatever happens. The commit: `git rev-parse` where the tree
# is a checkout, else $ATLAS_COMMIT.
# Tokenizers: the Llama 3 and Qwen3 tokenizer.json (carry .carry/tok.tar.xz: gpu-deps.sh fetch),
# tests/data/spm/llama2/tokenizer.json for the Llama 2 and Mistral shapes when it is there
# (else a byte-level one: the suite feeds token ids).
set -u
OUT=${OUT:-/tmp/atlas-out}
B=${ATLAS_BUILD:-build-gpu}
CONF=${CONF:-/tmp/conf}
STEPS=${STEPS:-"models cuda cpu serve small"}
KV=${KV:-auto}
case $KV in
  auto) KVARG='' SUF='' REF=reference.safetensors MAKEKV='' ;;
  fp8) KVARG="--kv-cache-dtype fp8" SUF=-kvfp8 REF=reference-kvfp8.safetensors MAKEKV="--kv fp8" ;;
  *) echo "KV=$KV: auto or fp8"; exit 2 ;;
esac
CPU_BOUND=${CPU_BOUND:-2e-3}
GPU_BOUND=${GPU_BOUND:-5e-2}
W=${WORK:-/tmp/conf-work}  # logs and made files; packed into $OUT at the end (the device tool
rm -rf "$W"                # brings back 8 files at most)
MD=$W/conformance.md
ROWS=$W/rows.md
TIMES=$W/times.md
mkdir -p "$OUT" "$CONF" "$W"
OUT=$(cd "$OUT" && pwd)
: > "$ROWS"
: > "$TIMES"
has() { [[ " $STEPS " == *" $1 "* ]]; }
T0=$(date +%s)
t_step=$T0
step() {  # closes the previous step's timing, opens the next
  local now; now=$(date +%s)
  [ -n "${cur:-}" ] && echo "| $cur | $((now - t_step)) s |" >> "$TIMES"
  cur=${1:-}
  t_step=$now
  [ -n "$cur" ] && echo "== $(date +%T) $*"
}
export PYTHONUNBUFFERED=1
source scripts/gpu-deps.sh install
all_names() { python3 -c "import sys; sys.path.insert(0, 'tools/conformance'); import shapes; print(' '.join(shapes.BIG))"; }
[ -n "${NAMES:-}" ] || NAMES=$(all_names)
TOKS="--tok-llama3 tests/data/tiny-llama3/tokenizer.json --tok-qwen3 tests/data/tiny-qwen3/tokenizer.json"
[ -f tests/data/spm/llama2/tokenizer.json ] && TOKS="$TOKS --tok-llama2 tests/data/spm/llama2/tokenizer.json"
[ -f tests/data/spm/gemma3/tokenizer.json ] && TOKS="$TOKS --tok-gemma3 tests/data/spm/gemma3/tokenizer.json"
for t in tests/data/tiny-llama3/tokenizer.json tests/data/tiny-qwen3/tokenizer.json; do
  [ -s "$t" ] || echo "note: $t missing (carry .carry/tok.tar.xz: scripts/gpu-deps.sh fetch): those models get a byte-level tokenizer"
done
COMMIT=$(git rev-parse --short HEAD 2>/dev/null)${ATLAS_COMMIT:+ }${ATLAS_COMMIT:-}
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT (modified)"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
rc=0

if has models; then
  step models "checkpoints (MAKE_REFS=${MAKE_REFS:-0}: 1 makes the references too)"
  refs=; [ "${MAKE_REFS:-0}" = 1 ] && refs="--refs $W/refs $MAKEKV"
  # shellcheck disable=SC2086
  python3 tools/conformance/make.py --set big --out "$CONF" --only "${NAMES// /,}" $TOKS $refs \
    2>&1 | tee "$W/make.log" | grep -vE "^  " || rc=1
  if [ "${MAKE_REFS:-0}" != 1 ]; then
    need=
    for n in $NAMES; do
      cp "bench/conformance/refs/$n/reference.safetensors" "$CONF/$n/" || rc=1
      if [ "$KV" = fp8 ]; then
        cp "bench/conformance/refs/$n/$REF" "$CONF/$n/" 2>/dev/null || need="$need,$n"
      fi
    done
    if [ -n "$need" ]; then  # no stored FP8 references: transformers makes them here
      mkdir -p "$W/refs"
      # shellcheck disable=SC2086
      python3 tools/conformance/make.py --set big --out "$CONF" --only "${need#,}" $TOKS \
        --refs "$W/refs" --kv fp8 --kv-only 2>&1 | tee "$W/make-kv.log" | grep -vE "^  " || rc=1
    fi
  fi
  cat "$CONF"/*/*.safetensors > /dev/null
fi
dirs=; for n in $NAMES; do [ -f "$CONF/$n/$REF" ] && dirs="$dirs $CONF/$n"; done
if has cuda; then
  step cuda "atlas-conform --device cuda"
  # shellcheck disable=SC2086
  timeout "${CUDA_TIMEOUT:-240}" "$B/atlas-conform" --device cuda --bound "$GPU_BOUND" $KVARG \
    --markdown "$ROWS" $dirs 2>&1 | tee "$W/cuda.log" || rc=1
fi
if has cuda-portable; then
  step cuda-portable "atlas-conform --device cuda --kernels portable"
  # shellcheck disable=SC2086
  timeout "${CUDA_TIMEOUT:-240}" "$B/atlas-conform" --device cuda --kernels portable \
    --bound "$GPU_BOUND" $KVARG --markdown "$ROWS" $dirs 2>&1 | tee "$W/cuda-portable.log" || rc=1
fi
if has cpu; then
  step cpu "atlas-conform --device cpu, up to ${CPU_MAX_LEN:-2600} tokens"
  # shellcheck disable=SC2086
  timeout "${CPU_TIMEOUT:-240}" "$B/atlas-conform" --device cpu --bound "$CPU_BOUND" $KVARG \
    --max-len "${CPU_MAX_LEN:-2600}" --markdown "$ROWS" $dirs 2>&1 | tee "$W/cpu.log" || rc=1
fi
if has serve; then
  step serve "atlas serve, 8 requests at once a model"
  # shellcheck disable=SC2086
  SERVE_ARGS="--timeout 600 $KVARG ${SERVE_ARGS:-}" SERVE_LOG=$W/serve.log MARKDOWN=$ROWS \
    LABEL=serve$SUF REFERENCE=$REF \
    timeout "${SERVE_TIMEOUT:-240}" bash bench/conformance/serve_local.sh "$B/atlas" "$GPU_BOUND" \
    $dirs 2>&1 | tee "$W/serve-check.log" || rc=1
fi
if has serve-portable; then
  step serve-portable "atlas serve --kernels portable, 8 requests at once a model"
  # shellcheck disable=SC2086
  SERVE_ARGS="--timeout 600 --kernels portable $KVARG ${SERVE_ARGS:-}" \
    SERVE_LOG=$W/serve-portable.log MARKDOWN=$ROWS LABEL=serve-portable$SUF REFERENCE=$REF \
    timeout "${SERVE_TIMEOUT:-240}" bash bench/conformance/serve_local.sh "$B/atlas" "$GPU_BOUND" \
    $dirs 2>&1 | tee "$W/serve-portable-check.log" || rc=1
fi
if has small; then
  step small "the small set: checkpoints and references made again, then the CPU"
  # shellcheck disable=SC2086
  python3 tools/conformance/make.py --set small --out "$W/small" --refs "$W/small" $MAKEKV \
    > "$W/small-make.log" 2>&1 || { rc=1; tail -5 "$W/small-make.log"; }
  for d in "$W"/small/*; do
    n=$(basename "$d")
    if [ ! -f "tests/data/small/$n/model.safetensors" ]; then
      echo "small/$n: new (not in tests/data/small yet)"
    elif ! cmp -s "$d/model.safetensors" "tests/data/small/$n/model.safetensors"; then
      echo "small/$n: weights DIFFER from tests/data/small/$n"; rc=1
    fi
  done
  # shellcheck disable=SC2086
  timeout 120 "$B/atlas-conform" --device cpu --bound "$CPU_BOUND" --batch-tokens 16 --parallel 4 \
    $KVARG --markdown "$ROWS" "$W"/small/* 2>&1 | tee "$W/small.log" || rc=1
  # shellcheck disable=SC2086
  timeout 120 "$B/atlas-conform" --device cuda --bound "$GPU_BOUND" $KVARG --markdown "$ROWS" \
    "$W"/small/* 2>&1 | tee "$W/small-cuda.log" || rc=1
fi
step
# a model a step ran without a row (it crashed, or the time limit stopped it) fails
for dev in cuda cpu serve cuda-portable serve-portable; do
  has "$dev" || continue
  for n in $NAMES; do
    grep -q "^| $n | $dev$SUF |" "$ROWS" || echo "| $n | $dev$SUF | - | no result (see $dev.log) | **fail** |" >> "$ROWS"
  done
done
grep -q "fail" "$ROWS" && rc=1
{
  echo "Conformance suite (issue 23): commit ${COMMIT:-unknown}, $(date -u '+%Y-%m-%d %H:%M UTC'), ${GPU:-no GPU}, $(nproc) CPU cores."
  [ "$KV" = fp8 ] && echo "KV=fp8: an FP8 (e4m3) KV cache against references with K and V rounded the same way; bounds $CPU_BOUND (CPU) and $GPU_BOUND (GPU, serve)."
  echo "Each cell: the largest |atlas logprob - transformers float32 logprob| over atlas's top 8"
  echo "ids at the first generated position and after each of 16 forced reference tokens"
  echo "(serve: no forcing, positions compared while the greedy tokens agree); bound 5e-2 on"
  echo "the GPU and through serve, 2e-3 on the CPU."
  echo
  echo "| model | device | prompt tokens | max abs Δ logprob (top 8) | result |"
  echo "|---|---|---|---|---|"
  cat "$ROWS"
  echo
  echo "$(grep -c "| pass |" "$ROWS") cells pass, $(grep -c "fail" "$ROWS") fail."
  echo
  echo "| step | time |"
  echo "|---|---|"
  cat "$TIMES"
  echo "| total | $(( $(date +%s) - T0 )) s |"
} > "$MD"
# back from the device: the table, the logs, and what was made that the repository keeps
cp "$MD" "$OUT/"
(cd "$W" && tar czf "$OUT/logs.tar.gz" ./*.log ./*.md)
[ -d "$W/small" ] && tar czf "$OUT/small.tar.gz" -C "$W" small
[ -d "$W/refs" ] && tar czf "$OUT/refs.tar.gz" -C "$W" refs
echo "== done (rc $rc); in \$OUT: $(cd "$OUT" && echo ./*)"
# the table's head, the failing rows and the times (all of it: \$OUT/conformance.md)
sed -n '1,/^|---|/p' "$MD"
grep -F "**fail**" "$MD"
sed -n '/cells pass/,$p' "$MD"
exit $rc
