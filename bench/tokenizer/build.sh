#!/bin/sh
# bench/tokenizer/build.sh [BUILD_DIR] — compiles tok-bench against BUILD_DIR/libatlas.a
# (default build-bench, configured and built here as Release if it lacks the library).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-bench}
if [ ! -f "$build/libatlas.a" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATLAS_CUDA=OFF >/dev/null
    cmake --build "$build" -j"$(nproc)" --target atlas_lib >/dev/null
fi
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -I"$root/include" "$root/bench/tokenizer/tok-bench.c" \
    "$build/libatlas.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc libmicrohttpd) \
    -lpthread -ldl -lm -o "$build/tok-bench"
echo "$build/tok-bench"
