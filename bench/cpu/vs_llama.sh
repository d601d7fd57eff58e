#!/usr/bin/env bash
# bench/cpu/vs_llama.sh [--rounds N] [--threads T] [--cache DIR] [--build DIR] [--only A,B]
# bench/cpu/vs_llama.sh --table RUNS.tsv   (the table again from a run's raw figures, or
#                                           from the rounds an interrupted run finished)
#
# atlas against llama.cpp on the CPU, same weights, side by side: a benchmark, not a test.
# Builds llama.cpp from a pinned source, makes one random checkpoint of Qwen3-0.6B's shape
# (bench/cpu/make_qwen3.py) in six forms, then runs, alternated, N rounds (default 5) of
#   llama-bench -m X.gguf -t T -p 128,512 -n 128 -r 1 -o jsonl
#   atlas bench -m DIR --device cpu --threads T -p 128,512 -n 128 --reps 1 [--cpu-activations A]
# each under /usr/bin/time for its peak RSS, and prints the medians (with ranges) and the
# ratios atlas / llama.cpp (above 1 is atlas faster; for RSS, above 1 is atlas larger):
#   bf16 weights: llama.cpp's BF16 GGUF against atlas's bf16 safetensors, fp32 and bf16
#     activations;
#   INT4 weights: llama-quantize's Q4_0 (its default for a tied embedding: Q6_K), and Q4_0
#     with the embedding and output head left bf16 (the same bytes a token as the GPTQ
#     checkpoint) against AutoGPTQ's 4-bit layout, group 128, asymmetric
#     (bench/cpu/to_gptq.py; the embedding and tied lm_head stay bf16, as published GPTQ
#     checkpoints keep them), with fp32 and int8 activations (llama.cpp's Q8_0 scheme);
#     and the same GPTQ checkpoint with its output head quantized too (to_gptq.py --lm-head,
#     GPTQModel's lm_head option: 4 bits a weight, where llama-quantize's default head is
#     Q6_K's 6.6) against the default Q4_0, int8 activations.
# atlas's decode is the median of 3 runs of 124 steps after its first prompt (128 tokens);
# llama-bench's tg128 is 128 steps from an empty context.
#
# The source: npm's node-llama-cpp@3.22.1 carries llama.cpp as a git bundle
# (package/llama/gitRelease.bundle, llama.cpp commit $PIN below); it is cloned and built with
# cmake (Release, GGML_NATIVE, no OpenSSL, only llama-bench and llama-quantize: about 20
# minutes on 2 cores). The GGUF files are written by bench/cpu/to_gguf.py with the bundle's
# gguf-py, which needs numpy: Debian's python3-numpy, and /usr/bin/time (Debian's time), both
# installed with apt-get when missing.
#
# Everything is cached in DIR (default /tmp/atlas-vs-llama, about 4 GB): the npm tarball,
# llama.cpp's tree and build, qwen3-bf16/ (safetensors), qwen3-bf16.gguf, qwen3-q4_0.gguf,
# qwen3-q4_0-bf16head.gguf, qwen3-gptq/, qwen3-gptq-head/, and each run's raw figures in
# runs-DATE.tsv; a step whose output is there is skipped (delete DIR or a file to redo it).
# --build is atlas's build folder (default build); --only runs just the named runs of the
# eight (say llama-q4_0,atlas-gptq-int8act).
# The machine should be otherwise idle: on a shared one the figures say only that it works.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=5 threads=2 cache=/tmp/atlas-vs-llama build=$root/build table="" only=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    --only) only=,$2,; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "vs_llama.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PKG=node-llama-cpp PKG_VERSION=3.22.1
PIN=de3ff815ea7d559ee917f063901b8986f038abc6
py=/usr/bin/python3  # Debian's Python, where python3-numpy installs
# the medians (min-max) of each run's figures in a runs-*.tsv, and atlas / llama.cpp
print_table() {
"$py" - "$1" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, name, fig, v = line.split("\t")
    runs.setdefault((name, fig), []).append(float(v))
figs = [("pp128", "prefill 128 tok/s"), ("pp512", "prefill 512 tok/s"),
        ("tg128", "decode tg128 tok/s"), ("rss", "peak RSS MiB")]
def cell(name, fig):
    v = runs.get((name, fig))
    if not v:
        return None, "-"
    m = statistics.median(v)
    return m, "%.1f (%.1f-%.1f)" % (m, min(v), max(v))
rows = [("llama-bf16", None), ("atlas-bf16", "llama-bf16"), ("atlas-bf16-bf16act", "llama-bf16"),
        ("llama-q4_0", None), ("llama-q4_0-bf16head", None), ("atlas-gptq", "llama-q4_0"),
        ("atlas-gptq-int8act", "llama-q4_0"), ("atlas-gptq-int8act", "llama-q4_0-bf16head"),
        ("atlas-gptq-int4head", "llama-q4_0")]
print("| run | " + " | ".join(t for _, t in figs) + " |")
print("|---" * (len(figs) + 1) + "|")
for name, ref in rows:
    if not any(k[0] == name for k in runs):
        continue
    cells = []
    for fig, _ in figs:
        m, text = cell(name, fig)
        if ref and m is not None:
            b, _ = cell(ref, fig)
            text += " **%.2fx**" % (m / b) if b else ""
        cells.append(text)
    print("| %s | %s |" % (name + (" vs " + ref if ref and ref.endswith("head") else ""),
                           " | ".join(cells)))
rounds = len({line.split("\t")[0] for line in open(sys.argv[1])})
print("\n%d rounds; ratios atlas / llama.cpp on the same weights (bf16 / bf16; GPTQ INT4 g128 /"
      " Q4_0; int4head: a 4-bit head against Q4_0's Q6_K one): above 1 is atlas faster, or for"
      " RSS larger" % rounds)
EOF
}
if [ -n "$table" ]; then
  [ -s "$table" ] || { echo "vs_llama.sh: $table: no figures" >&2; exit 1; }
  print_table "$table"
  exit 0
fi
atlas=$build/atlas
lc=$cache/llama.cpp bins=$cache/llama.cpp/build/bin
log() { echo "vs_llama: $*" >&2; }
die() { log "$*"; exit 1; }
[ -x "$atlas" ] || die "$atlas: no atlas binary (build atlas first, or pass --build DIR)"
mkdir -p "$cache"

# ---- tools: numpy for gguf-py, /usr/bin/time for peak RSS --------------------------------
missing=()
"$py" -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
[ -x /usr/bin/time ] || missing+=(time)
for t in npm git cmake c++ jq; do command -v "$t" >/dev/null || die "$t is missing (scripts/setup.sh)"; done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing ${missing[*]} (apt-get)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# ---- llama.cpp at the pinned commit, built once -------------------------------------------
if [ ! -x "$bins/llama-bench" ] || [ ! -x "$bins/llama-quantize" ]; then
  if [ ! -d "$lc/.git" ]; then
    bundle=$cache/gitRelease.bundle
    if [ ! -s "$bundle" ]; then
      log "fetching $PKG@$PKG_VERSION (npm pack)"
      (cd "$cache" && npm pack --silent "$PKG@$PKG_VERSION" >/dev/null)
      tar -xzf "$cache/$PKG-$PKG_VERSION.tgz" -C "$cache" package/llama/gitRelease.bundle
      mv "$cache/package/llama/gitRelease.bundle" "$bundle"
      rm -rf "$cache/package"
    fi
    rm -rf "$lc.tmp"
    git -c advice.detachedHead=false clone -q "$bundle" "$lc.tmp"
    mv "$lc.tmp" "$lc"
  fi
  git -C "$lc" -c advice.detachedHead=false checkout -q "$PIN" ||
    die "$lc: the bundle has no commit $PIN"
  log "building llama.cpp $(git -C "$lc" rev-parse --short HEAD) (llama-bench, llama-quantize; -j2)"
  cmake -S "$lc" -B "$lc/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$cache/cmake.log" 2>&1 ||
    die "configuring llama.cpp failed: $cache/cmake.log"
  cmake --build "$lc/build" -j2 --target llama-bench llama-quantize >"$cache/build.log" 2>&1 ||
    die "building llama.cpp failed: $cache/build.log"
fi
[ "$(git -C "$lc" rev-parse HEAD)" = "$PIN" ] || die "$lc is not at the pinned commit $PIN"

# ---- the checkpoint in six forms ----------------------------------------------------------
bf16=$cache/qwen3-bf16 gguf=$cache/qwen3-bf16.gguf q40=$cache/qwen3-q4_0.gguf gptq=$cache/qwen3-gptq
q40h=$cache/qwen3-q4_0-bf16head.gguf gptqh=$cache/qwen3-gptq-head
if [ ! -s "$bf16/config.json" ]; then
  rm -rf "$bf16.tmp"; "$py" "$root/bench/cpu/make_qwen3.py" "$bf16.tmp" >&2 && mv "$bf16.tmp" "$bf16"
fi
if [ ! -s "$gguf" ]; then
  "$py" "$root/bench/cpu/to_gguf.py" "$lc/gguf-py" "$bf16" "$gguf.tmp" >&2 && mv "$gguf.tmp" "$gguf"
fi
if [ ! -s "$q40" ]; then
  "$bins/llama-quantize" "$gguf" "$q40.tmp" Q4_0 "$threads" >"$cache/quantize.log" 2>&1 ||
    die "llama-quantize failed: $cache/quantize.log"
  mv "$q40.tmp" "$q40"
fi
if [ ! -s "$q40h" ]; then
  "$bins/llama-quantize" --token-embedding-type bf16 --output-tensor-type bf16 "$gguf" "$q40h.tmp" \
    Q4_0 "$threads" >"$cache/quantize-bf16head.log" 2>&1 ||
    die "llama-quantize failed: $cache/quantize-bf16head.log"
  mv "$q40h.tmp" "$q40h"
fi
if [ ! -s "$gptq/config.json" ]; then
  rm -rf "$gptq.tmp"; "$py" "$root/bench/cpu/to_gptq.py" "$bf16" "$gptq.tmp" >&2 && mv "$gptq.tmp" "$gptq"
fi
if [ ! -s "$gptqh/config.json" ]; then
  rm -rf "$gptqh.tmp"
  "$py" "$root/bench/cpu/to_gptq.py" "$bf16" "$gptqh.tmp" --lm-head >&2 && mv "$gptqh.tmp" "$gptqh"
fi

# ---- the runs -----------------------------------------------------------------------------
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv=$cache/runs-$stamp.tsv tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tsv"
# one run: NAME then the command; appends "round NAME figure value" lines (tok/s, RSS MiB)
run() {
  local name=$1; shift
  [ -z "$only" ] || [[ $only == *",$name,"* ]] || return 0
  /usr/bin/time -f %M -o "$tmp/rss" "$@" >"$tmp/out" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; die "$name: failed: $*"; }
  case $name in
    llama*) jq -r 'if .n_gen == 0 then "pp\(.n_prompt)\t\(.avg_ts)" else "tg\(.n_gen)\t\(.avg_ts)" end' \
              "$tmp/out" ;;
    *) awk '$1 == "prefill" { print "pp" $2 "\t" $6 }
            $1 == "decode" && $3 == "steps" { for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s,"  ||
              $(i + 1) == "tok/s") { print "tg128\t" $i; break } }' "$tmp/out" ;;
  esac | sed "s/^/$r\t$name\t/" >>"$tsv"
  awk -v r="$r" -v n="$name" '{ printf "%s\t%s\trss\t%.1f\n", r, n, $1 / 1024 }' "$tmp/rss" >>"$tsv"
}
lb=("$bins/llama-bench" -t "$threads" -p 128,512 -n 128 -r 1 -o jsonl -m)
ab=("$atlas" bench --device cpu --threads "$threads" -p 128,512 -n 128 --reps 1 -m)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
log "$rounds rounds of ${only:+the runs $only of }8 runs, $threads threads; raw figures in $tsv"
for r in $(seq 1 "$rounds"); do
  run llama-bf16 "${lb[@]}" "$gguf"
  run atlas-bf16 "${ab[@]}" "$bf16" --cpu-activations fp32
  run atlas-bf16-bf16act "${ab[@]}" "$bf16" --cpu-activations bf16
  run llama-q4_0 "${lb[@]}" "$q40"
  run atlas-gptq "${ab[@]}" "$gptq" --cpu-activations fp32
  run llama-q4_0-bf16head "${lb[@]}" "$q40h"
  run atlas-gptq-int8act "${ab[@]}" "$gptq" --cpu-activations int8
  run atlas-gptq-int4head "${ab[@]}" "$gptqh" --cpu-activations int8
  log "round $r of $rounds done (load average $(cut -d' ' -f1 /proc/loadavg))"
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the table ----------------------------------------------------------------------------
echo "atlas $(git -C "$root" rev-parse --short HEAD) against llama.cpp $(git -C "$lc" rev-parse --short HEAD)" \
     "($PKG@$PKG_VERSION), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores: $cpu"
echo "$threads threads, $rounds rounds alternated, medians (min-max); load average before $load0, after $load1"
print_table "$tsv"
