#!/bin/sh
# bench/cpu/run.sh [BUILD_DIR] [THREADS] — builds bench/cpu/cpu_decode.c against BUILD_DIR's
# libatlas.a (default: build) and runs it on a ~100M-parameter random Llama that it writes
# once into $ATLAS_BENCH_DIR (default /tmp/atlas-bench-llama100m, ~200 MB).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
threads=${2:-0}
dir=${ATLAS_BENCH_DIR:-/tmp/atlas-bench-llama100m}
mkdir -p "$dir"
cc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v3 -Wall -Wextra -I"$root/include" -I"$root/src" \
   "$root/bench/cpu/cpu_decode.c" "$build/libatlas.a" \
   $(pkg-config --libs jansson libpcre2-8 libutf8proc libmicrohttpd) -lpthread -ldl -lm \
   -o "$dir/cpu_decode"
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
"$dir/cpu_decode" "$dir" "$threads" 64 65
