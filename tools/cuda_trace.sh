#!/bin/sh
# tools/cuda_trace.sh — checks that a change to the GPU path's host code leaves the GPU's work
# as it was, on a machine without a GPU: builds the CUDA backend of OLD_REV (a git worktree)
# and of the working tree against a fake driver (tests/cuda-trace/trace.c says what the trace
# covers and what it cannot prove), runs both through model/forward.c on tiny checkpoints and
# diffs their driver-call logs.
#
#   tools/cuda_trace.sh OLD_REV [OUT_DIR]      e.g. tools/cuda_trace.sh HEAD
#
# Exit 0 when every log is identical. No nvcc needed: the kernels are stand-ins (the fake
# driver never runs them); gcc, jansson, pcre2 and utf8proc as for the CPU build. The harness
# and its fake libraries come from the working tree for both builds. JOBS (default 2) compiles
# in parallel.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 OLD_REV [OUT_DIR]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD_REV=$1
OUT=${2:-$(mktemp -d /tmp/cuda-trace.XXXXXX)}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HARNESS=$ROOT/tests/cuda-trace
CFLAGS="-std=c11 -O1 -g -D_GNU_SOURCE -Wall -Wno-unused-parameter -DATLAS_HAVE_KERNELS -DATLAS_KERNELS_CUDA_VERSION=13000"
LIBS="$(pkg-config --libs jansson libpcre2-8 libutf8proc) -lpthread -ldl -lm"
python3 "$HARNESS/make_hd64.py" "$OUT/hd64"
# Llama 3 (head_dim 8), Qwen3 (q/k norm), Qwen2 (qkv bias), a Llama of head_dim 64
MODELS="$ROOT/tests/data/tiny-llama3 $ROOT/tests/data/tiny-qwen3 $ROOT/tests/data/small/qkv-bias $OUT/hd64"

# the fake libcuda.so.1 (cuLaunchKernelEx) and libcublasLt.so.13
mkdir -p "$OUT/lib"
cc -std=c11 -O1 -fPIC -shared -Wl,-soname,libcuda.so.1 -o "$OUT/lib/libcuda.so.1" "$HARNESS/fake_libs.c"
cc -std=c11 -O1 -fPIC -shared -DFAKE_LT -Wl,-soname,libcublasLt.so.13 -o "$OUT/lib/libcublasLt.so.13" \
   "$HARNESS/fake_libs.c"

# build TREE NAME: the library's objects (no server, no CLI) and the trace program
build() {
    tree=$1; name=$2; obj=$OUT/$name
    mkdir -p "$obj"
    # stand-in kernel images: one per kernels/*.cu, as cmake/kernels.cmake would embed them
    {
        echo '#include "backend/cuda/registry.h"'
        echo 'static const unsigned char img[8] = {0};'
        echo 'static const atlas_kernel_image table[] = {'
        for cu in "$tree"/kernels/*.cu; do
            printf '    {"%s", img, sizeof img},\n' "$(basename "$cu" .cu)"
        done
        echo '};'
        echo 'const atlas_kernel_image *atlas_kernel_image_table(int *count) {'
        echo '    *count = (int)(sizeof table / sizeof *table);'
        echo '    return table;'
        echo '}'
    } > "$obj/kernels_stub.c"
    (cd "$tree" && find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/server/*' | sort) > "$obj/sources"
    sed 's|^\(.*\)$|\1|' "$obj/sources" | JOBS=$JOBS xargs -P "$JOBS" -I{} sh -c \
        'o="$0/$(echo {} | tr / _).o"; cc '"$CFLAGS"' -I"$1/src" -I"$1/include" -c "$1/{}" -o "$o"' \
        "$obj" "$tree"
    cc $CFLAGS -I"$tree/src" -I"$tree/include" -c "$obj/kernels_stub.c" -o "$obj/kernels_stub.o"
    cc $CFLAGS -I"$tree/src" -I"$tree/include" -c "$HARNESS/trace.c" -o "$obj/trace.o"
    cc -rdynamic -o "$obj/trace" "$obj"/*.o -Wl,--no-as-needed "$OUT/lib/libcuda.so.1" -Wl,--as-needed -Wl,-rpath,"$OUT/lib" $LIBS
}

WT=$OUT/old-tree
git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || true
git -C "$ROOT" worktree add --detach "$WT" "$OLD_REV" >/dev/null 2>&1
trap 'git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || true' EXIT
echo "building $OLD_REV ($(git -C "$WT" rev-parse --short HEAD)) and the working tree in $OUT"
build "$WT" old
build "$ROOT" new

status=0
# devices: Hopper (PDL, clusters), pre-Hopper, and Hopper with 2 SMs (several row groups a
# GEMV block: the gemv1c kernels)
for dev in "cc9:--cc 9" "cc8:--cc 8" "sms2:--cc 9 --sms 2"; do
    tag=${dev%%:*}; flags=${dev#*:}
    for side in old new; do
        "$OUT/$side/trace" $flags "$OUT/$side-$tag.txt" $MODELS 2> "$OUT/$side-$tag.err" ||
            { echo "$side ($tag) failed:" >&2; cat "$OUT/$side-$tag.err" >&2; status=1; }
    done
    f=$OUT/new-$tag.txt
    if cmp -s "$OUT/old-$tag.txt" "$f"; then
        echo "$tag: identical ($(wc -l < "$f") calls: $(grep -c '^cuLaunchKernel ' "$f") launches," \
             "$(grep -c '^cuLaunchKernelEx' "$f") with cuLaunchKernelEx, $(grep -c '^cublasLtMatmul' "$f")" \
             "cuBLASLt matmuls, $(grep -c '^cuStreamEndCapture' "$f") graphs captured," \
             "$(grep -c '^cuGraphLaunch' "$f") graph launches)"
    else
        echo "$tag: DIFFERENT (diff $OUT/old-$tag.txt $f):"
        diff "$OUT/old-$tag.txt" "$f" | head -40
        status=1
    fi
done
exit $status
