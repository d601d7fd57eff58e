#!/usr/bin/env bash
# bench/conformance/quant.sh — issue 34's quantized checkpoints at small widths, on the GPU
# machine after the build: tools/conformance/make.py --quant makes each layout of the small
# set's qk-norm (compressed-tensors' INT4 among them) and llama-biases shapes with tools/quant/quantize.py and transformers'
# reference on the weights as that tool dequantizes them; atlas-conform checks them on the GPU
# (bound 5e-2; the INT4 layouts also with --gpu-activations int8, rows "cuda-int8") and the
# CPU (2e-3, 16-token steps). Then tools/quant/quantize_torch.py (the
# quantizer of the big checkpoints) quantizes the same checkpoint: its dequantized weights are
# compared with quantize.py's and atlas runs its files against transformers on its own
# dequantized weights.
# Out: $OUT/quant-conformance.md, $OUT/smallq.tar.gz (the checkpoints and references made,
# for tests/data/small). Exit 1 when a row fails.
set -u
OUT=${OUT:-/tmp/atlas-out}
B=${ATLAS_BUILD:-build-gpu}
Q=${QDIR:-/tmp/sq}
T=/tmp/tq
export PYTHONUNBUFFERED=1
source scripts/gpu-deps.sh install
rm -rf "$Q" "$T"
mkdir -p "$Q" "$T" "$OUT"
rc=0
ROWS=/tmp/quant-rows.md
: > $ROWS
python3 tools/conformance/make.py --set small --out "$Q" --refs "$Q" --only qk-norm --quant \
  "fp8-block:--block 16 16,awq:--group 32,gptq:--group 16 --sym --act-order,gptq-v2:--group 32,ct-int4:--group 32,mxfp4,nvfp4,ct-nvfp4" \
  > /tmp/quant-make.log 2>&1 || { rc=1; tail -20 /tmp/quant-make.log; }
python3 tools/conformance/make.py --set small --out "$Q" --refs "$Q" --only llama-biases --quant \
  "fbgemm,ct-channel,ct-block:--block 16 16" >> /tmp/quant-make.log 2>&1 || { rc=1; tail -20 /tmp/quant-make.log; }
dirs=$(ls -d "$Q"/*-* | grep -v -- "-float$")
# shellcheck disable=SC2086
timeout 200 "$B/atlas-conform" --device cuda --markdown $ROWS $dirs 2>&1 | tail -40 || rc=1
# the INT4 layouts again with int8 activations in the one-row GEMVs (--gpu-activations int8)
# shellcheck disable=SC2086
timeout 200 "$B/atlas-conform" --device cuda --gpu-activations int8 --markdown $ROWS \
  $(echo $dirs | tr ' ' '\n' | grep -E -- "-(awq|gptq|gptq-v2)$") 2>&1 | tail -40 || rc=1
# shellcheck disable=SC2086
timeout 200 "$B/atlas-conform" --device cpu --bound 2e-3 --batch-tokens 16 --parallel 4 \
  --markdown $ROWS $dirs 2>&1 | tail -40 || rc=1
# the torch quantizer against quantize.py: same dequantized weights, same results
for spec in "fp8-block:--block 16 16" "gptq-v2:--group 32" "awq:--group 32" mxfp4 nvfp4; do
  L=${spec%%:*}; args=""; [ "$L" != "$spec" ] && args=${spec#*:}
  D=$T/qk-norm-$L-torch  # its rows in the table: qk-norm-LAYOUT-torch
  # shellcheck disable=SC2086
  python3 tools/quant/quantize_torch.py --layout "$L" --src "$Q/qk-norm" --out "$D" \
    --dequant "$D-float" $args > /tmp/tq.log 2>&1 || { rc=1; tail -5 /tmp/tq.log; continue; }
  # its reference from its own dequantized weights: a code one step off (below) is a weight
  # the other tool's reference does not have, and in FP4 one step is up to a third of it
  python3 - "$D-float" "$T/refs" "qk-norm-$L-torch" <<'EOF' > /tmp/tq-ref.log 2>&1 || { rc=1; tail -5 /tmp/tq-ref.log; }
import sys
sys.path.insert(0, "tools/conformance")
import make, shapes
make.make_refs(sys.argv[3], shapes.SMALL["qk-norm"], sys.argv[1], sys.argv[2], False)
EOF
  cp "$T/refs/qk-norm-$L-torch/reference.safetensors" "$D/" || rc=1
  python3 - "$Q/qk-norm-$L-float/model.safetensors" "$D-float/model.safetensors" <<'EOF' || rc=1
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
# float32 against Python's double can put a value on the other side of a rounding boundary:
# a code one step off here and there is expected, a layout misread is not
n = sum(a[k].numel() for k in a)
off = sum(int(((a[k].float() - b[k].float()).abs() > 1e-6 * a[k].float().abs().max()).sum()) for k in a)
worst = max(float((a[k].float() - b[k].float()).abs().max() / (a[k].float().abs().max() + 1e-30)) for k in a)
print(f"{sys.argv[2]}: dequantized weights vs quantize.py's: {off} of {n} differ, largest by {worst:.2e} of the tensor's largest")
sys.exit(off > n // 200)
EOF
done
# shellcheck disable=SC2086
timeout 200 "$B/atlas-conform" --device cuda --markdown $ROWS $(ls -d $T/*-* | grep -v -- "-float$") \
  2>&1 | tail -20 || rc=1
grep -q fail $ROWS && rc=1
{
  echo "Quantized small checkpoints (bench/conformance/quant.sh): $(grep -c '| pass |' $ROWS) pass, $(grep -c fail $ROWS) fail"
  echo
  echo "| model | device | prompt tokens | max abs Δ logprob (top 8) | result |"
  echo "|---|---|---|---|---|"
  cat $ROWS
} > "$OUT/quant-conformance.md"
(cd "$Q" && tar czf "$OUT/smallq.tar.gz" --exclude='*-float' .)
head -3 "$OUT/quant-conformance.md"
grep -F fail "$OUT/quant-conformance.md" | head -20
exit $rc
