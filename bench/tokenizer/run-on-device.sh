#!/bin/sh
# bench/tokenizer/run-on-device.sh [CORPUS_DIR] — times atlas's tokenizer and HF `tokenizers`
# on the same corpus, on this machine's CPU, and prints a table of MB/s.  Run from the
# repository root; HF tokenizers is the Python package where installed (the GPU machine), else
# its Node binding from npm (any machine with npm).  It needs, besides
# the repository: the corpus (bench/tokenizer/make-corpus.sh, default corpus/tokenizer: english,
# code and, when present, multilingual, 3 MB each) and the
# two tokenizer.json files (scripts/setup.sh fetches them; git ignores them), so with the
# device tool carry:
#   corpus/tokenizer  tests/data/tiny-llama3/tokenizer.json  tests/data/tiny-qwen3/tokenizer.json
# and, where the machine lacks the -dev packages, .carry/debs (used automatically).
# Builds atlas (Release, CPU only) in $BUILD_DIR (default build-bench).  Writes the raw
# outputs to $OUT when set.
set -eu
corpus=${1:-corpus/tokenizer}
out=${OUT:-${TMPDIR:-/tmp}/atlas-tok-bench}
mkdir -p "$out/ids"
rm -f "$out/table.md"
threads=$(nproc)

for f in "$corpus/english.txt" "$corpus/code.txt" tests/data/tiny-llama3/tokenizer.json \
         tests/data/tiny-qwen3/tokenizer.json; do
    [ -f "$f" ] || { echo "run-on-device.sh: missing $f (see the header of this script)" >&2; exit 1; }
done
# The GPU machine has no -dev packages: scripts/gpu-deps.sh unpacks the carried ones (if any).
if ! pkg-config --exists jansson; then source scripts/gpu-deps.sh install; fi
for m in jansson libpcre2-8 libutf8proc libmicrohttpd; do
    pkg-config --exists "$m" || { echo "run-on-device.sh: pkg-config cannot find $m (apt-get install the -dev package)" >&2; exit 1; }
done
# HF tokenizers: the Python package where it is installed (the GPU machine), else the same Rust
# library through its Node binding from npm (bench/tokenizer/hf_bench.mjs).
if python3 -c "import tokenizers" 2>/dev/null; then
    hf() { python3 bench/tokenizer/hf_bench.py "$@"; }
    hf_version="tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)') (Python)"
else
    [ -d bench/tokenizer/node_modules/tokenizers ] ||
        npm install --silent --no-save --prefix bench/tokenizer tokenizers@0.23.2 >&2 ||
        { echo "run-on-device.sh: neither python3 nor npm can provide HF tokenizers" >&2; exit 1; }
    hf() { node bench/tokenizer/hf_bench.mjs "$@"; }
    hf_version="tokenizers $(node -p "require('./bench/tokenizer/node_modules/tokenizers/package.json').version") (npm, Node binding)"
fi

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "$hf_version, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
build=${BUILD_DIR:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATLAS_CUDA=OFF >/dev/null
cmake --build "$build" -j"$threads" --target atlas_lib >/dev/null
bench=$(bench/tokenizer/build.sh "$build")

files="$corpus/english.txt $corpus/code.txt"
[ -f "$corpus/multilingual.txt" ] && files="$files $corpus/multilingual.txt"
status=0
for model in llama3 qwen3; do
    dir=tests/data/tiny-$model
    # shellcheck disable=SC2086
    "$bench" -t "$threads" --dump-dir "$out/ids" "$dir" $files >"$out/atlas-$model.txt" || status=1
    # shellcheck disable=SC2086
    RAYON_NUM_THREADS=$threads hf --ids-dir "$out/ids" "$dir" \
        $files >"$out/hf-$model.txt" || status=1
    grep -hE "ids identical|IDS DIFFER" "$out/hf-$model.txt" | sed "s/^/$model: /"
    # one row per (file, mode): atlas MB/s, HF MB/s, ratio
    awk -v model="$model" '
        FNR == 1 { src++ }
        $4 == "MB/s" || $1 == "load" {
            key = $1 " " $2; if ($1 == "load") key = "load"
            if (!(key in seen)) { seen[key] = 1; order[n++] = key }
            if (src == 1) a[key] = ($1 == "load") ? $2 : $3; else h[key] = ($1 == "load") ? $2 : $3
        }
        END {
            for (i = 0; i < n; i++) {
                k = order[i]
                if (k == "load") { printf "| %-7s | %-12s | %-9s | %8.3f s | %8.3f s | %5.2fx |\n", model, "load", "", a[k], h[k], (a[k] > 0 ? h[k] / a[k] : 0); continue }
                split(k, p, " ")
                if (!(k in h)) { printf "| %-7s | %-12s | %-9s | %8.2f | %8s | %6s |\n", model, p[1], p[2], a[k], "-", "-"; continue }
                printf "| %-7s | %-12s | %-9s | %8.2f | %8.2f | %5.2fx |\n", model, p[1], p[2], a[k], h[k], (h[k] > 0 ? a[k] / h[k] : 0)
            }
        }' "$out/atlas-$model.txt" "$out/hf-$model.txt" >>"$out/table.md"
done
echo
echo "| model   | file         | mode      | atlas MB/s | HF MB/s | atlas/HF |"
echo "|---------|--------------|-----------|----------|----------|--------|"
cat "$out/table.md"
echo "(load: seconds, ratio HF/atlas; regex: atlas's pre-tokenizer regex alone, the ceiling;"
echo " lines: one encode call per line; lines-Nt: atlas on N pthreads vs HF encode_batch)"
exit $status
