#!/usr/bin/env bash
# bench/gpu/ablate.sh — what each op costs inside the decode graph and each prefill switch:
# `atlas bench` on the 8B checkpoint with one variable set at a time (ATLAS_CUDA_SKIP leaves
# ops out of every batch: the time saved is what they cost in place; results are wrong).
# An entry of DECODE / PREFILL may set several variables joined by '+' (A=1+B=2). The default
# DECODE list also times gemv1c with one item before the wait (EARLY2=0), the one-group
# block kernel gemv1b (NG=0; 4.6% faster than gemv1c on the slower machines until gemv1c's
# buffers were used in turn, 9-10% slower since) and gemv1c over two waves of blocks (NG=w4;
# bench/RESULTS.md, ninth and tenth sessions).
#   ATLAS_BUILD=build-gpu bench/gpu/ablate.sh   (after run.sh made /tmp/llama8b)
B=${ATLAS_BUILD:-build-gpu}
M=${MODEL:-/tmp/llama8b}
DECODE=${DECODE:-"none ATLAS_CUDA_GEMV_EARLY2=0 ATLAS_CUDA_GEMV_NG=0 ATLAS_CUDA_GEMV_NG=w4 ATLAS_CUDA_SKIP=attention ATLAS_CUDA_SKIP=norm none"}
PREFILL=${PREFILL:-"none ATLAS_CUDA_BF16_ACT=0 ATLAS_CUDA_SKIP=attention"}
for v in $DECODE; do
  [ "$v" = none ] && v=ATLAS_NOTHING=1
  printf '%-34s ' "$v"
  env ${v//+/ } timeout 60 "$B/atlas" bench -m "$M" -p 512 -n 128 --reps 1 --read-gib 1 --gemm 1024 2>&1 \
    | grep -E "^decode gpu" | sed 's/.*replay //'
done
for v in $PREFILL; do
  [ "$v" = none ] && v=ATLAS_NOTHING=1
  printf '%-34s ' "$v"
  env ${v//+/ } timeout 60 "$B/atlas" bench -m "$M" -p 2048 -n 2 --read-gib 1 --gemm 1024 2>&1 \
    | grep -E "^prefill" | sed 's/prefill *//'
done
