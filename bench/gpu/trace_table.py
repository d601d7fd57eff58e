#!/usr/bin/env python3
"""bench/gpu/trace_table.py CSV — the kernels of one decode step *in place*, from Nsight
Systems' GPU trace (`nsys stats -r cuda_gpu_trace -f csv` of a run with
--cuda-graph-trace=node; bench/gpu/trace.sh). Unlike ncu, which replays each kernel alone,
this sees the graph as it runs: programmatic dependent launch lets a kernel start before the
previous one ends, so each kernel's share of the step is counted as the time from the previous
kernel's end to its own end ("own"), next to its start-to-end span ("span").

The last complete step (atlas_embed ... argmax) is summed by kernel name and grid."""
import csv, os, sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_table import split_steps

def rows(path):
    with open(path, newline="") as f:
        for r in csv.DictReader(l for l in f if not l.startswith("#")):
            name = r.get("Name") or r.get("name")
            if name is None:
                continue
            start = float(r.get("Start (ns)") or r.get("Start"))
            dur = float(r.get("Duration (ns)") or r.get("Duration"))
            grid = "%s,%s,%s" % (r.get("GrdX", "?"), r.get("GrdY", "?"), r.get("GrdZ", "?"))
            yield name.split("(")[0], grid, start, dur

def main():
    ks = [k for k in rows(sys.argv[1]) if not k[0].startswith(("[CUDA", "atlas_probe", "atlas_bench"))]
    ks.sort(key=lambda k: k[2])
    steps = split_steps(ks)
    if not steps:
        sys.exit("no complete step (atlas_embed .. atlas_argmax) in the trace")
    step = steps[-1]
    total = (step[-1][2] + step[-1][3] - step[0][2]) / 1e3
    agg = OrderedDict()
    prev_end = step[0][2]
    for name, grid, start, dur in step:
        end = start + dur
        own = max(0.0, end - max(prev_end, start)) + max(0.0, start - prev_end)
        prev_end = max(prev_end, end)
        a = agg.setdefault((name, grid), [0, 0.0, 0.0])
        a[0] += 1
        a[1] += own / 1e3
        a[2] += dur / 1e3
    print("step %.3f ms (%d kernels, last of %d steps in the trace)" % (total / 1e3, len(step), len(steps)))
    print("%-28s %-12s %5s %10s %9s %9s" % ("kernel", "grid", "n", "own us", "own/n", "span/n"))
    for (name, grid), (n, own, span) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print("%-28s %-12s %5d %10.1f %9.2f %9.2f" % (name[:28], grid, n, own, own / n, span / n))

if __name__ == "__main__":
    main()
