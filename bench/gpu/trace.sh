#!/usr/bin/env bash
# bench/gpu/trace.sh — a decode step in place (Nsight Systems, graph nodes traced) and the
# decode attention kernel instruction by instruction (Nsight Compute, source page in SASS).
#   ATLAS_BUILD=build-gpu OUT=dir bench/gpu/trace.sh   (after run.sh made /tmp/llama8b;
#   build with -DATLAS_NVCC_FLAGS=-lineinfo for source lines). NCU_K: kernel regexes for ncu
#   (say MODEL=/dev/shm/q2/gptq NCU_K="qgemv1s_int4 qmmp" for a quantized model's GEMVs and its
#   batch's matmuls, with BATCH=16), NCU_COUNT launches of each (default 1); each kernel's
#   instruction mix and stall reasons printed by bench/gpu/sass_mix.py. NSYS=0: ncu only.
B=${ATLAS_BUILD:-build-gpu}
M=${MODEL:-/tmp/llama8b}
OUT=${OUT:-/tmp/atlas-out}
RUN="$B/atlas bench -m $M -p 512 -n 8 --reps 1 --read-gib 1 --gemm 1024 ${BATCH:+--batch $BATCH}"
if [ "${NSYS:-1}" = 1 ] && command -v nsys >/dev/null; then
  timeout 150 nsys profile -o "$OUT/decode" --force-overwrite true --cuda-graph-trace=node -t cuda \
    $RUN > "$OUT/nsys.log" 2>&1; echo "nsys rc $?"
  nsys stats -r cuda_gpu_trace -f csv -o "$OUT/decode" "$OUT/decode.nsys-rep" > /dev/null 2>&1
  python3 bench/gpu/trace_table.py "$OUT"/decode_cuda_gpu_trace.csv | head -30
  rm -f "$OUT/decode.sqlite"
else
  echo "no nsys on this machine"
fi
for k in ${NCU_K:-attn_dcl}; do
  timeout 150 ncu --set full --import-source yes -k regex:"$k" --launch-skip 40 --launch-count "${NCU_COUNT:-1}" \
    -f -o "$OUT/ncu-$k" $RUN > "$OUT/ncu-$k.log" 2>&1; echo "ncu $k rc $?"
  ncu -i "$OUT/ncu-$k.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$k.csv" 2>&1
  ncu -i "$OUT/ncu-$k.ncu-rep" --page details > "$OUT/details-$k.txt" 2>&1
  grep -E "Duration|Elapsed Cycles|Registers|Warp Cycles Per Issued|Executed Instructions  " "$OUT/details-$k.txt" | head -8
  python3 bench/gpu/sass_mix.py "$OUT/sass-$k.csv" > "$OUT/mix-$k.txt" 2>&1; head -40 "$OUT/mix-$k.txt"
done
