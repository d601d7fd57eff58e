#!/usr/bin/env bash
# bench/conformance/run.sh — the conformance suite (issue 23) on the GPU machine, after the
# build; results under $OUT (conformance.md: one row a model, device and prompt length).
#   STEPS="models cuda cpu serve small" (default: models cuda cpu serve)
#   models: the big set's checkpoints in $CONF (tools/conformance/make.py, fixed seeds; kept
#           between steps), each with its stored reference (bench/conformance/refs/NAME/);
#           MAKE_REFS=1 computes the references with transformers instead, into $OUT/refs.
#   cuda:   atlas-conform on the GPU, every model and length, bound 5e-2.
#   cpu:    atlas-conform on the CPU up to CPU_MAX_LEN tokens (default 2,600), bound 2e-3.
#   serve:  atlas serve with every model (--max-resident 1), 8 requests at once a model
#           (bench/conformance/serve_check.py), bound 5e-2.
#   small:  the small-width set and its references (tests/data/small in the repository)
#           made again into $OUT/small, and checked on the CPU.
# Tokenizers: the Llama 3 and Qwen3 tokenizer.json fetched by scripts/setup.sh (carry them),
# tests/data/spm/llama2/tokenizer.json for the Llama 2 and Mistral shapes when it is there.
set -u
OUT=${OUT:-/tmp/atlas-out}
B=${ATLAS_BUILD:-build-gpu}
CONF=${CONF:-/tmp/conf}
STEPS=${STEPS:-"models cuda cpu serve"}
MD=$OUT/conformance.md
mkdir -p "$OUT" "$CONF"
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $(date +%T) $*"; }
export LD_LIBRARY_PATH=$PWD/.carry/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LT=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets -name 'libcublasLt.so.1[23]' 2>/dev/null | head -1)
[ -n "$LT" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$LT")
all_names() { python3 -c "import sys; sys.path.insert(0, 'tools/conformance'); import shapes; print(' '.join(shapes.BIG))"; }
[ -n "${NAMES:-}" ] || NAMES=$(all_names)
TOKS="--tok-llama3 tests/data/tiny-llama3/tokenizer.json --tok-qwen3 tests/data/tiny-qwen3/tokenizer.json"
[ -f tests/data/spm/llama2/tokenizer.json ] && TOKS="$TOKS --tok-llama2 tests/data/spm/llama2/tokenizer.json"
rc=0
echo "| model | device | prompt tokens | max abs Δ logprob (top 8) | result |" > "$MD"
echo "|---|---|---|---|---|" >> "$MD"

if has models; then
  step "checkpoints (MAKE_REFS=${MAKE_REFS:-0}: 1 makes the references too)"
  refs=; [ "${MAKE_REFS:-0}" = 1 ] && refs="--refs $OUT/refs"
  python3 tools/conformance/make.py --set big --out "$CONF" --only "${NAMES// /,}" $TOKS $refs \
    2>&1 | tee "$OUT/make.log" | grep -vE "^  " || rc=1
  if [ "${MAKE_REFS:-0}" != 1 ]; then
    for n in $NAMES; do cp "bench/conformance/refs/$n/reference.safetensors" "$CONF/$n/" || rc=1; done
  fi
  cat "$CONF"/*/*.safetensors > /dev/null
fi
dirs=; for n in $NAMES; do dirs="$dirs $CONF/$n"; done
if has cuda; then
  step "atlas-conform --device cuda"
  "$B/atlas-conform" --device cuda --markdown "$MD" $dirs 2>&1 | tee "$OUT/cuda.log" || rc=1
fi
if has cpu; then
  step "atlas-conform --device cpu, up to ${CPU_MAX_LEN:-2600} tokens"
  "$B/atlas-conform" --device cpu --bound 2e-3 --max-len "${CPU_MAX_LEN:-2600}" --markdown "$MD" \
    $dirs 2>&1 | tee "$OUT/cpu.log" || rc=1
fi
if has serve; then
  step "atlas serve, 8 requests at once a model"
  models=; pairs=; for n in $NAMES; do models="$models --model $n=$CONF/$n"; pairs="$pairs $n=$CONF/$n"; done
  "$B/atlas" serve $models --port 18090 --max-resident 1 --timeout 600 \
    > "$OUT/serve.log" 2>&1 &
  srv=$!
  for i in $(seq 1 120); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18090/health')" 2>/dev/null && break
    sleep 0.5
  done
  python3 bench/conformance/serve_check.py --url http://127.0.0.1:18090 --markdown "$MD" $pairs \
    2>&1 | tee "$OUT/serve-check.log" || rc=1
  kill $srv; wait $srv 2>/dev/null
fi
if has small; then
  step "the small set: checkpoints and references, then the CPU"
  python3 tools/conformance/make.py --set small --out "$OUT/small" --refs "$OUT/small" 2>&1 \
    | tail -3
  "$B/atlas-conform" --device cpu --bound 2e-3 --batch-tokens 16 "$OUT"/small/* 2>&1 \
    | tee "$OUT/small.log" || rc=1
fi
step "done (rc $rc)"
cat "$MD"
exit $rc
