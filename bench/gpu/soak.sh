#!/usr/bin/env bash
# bench/gpu/soak.sh — issue 37's soak on the GPU: four random checkpoints of different sizes
# (tools/make_checkpoint.py: "big" Llama-3.1-8B, "mid" its first 10 layers (3.2B), "one"
# Llama-3.2-1B, "small" Qwen3-0.6B) behind `atlas serve --max-resident auto`, each with its own
# settings from a models file (bench/gpu/soak_preset.py: context 512 to 8,192, --parallel 16
# to 64, KV in bf16 and in FP8 for "mid", step budgets, keep-alives; "one" pinned and loaded at
# start) under a --memory-budget that holds "one" beside "big" or beside the other two, never
# "big" beside a second one, so that requests for "big" and for "mid"/"small" swap each other;
# --host-cache on (the smaller models' weights come back from pinned host memory, "big" from
# the page cache; released models' prefix KV kept there too). 64 clients stream at once, each
# request for a model drawn at random, 15% of them hanging up at a random point, until 200
# swaps happened (atlas_model_swaps_total: loads that released another model); then every
# model unloaded (POST /v1/models/NAME/unload) and the device's and the server's memory
# compared with what they were after a warm-up (each model loaded, WARM_SWAPS swaps, all
# unloaded). Done: 0 failed requests, 0 5xx, 0 crashes, the pinned model never swapped out,
# one GPU context for the whole run (atlas_device_contexts_created_total), device memory and
# RSS (less what the host cache holds on purpose) back. Run from the repository root on the
# GPU machine, after the build:
#
#   OUT=/tmp/x [ATLAS_BUILD=build-gpu] bash bench/gpu/soak.sh
#
# Needs tests/data/tiny-llama3/tokenizer.json and tiny-qwen3's (scripts/gpu-deps.sh fetch packs
# them; carry .carry/tok.tar.xz): the random checkpoints have none. The driver is
# bench/serve/soak.mjs under Node, else (or with DRIVER=py) its twin soak.py (standard
# library). Knobs: SWAPS (200), WARM_SWAPS (10), STREAMS (64), DISCONNECT (0.15), MAX_TOKENS
# (4-32), HOST_CACHE_GIB (12: the three smaller models' weights, 9.4 GiB, and prefix KV; not
# "big"'s 15), DRAIN_S (1: a busy model's turn before its requests are paused for another's,
# as the CI form; `--drain-timeout`), BUDGET_S (470: the whole script, checkpoints included, stops the soak in time to
# end under 8 minutes), RSS_SLACK_MIB (256), DEV_SLACK_MIB (256), CKPT_ROOT (/tmp/soak: about
# 26 GB, kept for a second run), DEVICE (gpu; cpu: `--device cpu`, no device memory, with
# MODEL_DIRS and KV_UNIT), MODEL_DIRS="BIG MID ONE SMALL" (serve these instead of making the
# checkpoints), KV_UNIT (1: GiB a unit of soak_preset.py's KV table). About 30-40 s for the
# checkpoints (written tensor by tensor on the GPU), 25 s of warm-up, then the soak: 6-8
# minutes in all. A smoke on a machine without a GPU, the test fixtures as the four models (about
# a minute; DRIVER=py for the Python driver):
#
#   DEVICE=cpu KV_UNIT=0.0009765625 HOST_CACHE_GIB=0.0078125 SWAPS=20 BUDGET_S=120 \
#     MODEL_DIRS="models/default tests/data/tiny-qwen3 tests/data/tiny-llama3 \
#     tests/data/tiny-llama3" ATLAS_BUILD=build bash bench/gpu/soak.sh
#
# Prints a summary table (also $OUT/summary.md); exit status 0 when every check passed.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/atlas-soak}
mkdir -p "$OUT"
B=${ATLAS_BUILD:-build-gpu}
SWAPS=${SWAPS:-200}
WARM_SWAPS=${WARM_SWAPS:-10}
STREAMS=${STREAMS:-64}
DISCONNECT=${DISCONNECT:-0.15}
MAX_TOKENS=${MAX_TOKENS:-4-32}
HOST_CACHE_GIB=${HOST_CACHE_GIB:-12}
DRAIN_S=${DRAIN_S:-1}
BUDGET_S=${BUDGET_S:-470}
RSS_SLACK_MIB=${RSS_SLACK_MIB:-256}
DEV_SLACK_MIB=${DEV_SLACK_MIB:-256}
CKPT_ROOT=${CKPT_ROOT:-/tmp/soak}
DEVICE=${DEVICE:-gpu}
KV_UNIT=${KV_UNIT:-1}
PORT=${PORT:-18090}
URL=http://127.0.0.1:$PORT
MODELS="big mid one small"
MODELS_CSV=big,mid,one,small
PINNED=one
declare -A DIR=([big]=$CKPT_ROOT/big [mid]=$CKPT_ROOT/mid [one]=$CKPT_ROOT/one [small]=$CKPT_ROOT/small)
# the shape, its layers (empty: the published depth) and the tokenizer each is served with
declare -A SHAPE=([big]=llama3.1-8b [mid]=llama3.1-8b [one]=llama3.2-1b [small]=qwen3-0.6b)
declare -A LAYERS=([big]="" [mid]=10 [one]="" [small]="")
declare -A TOKD=([big]=tiny-llama3 [mid]=tiny-llama3 [one]=tiny-llama3 [small]=tiny-qwen3)
declare -A SEED=([big]=1234 [mid]=4321 [one]=777 [small]=99)
if [ -n "${MODEL_DIRS:-}" ]; then read -r DIR[big] DIR[mid] DIR[one] DIR[small] <<< "$MODEL_DIRS"; fi
source scripts/gpu-deps.sh install
step() { echo "== $(date +%T) (+$(( $(date +%s) - T0 )) s) $*"; }
die() { echo "soak.sh: $*" >&2; exit 2; }
[ -x "$B/atlas" ] || die "no $B/atlas (build first, or set ATLAS_BUILD)"
for m in $MODELS; do
  [ -n "${MODEL_DIRS:-}" ] || [ -s "tests/data/${TOKD[$m]}/tokenizer.json" ] ||
    die "tests/data/${TOKD[$m]}/tokenizer.json missing: scripts/gpu-deps.sh fetch packs it into .carry/tok.tar.xz: carry that"
done
GPU=0; [ "$DEVICE" = gpu ] && command -v nvidia-smi >/dev/null && GPU=1
# the server's own device memory (MiB): its line of the compute apps, else the GPU's used
dev_used() {
  [ "$GPU" = 1 ] || { echo 0; return; }
  local v
  v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      awk -F', *' -v p="${SRV:-0}" '$1 == p {print $2}')
  case $v in ''|*[!0-9]*) ;; *) echo "$v"; return ;; esac  # none yet, or "[N/A]"
  v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ')
  case $v in ''|*[!0-9]*) echo 0 ;; *) echo "$v" ;; esac
}
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
# what the host cache holds on purpose (the weights' tier and the prefix KV), KiB
held_kib() { get "$URL/metrics" | awk '$1 == "atlas_host_tier_pinned_bytes" || $1 == "atlas_kv_host_bytes" {s += $2} END {printf "%d", s / 1024}'; }
unload_all() { for m in $MODELS; do echo "$m: $(post "$URL/v1/models/$m/unload" | grep -o '"resident":[a-z]*\| [0-9]*$' | paste -sd' ')"; done; }

[ "$GPU" = 1 ] && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"

# --- the checkpoints: four shapes, written on the GPU (about 26 GB in all) -------------------
step "checkpoints"
mkdir -p "$CKPT_ROOT"
pids=""
for m in $MODELS; do
  d=${DIR[$m]}
  [ -f "$d/model.safetensors.index.json" ] || [ -f "$d/model.safetensors" ] && continue
  [ -n "${MODEL_DIRS:-}" ] && die "no checkpoint in $d"
  free_gb=$(df -BG --output=avail "$CKPT_ROOT" | tail -1 | tr -dc 0-9)
  [ "$free_gb" -ge 30 ] || die "$free_gb GB free in $CKPT_ROOT: the four checkpoints take about 26 GB (set CKPT_ROOT)"
  rm -rf "$d.tmp"
  (timeout 300 python3 tools/make_checkpoint.py --shape "${SHAPE[$m]}" ${LAYERS[$m]:+--layers "${LAYERS[$m]}"} \
     --seed "${SEED[$m]}" --out "$d.tmp" > "$OUT/make-$m.log" 2>&1 && mv "$d.tmp" "$d") &
  pids="$pids $!"
done
for p in $pids; do wait "$p" || die "making a checkpoint failed: $(tail -3 "$OUT"/make-*.log)"; done
for m in $MODELS; do
  d=${DIR[$m]}
  [ -f "$d/tokenizer.json" ] || cp "tests/data/${TOKD[$m]}/tokenizer.json" "tests/data/${TOKD[$m]}/tokenizer_config.json" "$d/"
  cat "$d"/*.safetensors > /dev/null  # page-cached: a load is the upload, not the disk
done
T_CKPT=$(( $(date +%s) - T0 ))
du -shL "${DIR[@]}" 2>/dev/null; df -h "$CKPT_ROOT" | tail -1

# --- the models file and the budget -------------------------------------------------------
args=()
for m in $MODELS; do args+=("$m=${DIR[$m]}"); done
python3 bench/gpu/soak_preset.py --out "$OUT/models.json" --kv-unit "$KV_UNIT" "${args[@]}" > "$OUT/budget.txt" ||
  die "the models give no swaps under a budget: $(cat "$OUT/budget.txt")"
MEM_BUDGET=$(head -1 "$OUT/budget.txt")
sed 1d "$OUT/budget.txt"; echo "memory budget $MEM_BUDGET GiB"

# --- the server ---------------------------------------------------------------------------
step "atlas serve --models-preset --max-resident auto --memory-budget $MEM_BUDGET --host-cache $HOST_CACHE_GIB"
DEV0=$(dev_used)
devarg=(); [ "$DEVICE" = cpu ] && devarg=(--device cpu)
"$B/atlas" serve --models-preset "$OUT/models.json" --max-resident auto --memory-budget "$MEM_BUDGET" \
  --host-cache "$HOST_CACHE_GIB" --drain-timeout "$DRAIN_S" "${devarg[@]}" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SRV=$!
for i in $(seq 1 240); do get "$URL/health" >/dev/null 2>&1 && break; kill -0 $SRV 2>/dev/null || break; sleep 0.5; done
kill -0 $SRV 2>/dev/null || { cat "$OUT/serve.log"; die "the server did not start"; }
DEV1=$(dev_used); RSS1=$(rss_kib $SRV)
get "$URL/v1/models" > "$OUT/models-start.json"
python3 - "$OUT/models-start.json" <<'EOF'
import json, sys
for m in json.load(open(sys.argv[1]))["data"]:
    s = m.get("settings", {})
    print(f"  {m['id']}: {m.get('state')}, {m.get('memory_bytes', 0) / 2**30:.2f} GiB; ctx {s.get('ctx_size')}, "
          f"parallel {s.get('parallel')}, kv {s.get('kv_tokens')} tokens of {s.get('kv_dtype')}, "
          f"batch {s.get('batch_tokens')}, pinned {s.get('pinned')}, keep_alive {s.get('keep_alive')}")
EOF
# Warm-up: each model loaded (load_s, HTTP status), then a short soak, then all unloaded. The
# context, the pinned staging pool, the kernel modules and cuBLASLt are made at the first load
# and kept; the host tier fills with the smaller models' weights; the allocator's arenas and
# the HTTP worker threads grow to the load they see and keep it: the baseline is taken after.
step "warm-up: each model loaded"
for m in $MODELS; do echo "$m: $(post "$URL/v1/models/$m/load" | grep -o '"load_s":[0-9.e-]*\| [0-9]*$' | paste -sd' ')"; done
step "warm-up: a short soak (the host tier, the allocator's arenas and the HTTP workers grow to their use)"
DRV="python3 bench/serve/soak.py"
command -v node >/dev/null && [ "${DRIVER:-}" != py ] && DRV="node bench/serve/soak.mjs"
echo "driver: $DRV"
$DRV --url "$URL" --models "$MODELS_CSV" --streams "$STREAMS" --swaps "$WARM_SWAPS" --duration 25 \
  --disconnect "$DISCONNECT" --max-tokens "$MAX_TOKENS" --seed 24 > "$OUT/warmup.log" 2>&1
tail -1 "$OUT/warmup.log"
unload_all
sleep 2
DEV_BASE=$(dev_used); RSS_BASE=$(rss_kib $SRV); FDS_BASE=$(fds $SRV); HELD_BASE=$(held_kib)
echo "device memory: the GPU's $DEV0 MiB used before the server; the server's $DEV1 MiB after its start, $DEV_BASE MiB after the warm-up; RSS $((RSS1 / 1024)) -> $((RSS_BASE / 1024)) MiB (host cache $((HELD_BASE / 1024)) MiB of it); fds $FDS_BASE"
# the pinned model back, as at start: no swap may take it
echo "$PINNED: $(post "$URL/v1/models/$PINNED/load" | grep -o '"load_s":[0-9.e-]*\| [0-9]*$' | paste -sd' ')"
PIN_REL0=$(grep -c "model $PINNED: released in" "$OUT/serve.log")
get "$URL/metrics" > "$OUT/metrics-before.txt"

# --- the soak -----------------------------------------------------------------------------
LEFT=$(( BUDGET_S - ($(date +%s) - T0) - 30 ))  # 30 s for the drain, unloads and stop
[ "$LEFT" -gt 30 ] || LEFT=30
step "soak: $STREAMS streams, until $SWAPS swaps or $LEFT s"
SMI=""
if [ "$GPU" = 1 ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/smi-soak.csv" 2>/dev/null & SMI=$!
fi
TS=$(date +%s)
$DRV --url "$URL" --models "$MODELS_CSV" --streams "$STREAMS" --swaps "$SWAPS" --duration "$LEFT" \
  --disconnect "$DISCONNECT" --max-tokens "$MAX_TOKENS" --seed 25 --pid "$SRV" --json "$OUT/soak.json" \
  2>&1 | tee "$OUT/soak.log"
T_SOAK=$(( $(date +%s) - TS ))
[ -n "$SMI" ] && kill "$SMI" 2>/dev/null

# --- after: alive, idle, everything unloaded, memory back ------------------------------------
ALIVE=0; kill -0 $SRV 2>/dev/null && ALIVE=1
HEALTH=$(status_of "$URL/health"); HEALTH=${HEALTH:-none}
for i in $(seq 1 60); do [ "$(metric atlas_requests_active)" = 0 ] && break; sleep 0.5; done
ACTIVE=$(metric atlas_requests_active); RUNNING=$(metric atlas_running_sequences)
PIN_STATE=$(get "$URL/v1/models" | python3 -c "import json, sys; print(next(m['state'] for m in json.load(sys.stdin)['data'] if m['id'] == '$PINNED'))" 2>/dev/null)
PIN_REL1=$(grep -c "model $PINNED: released in" "$OUT/serve.log")
BESIDE=$(grep -c "that kept serving" "$OUT/serve.log")
unload_all
sleep 2
RESIDENT=$(metric atlas_resident_models)
DEV_END=$(dev_used); RSS_END=$(rss_kib $SRV); FDS_END=$(fds $SRV); HELD_END=$(held_kib)
# The last request's connection may not be closed on the server's side yet: count again for
# up to 5 s before calling a descriptor more a leak.
for i in $(seq 1 10); do [ "$FDS_END" -le "$FDS_BASE" ] && break; sleep 0.5; FDS_END=$(fds $SRV); done
DEV_PEAK=$( [ -s "$OUT/smi-soak.csv" ] && sort -n "$OUT/smi-soak.csv" | tail -1)
get "$URL/metrics" > "$OUT/metrics.txt"
CONTEXTS=$(awk '$1 == "atlas_device_contexts_created_total" {print $2}' "$OUT/metrics.txt")
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
gpu = $GPU == 1
dev_base, dev_end, rss_base, rss_end = $DEV_BASE, $DEV_END, $RSS_BASE, ${RSS_END:-0}
held_base, held_end = $HELD_BASE, $HELD_END
contexts = "${CONTEXTS}"
checks = []
def row(what, value, ok=None):
    checks.append(ok)
    return f"| {what} | {value} | {'' if ok is None else 'pass' if ok else 'FAIL'} |"
lines = ["| check | figure | verdict |", "|---|---|---|"]
if r:
    h, s = r["hangups"], r["server"]
    ls, kv = s.get("loads_by_source", {}), s.get("kv_host", {})
    lines += [
        row("swaps", f"{r['swaps']} (target $SWAPS) in {r['wall_s']:.0f} s, {s['swap_s_mean']*1000:.0f} ms each on average; "
            f"{s['loads']} loads: {ls.get('host', '?')} from the host tier, {ls.get('page_cache', '?')} from the page cache, "
            f"{ls.get('disk', '?')} from disk; $BESIDE loads in the whole run beside resident models that kept serving", r["swaps"] >= $SWAPS),
        row("requests", f"{r['started']} sent: {r['completed']} completed, {r['hung_up']} hung up on purpose "
            f"({h['before_response']} before the response, {h['after_headers']} after the headers, {h['mid_stream']} mid-stream), "
            f"{r['tokens']} tokens; per model {r['per_model']}"),
        row("failed requests", f"{r['failed']}" + (f" (first: {r['failures'][0]['why'][:120]})" if r['failures'] else ""), r["failed"] == 0),
        row("server: errors, rejected, load failures", f"{s['errors']}, {s['rejected']}, {s['load_failures']}",
            s["errors"] == 0 and s["rejected"] == 0 and s["load_failures"] == 0),
        row("server: 5xx (a client gone before its first event is answered 499)", f"{s['http_5xx']} ({h['before_response']} such hang-ups)",
            s["http_5xx"] == 0),
        row("server: cancelled, paused (preempted)", f"{s['cancelled']}, {s.get('preempted', '?')}"),
        row("prefix KV in host memory", f"{kv.get('saved_blocks', '?')} blocks saved at releases, {kv.get('restored_blocks', '?')} "
            f"restored, {kv.get('dropped_blocks', '?')} dropped"),
    ]
else:
    lines.append(row("driver", "no soak.json (see soak.log)", False))
lines += [
    row("pinned model $PINNED", f"{'$PIN_STATE' or '?'} after the soak, released {$PIN_REL1 - $PIN_REL0} times during it",
        "$PIN_STATE" == "resident" and $PIN_REL1 == $PIN_REL0),
    row("GPU contexts made (atlas_device_contexts_created_total)", contexts or "not in /metrics (an older build)",
        contexts == ("1" if gpu else "0") if contexts else None),
    row("crashes", f"alive after: {'yes' if $ALIVE else 'NO'}, /health {'$HEALTH'}, exit on SIGTERM {$EXIT}, "
        f"{$CRASH_LINES} crash lines in serve.log", $ALIVE == 1 and "$HEALTH" == "200" and $EXIT == 0 and $CRASH_LINES == 0),
    row("idle after", f"active {'$ACTIVE'}, running {'$RUNNING'}, resident after unloads {'$RESIDENT'}",
        "$ACTIVE" == "0" and "$RUNNING" == "0" and "$RESIDENT" == "0"),
]
if gpu:
    lines.append(row("device memory (the server's), MiB", f"(the GPU's {$DEV0} used before the server) {$DEV1} started, {dev_base} after the warm-up "
        f"(all unloaded), GPU peak {'$DEV_PEAK' or '?'}, {dev_end} at the end, all unloaded ({dev_end - dev_base:+d})",
        dev_end - dev_base <= $DEV_SLACK_MIB))
lines += [
    row("host RSS less the host cache's pinned weights and KV, MiB",
        f"{$RSS1 // 1024} started; {rss_base // 1024} after the warm-up ({held_base // 1024} of it the host cache), "
        f"{(r or {}).get('memory', {}).get('rss_peak_kib', 0) // 1024} peak, {rss_end // 1024} at the end ({held_end // 1024} the host cache): "
        f"{(rss_end - held_end - rss_base + held_base) // 1024:+d} less the cache",
        rss_end - held_end - (rss_base - held_base) <= $RSS_SLACK_MIB * 1024),
    row("host cache held, MiB", f"{held_base // 1024} -> {held_end // 1024} of {$HOST_CACHE_GIB} GiB",
        held_end <= $HOST_CACHE_GIB * 1024 * 1024),
    row("open descriptors", f"{$FDS_BASE} -> {$FDS_END}", $FDS_END <= $FDS_BASE),
    row("time", f"checkpoints $T_CKPT s, soak $T_SOAK s, {$(date +%s) - $T0} s in all"),
]
verdict = "PASS" if all(c is not False for c in checks) else "FAIL"
lines.append("| **verdict** | $STREAMS streams, 4 models (big, mid, one pinned, small: $OUT/models.json), --max-resident auto, "
             "--memory-budget $MEM_BUDGET GiB, --host-cache $HOST_CACHE_GIB GiB, --drain-timeout $DRAIN_S, disconnect $DISCONNECT, max_tokens $MAX_TOKENS, "
             "device $DEVICE | **" + verdict + "** |")
text = "\n".join(lines)
print(text)
open(out + "/summary.md", "w").write(text + "\n")
sys.exit(0 if verdict == "PASS" else 1)
EOF
