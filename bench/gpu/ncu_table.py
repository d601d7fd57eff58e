#!/usr/bin/env python3
"""bench/gpu/ncu_table.py CSV [TOKENS] — the kernels of one decode step, from Nsight Compute's
CSV (`ncu --metrics gpu__time_duration.sum --csv`, run by bench/gpu/run.sh steps profile and
batch).

A forward runs from atlas_embed to atlas_argmax; the last one whose embed has TOKENS blocks
(default 1: a decode step of one sequence; B for `atlas bench --batch B`) is summed by kernel
and grid, largest first."""
import csv, sys
from collections import OrderedDict

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}

def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0]
        us = float(r["Metric Value"].replace(",", "")) * SCALE.get(r["Metric Unit"], 1.0)
        yield name, r["Grid Size"], r["Block Size"], us

def split_steps(ks):
    """The forwards in a kernel list whose items start with the kernel's name: from
    atlas_embed to an argmax kernel (atlas_argmax or atlas_argmax_wide)."""
    steps, cur = [], None
    for k in ks:
        if k[0] == "atlas_embed":
            cur = [k]
        elif cur is not None:
            cur.append(k)
            if k[0].startswith("atlas_argmax"):
                steps.append(cur)
                cur = None
    return steps

def main():
    ks = list(rows(sys.argv[1]))
    steps = split_steps(ks)
    tokens = sys.argv[2] if len(sys.argv) > 2 else "1"
    decode = [s for s in steps if s[0][1].strip("() ").split(",")[0].strip() == tokens]
    if not decode:
        print(f"no decode step found among {len(ks)} kernels ({len(steps)} forwards)")
        return 1
    step = decode[-1]
    agg = OrderedDict()
    for name, grid, block, us in step:
        e = agg.setdefault((name, grid, block), [0, 0.0])
        e[0] += 1
        e[1] += us
    total = sum(e[1] for e in agg.values())
    print(f"one decode step of {tokens} tokens ({len(decode)} found): {len(step)} kernels, {total:.1f} us summed "
          f"(each kernel alone, caches flushed)")
    print(f"{'kernel':<22} {'grid':<16} {'block':<12} {'count':>5} {'total us':>9} "
          f"{'mean us':>8} {'share':>6}")
    for (name, grid, block), (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<22} {grid:<16} {block:<12} {n:>5} {us:>9.1f} {us / n:>8.2f} "
              f"{100 * us / total:>5.1f}%")
    return 0

if __name__ == "__main__":
    sys.exit(main())
