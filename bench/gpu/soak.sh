#!/usr/bin/env bash
# bench/gpu/soak.sh — issue 25's soak on the H200: three 8B-shaped random checkpoints behind
# `atlas serve --max-resident 1`, 64 clients streaming at once, each request for a model drawn
# at random, 15% of them hanging up at a random point, until 200 swaps happened; then every
# model unloaded (POST /v1/models/NAME/unload) and the device's and the server's memory
# compared with what they were after a warm-up (each model loaded, WARM_SWAPS swaps, all
# unloaded). Done: 0 failed requests, 0 crashes, memory back. Run from the repository root on
# the GPU machine, after the build:
#
#   OUT=/tmp/x [ATLAS_BUILD=build-gpu] bash bench/gpu/soak.sh
#
# Needs tests/data/tiny-llama3/tokenizer.json (scripts/gpu-deps.sh fetch packs it; carry
# .carry/tok.tar.xz): the random checkpoints have none and Llama 3's has their 128,256 ids.
# The driver is bench/serve/soak.mjs under Node, else (or with DRIVER=py) its twin soak.py
# (standard library). Knobs: SWAPS (200), WARM_SWAPS (15), STREAMS (64), DISCONNECT (0.15),
# MAX_TOKENS (4-32), MAX_RESIDENT (1), KV_GIB (16: the KV pool per model; the default would take all the
# GPU share left after the weights), BUDGET_S (450: the whole script, checkpoints included,
# stops the soak in time to end under 8 minutes), RSS_SLACK_MIB (256), DEV_SLACK_MIB (256),
# MODEL_DIRS (below). About 60 s for the checkpoints (made at once on the GPU; kept in /tmp
# for a second run), 200 swaps in about 3-4 minutes: 5-6 minutes in all.
# Prints a summary table (also $OUT/summary.md); exit status 0 when every check passed.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-soak}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
SWAPS=${SWAPS:-200}
WARM_SWAPS=${WARM_SWAPS:-15}
STREAMS=${STREAMS:-64}
DISCONNECT=${DISCONNECT:-0.15}
MAX_TOKENS=${MAX_TOKENS:-4-32}
MAX_RESIDENT=${MAX_RESIDENT:-1}
KV_GIB=${KV_GIB:-16}
BUDGET_S=${BUDGET_S:-450}
RSS_SLACK_MIB=${RSS_SLACK_MIB:-256}
DEV_SLACK_MIB=${DEV_SLACK_MIB:-256}
PORT=${PORT:-18090}
URL=http://127.0.0.1:$PORT
MODELS="a b c"
declare -A DIR=([a]=/tmp/soak8b-a [b]=/tmp/soak8b-b [c]=/tmp/soak8b-c)
declare -A SEED=([a]=1234 [b]=4321 [c]=777)
# MODEL_DIRS="DIR_A DIR_B DIR_C": serve these instead of making the 8B checkpoints (e.g. the
# fixtures with KV_GIB=0.25, to try the script on a machine without a GPU)
if [ -n "${MODEL_DIRS:-}" ]; then read -r DIR[a] DIR[b] DIR[c] <<< "$MODEL_DIRS"; fi
source scripts/gpu-deps.sh install
step() { echo "== $(date +%T) (+$(( $(date +%s) - T0 )) s) $*"; }
die() { echo "soak.sh: $*" >&2; exit 2; }
[ -x "$B/atlas" ] || die "no $B/atlas (build first, or set ATLAS_BUILD)"
TOK=tests/data/tiny-llama3
[ -s "$TOK/tokenizer.json" ] || die "$TOK/tokenizer.json missing: scripts/gpu-deps.sh fetch packs it into .carry/tok.tar.xz: carry that"
smi_used() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ' || echo 0; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
# curl where there is one (a Python start costs up to a second), else Python
if command -v curl >/dev/null; then
  get() { curl -sf --max-time 60 "$1"; }
  post() { curl -s --max-time 120 -X POST -H 'Content-Type: application/json' -d '{}' -w ' %{http_code}' "$1"; echo; }
  status_of() { curl -s --max-time 30 -o /dev/null -w '%{http_code}' "$1" || true; }
else
  get() { python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=60).read().decode())" "$1"; }
  post() { python3 -c "
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b'{}', headers={'Content-Type': 'application/json'}), timeout=120)
    print(r.read().decode(), r.status)
except urllib.error.HTTPError as e:
    print(e.read().decode(), e.code)
" "$1"; }
  status_of() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=30).status)" "$1" 2>/dev/null || true; }
fi
metric() { get "$URL/metrics" | awk -v k="$1" '$1 == k {print $2}'; }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"
DEV0=$(smi_used)

# --- the checkpoints: three seeds, made at once on the GPU (about 16 GB each on disk) -------
step "checkpoints"
if [ -z "${MODEL_DIRS:-}" ]; then
  [ -f /tmp/llama8b/config.json ] && [ ! -e "${DIR[a]}" ] && ln -s /tmp/llama8b "${DIR[a]}"   # run.sh's, seed 1234
  [ -f /tmp/llama8b-b/config.json ] && [ ! -e "${DIR[b]}" ] && ln -s /tmp/llama8b-b "${DIR[b]}" # seed 4321
fi
pids=""; making=0
for m in $MODELS; do
  d=${DIR[$m]}
  [ -f "$d/model.safetensors.index.json" ] || [ -f "$d/model.safetensors" ] && continue
  free_gb=$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)
  if [ $(( free_gb - 17 * making )) -lt 20 ]; then  # no room for 16 GB more: model a's weights, linked
    echo "model $m: $free_gb GB free in /tmp, $making checkpoints being made: its directory links model a's weights"
    mkdir -p "$d"
    (while [ ! -f "${DIR[a]}/model.safetensors.index.json" ] || pgrep -f "make_checkpoint.py.*${DIR[a]}" >/dev/null; do sleep 1; done
     cp "${DIR[a]}/config.json" "$d/" && ln -sf "${DIR[a]}"/*.safetensors "${DIR[a]}/model.safetensors.index.json" "$d/") &
  else
    timeout 300 python3 tools/make_checkpoint.py --shape 8b --seed "${SEED[$m]}" --out "$d" > "$OUT/make-$m.log" 2>&1 &
    making=$((making + 1))
  fi
  pids="$pids $!"
done
for p in $pids; do wait "$p" || die "making a checkpoint failed: $(tail -3 "$OUT"/make-*.log)"; done
for m in $MODELS; do
  d=${DIR[$m]}
  [ -f "$d/model.safetensors.index.json" ] || [ -f "$d/model.safetensors" ] || die "no checkpoint in $d"
  [ -f "$d/tokenizer.json" ] || cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$d/"
  cat "$d"/*.safetensors > /dev/null  # page-cached: a swap is the upload, not the disk
done
T_CKPT=$(( $(date +%s) - T0 ))
du -shL "${DIR[a]}" "${DIR[b]}" "${DIR[c]}" 2>/dev/null; df -h /tmp | tail -1

# --- the server ---------------------------------------------------------------------------
step "atlas serve a b c --max-resident $MAX_RESIDENT"
args=()
for m in $MODELS; do args+=(--model "$m=${DIR[$m]}"); done
"$B/atlas" serve "${args[@]}" --max-resident "$MAX_RESIDENT" --parallel "$STREAMS" --ctx-size 512 \
  --kv-memory "$KV_GIB" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SRV=$!
for i in $(seq 1 240); do get "$URL/health" >/dev/null 2>&1 && break; kill -0 $SRV 2>/dev/null || break; sleep 0.5; done
kill -0 $SRV 2>/dev/null || { cat "$OUT/serve.log"; die "the server did not start"; }
DEV1=$(smi_used); RSS1=$(rss_kib $SRV)
# Warm-up: each model loaded (load_s, HTTP status), then a short soak, then all unloaded. The
# context, the pinned staging pool, the kernel modules and cuBLASLt are made at the first load
# and kept; the allocator's arenas and the HTTP worker threads grow to the load they see and
# keep it: the baseline is taken after them.
step "warm-up: each model loaded"
for m in $MODELS; do post "$URL/v1/models/$m/load" | grep -o '"load_s":[0-9.e-]*\| [0-9]*$' | paste -sd' '; done
step "warm-up: a short soak (the allocator's arenas and the HTTP workers grow to their use)"
DRV="python3 bench/serve/soak.py"
command -v node >/dev/null && [ "${DRIVER:-}" != py ] && DRV="node bench/serve/soak.mjs"
echo "driver: $DRV"
$DRV --url "$URL" --models a,b,c --streams "$STREAMS" --swaps "$WARM_SWAPS" --duration 40 \
  --disconnect "$DISCONNECT" --max-tokens "$MAX_TOKENS" --seed 24 > "$OUT/warmup.log" 2>&1
tail -1 "$OUT/warmup.log"
for m in $MODELS; do post "$URL/v1/models/$m/unload" | grep -o '"resident":[a-z]*\| [0-9]*$' | paste -sd' '; done
sleep 2
DEV_BASE=$(smi_used); RSS_BASE=$(rss_kib $SRV); FDS_BASE=$(fds $SRV)
echo "device memory: $DEV0 MiB before the server, $DEV1 MiB after its start, $DEV_BASE MiB after the warm-up; RSS $((RSS1 / 1024)) -> $((RSS_BASE / 1024)) MiB; fds $FDS_BASE"

# --- the soak -----------------------------------------------------------------------------
LEFT=$(( BUDGET_S - ($(date +%s) - T0) - 40 ))  # 40 s for the drain, unloads and stop
[ "$LEFT" -gt 30 ] || LEFT=30
step "soak: $STREAMS streams, until $SWAPS swaps or $LEFT s"
(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 \
  || echo 0) > "$OUT/smi-soak.csv" 2>/dev/null & SMI=$!
TS=$(date +%s)
$DRV --url "$URL" --models a,b,c --streams "$STREAMS" --swaps "$SWAPS" --duration "$LEFT" \
  --disconnect "$DISCONNECT" --max-tokens "$MAX_TOKENS" --seed 25 --pid "$SRV" --json "$OUT/soak.json" \
  2>&1 | tee "$OUT/soak.log"
T_SOAK=$(( $(date +%s) - TS ))
kill $SMI 2>/dev/null

# --- after: alive, idle, everything unloaded, memory back ------------------------------------
ALIVE=0; kill -0 $SRV 2>/dev/null && ALIVE=1
HEALTH=$(status_of "$URL/health"); HEALTH=${HEALTH:-none}
for i in $(seq 1 60); do [ "$(metric atlas_requests_active)" = 0 ] && break; sleep 0.5; done
ACTIVE=$(metric atlas_requests_active); RUNNING=$(metric atlas_running_sequences)
for m in $MODELS; do post "$URL/v1/models/$m/unload" | grep -o '"resident":[a-z]*\| [0-9]*$' | paste -sd' '; done
sleep 2
RESIDENT=$(metric atlas_resident_models)
DEV_END=$(smi_used); RSS_END=$(rss_kib $SRV); FDS_END=$(fds $SRV)
# The last request's connection may not be closed on the server's side yet: count again for
# up to 5 s before calling a descriptor more a leak.
for i in $(seq 1 10); do [ "$FDS_END" -le "$FDS_BASE" ] && break; sleep 0.5; FDS_END=$(fds $SRV); done
DEV_PEAK=$(sort -n "$OUT/smi-soak.csv" | tail -1)
get "$URL/metrics" > "$OUT/metrics.txt"
kill -TERM $SRV; wait $SRV; EXIT=$?
tail -3 "$OUT/serve.log"
CRASH_LINES=$(grep -ciE 'segmentation|abort|AddressSanitizer|CUDA_ERROR|illegal' "$OUT/serve.log")

# --- the table ----------------------------------------------------------------------------
python3 - "$OUT" <<EOF
import json, sys
out = sys.argv[1]
try:
    r = json.load(open(out + "/soak.json"))
except (OSError, ValueError):
    r = None
dev_base, dev_end, rss_base, rss_end = $DEV_BASE, $DEV_END, $RSS_BASE, ${RSS_END:-0}
checks = []
def row(what, value, ok=None):
    checks.append(ok)
    return f"| {what} | {value} | {'' if ok is None else 'pass' if ok else 'FAIL'} |"
lines = ["| check | figure | verdict |", "|---|---|---|"]
if r:
    h, s = r["hangups"], r["server"]
    lines += [
        row("swaps", f"{r['swaps']} (target $SWAPS) in {r['wall_s']:.0f} s, {s['swap_s_mean']*1000:.0f} ms each on average", r["swaps"] >= $SWAPS),
        row("requests", f"{r['started']} sent: {r['completed']} completed, {r['hung_up']} hung up on purpose "
            f"({h['before_response']} before the response, {h['after_headers']} after the headers, {h['mid_stream']} mid-stream), "
            f"{r['tokens']} tokens"),
        row("failed requests", f"{r['failed']}" + (f" (first: {r['failures'][0]['why'][:120]})" if r['failures'] else ""), r["failed"] == 0),
        row("server: errors, rejected, load failures", f"{s['errors']}, {s['rejected']}, {s['load_failures']}",
            s["errors"] == 0 and s["rejected"] == 0 and s["load_failures"] == 0),
        row("server: 5xx (a client gone before its first event is answered 499)", f"{s['http_5xx']} ({h['before_response']} such hang-ups)",
            s["http_5xx"] == 0),
        row("server: cancelled", f"{s['cancelled']}"),
    ]
else:
    lines.append(row("driver", "no soak.json (see soak.log)", False))
lines += [
    row("crashes", f"alive after: {'yes' if $ALIVE else 'NO'}, /health {'$HEALTH'}, exit on SIGTERM {$EXIT}, "
        f"{$CRASH_LINES} crash lines in serve.log", $ALIVE == 1 and "$HEALTH" == "200" and $EXIT == 0 and $CRASH_LINES == 0),
    row("idle after", f"active {'$ACTIVE'}, running {'$RUNNING'}, resident after unloads {'$RESIDENT'}",
        "$ACTIVE" == "0" and "$RUNNING" == "0" and "$RESIDENT" == "0"),
    row("device memory, MiB", f"{$DEV0} before the server, {$DEV1} started, {dev_base} after the warm-up (all unloaded), "
        f"peak {'$DEV_PEAK' or '?'}, {dev_end} at the end, all unloaded ({dev_end - dev_base:+d})", dev_end - dev_base <= $DEV_SLACK_MIB),
    row("host RSS, MiB", f"{$RSS1 // 1024} started, {rss_base // 1024} after warm-up, "
        f"{(r or {}).get('memory', {}).get('rss_peak_kib', 0) // 1024} peak, {rss_end // 1024} at the end ({(rss_end - rss_base) // 1024:+d})",
        rss_end - rss_base <= $RSS_SLACK_MIB * 1024),
    row("open descriptors", f"{$FDS_BASE} -> {$FDS_END}", $FDS_END <= $FDS_BASE),
    row("time", f"checkpoints $T_CKPT s, soak $T_SOAK s, {$(date +%s) - $T0} s in all"),
]
verdict = "PASS" if all(c is not False for c in checks) else "FAIL"
lines.append("| **verdict** | $STREAMS streams, 3 models, --max-resident $MAX_RESIDENT, disconnect $DISCONNECT, "
             "max_tokens $MAX_TOKENS, KV $KV_GIB GiB a model | **" + verdict + "** |")
text = "\n".join(lines)
print(text)
open(out + "/summary.md", "w").write(text + "\n")
sys.exit(0 if verdict == "PASS" else 1)
EOF
