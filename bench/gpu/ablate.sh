#!/usr/bin/env bash
# bench/gpu/ablate.sh — what each op costs inside the decode graph, and what the backend's
# diagnostics give: `atlas bench` on the 8B checkpoint with one set of flags at a time
# (--skip-ops leaves ops out of every batch: the time saved is what they cost in place;
# results are wrong). An entry of DECODE / PREFILL may join several flags and their values
# with '+' (--skip-ops+attention+--no-pdl); "none" is the default.
#   ATLAS_BUILD=build-gpu bench/gpu/ablate.sh   (after run.sh made /tmp/llama8b)
B=${ATLAS_BUILD:-build-gpu}
M=${MODEL:-/tmp/llama8b}
DECODE=${DECODE:-"none --no-pdl --skip-ops+attention --skip-ops+norm none"}
PREFILL=${PREFILL:-"none --no-cublaslt --skip-ops+attention"}
for v in $DECODE; do
  f=${v//+/ }
  [ "$v" = none ] && f=
  printf '%-34s ' "$v"
  timeout 60 "$B/atlas" bench -m "$M" -p 512 -n 128 --reps 1 --read-gib 1 --gemm 1024 $f 2>&1 \
    | grep -E "^decode gpu" | sed 's/.*replay //'
done
for v in $PREFILL; do
  f=${v//+/ }
  [ "$v" = none ] && f=
  printf '%-34s ' "$v"
  timeout 60 "$B/atlas" bench -m "$M" -p 2048 -n 2 --read-gib 1 --gemm 1024 $f 2>&1 \
    | grep -E "^prefill" | sed 's/prefill *//'
done
