#!/usr/bin/env bash
# bench/gpu/placement.sh — does where the process runs move the host's part of a decode step?
# Runs `atlas bench` (decode 128 after 512, small probes) $RUNS times, alternating no placement
# and `taskset` to one CPU local to the GPU (and, where the machine has one, a CPU away from it),
# printing the decode and host cpu lines of each. Needs /tmp/llama8b (bench/gpu/run.sh).
#   ATLAS_BUILD=build-gpu RUNS=6 bench/gpu/placement.sh
set -u
B=${ATLAS_BUILD:-build-gpu}
RUNS=${RUNS:-6}
MODEL=${MODEL:-/tmp/llama8b}
lscpu | grep -E "^CPU\(s\)|NUMA|Model name|Thread|Socket|MHz" 
nvidia-smi -q | grep -iE "numa|bus id" | head -4
ID=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z')
PCI=${ID: -12}  # 00000000:19:00.0 -> 0000:19:00.0, sysfs's form
LOCAL=$(cat /sys/bus/pci/devices/$PCI/local_cpulist 2>/dev/null)
echo "GPU $PCI local CPUs: ${LOCAL:-unknown}; numa_node $(cat /sys/bus/pci/devices/$PCI/numa_node 2>/dev/null)"
NCPU=$(nproc)
FIRST=${LOCAL%%[-,]*}; FIRST=${FIRST:-0}
# a CPU outside the local list, if the machine has one
FAR=""
for c in $(seq 0 $((NCPU - 1))); do
  python3 - "$LOCAL" "$c" <<'PY' && { FAR=$c; break; }
import sys
lst, c = sys.argv[1], int(sys.argv[2])
s = set()
for part in filter(None, lst.split(',')):
    a, _, b = part.partition('-'); s.update(range(int(a), int(b or a) + 1))
sys.exit(0 if s and c not in s else 1)
PY
done
for i in $(seq 1 "$RUNS"); do
  case $((i % 3)) in
    1) pre=""; what="no placement" ;;
    2) pre="taskset -c $FIRST"; what="taskset -c $FIRST (local)" ;;
    0) if [ -n "$FAR" ]; then pre="taskset -c $FAR"; what="taskset -c $FAR (away)";
       else pre="taskset -c $((NCPU - 1))"; what="taskset -c $((NCPU - 1))"; fi ;;
  esac
  echo "== run $i: $what"
  $pre "$B/atlas" bench -m "$MODEL" -p 512 -n 128 --reps 1 --read-gib 1 --gemm 1024 2>&1 |
    grep -E "^decode |^decode q|^decode gpu|^host|ratio +decode|read bw|^read"
done
