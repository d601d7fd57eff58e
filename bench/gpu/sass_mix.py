#!/usr/bin/env python3
"""bench/gpu/sass_mix.py CSV [WEIGHTS] — where a kernel's instructions and stalls go, from
Nsight Compute's source page in SASS (`ncu -i REP --page source --csv --print-source sass`,
written by bench/gpu/trace.sh): for each kernel in the file, the executed warp instructions
by opcode (the share of each and its stall samples) and the sampled stall reasons.  WEIGHTS:
the weights the kernel multiplies (a GEMV's rows x columns), to print thread instructions a
weight, the figure the INT4 GEMV's dequantization was cut by (bench/RESULTS.md)."""
import collections
import csv
import sys


def kernels(path):
    """(name, header, rows) for each kernel of the file, its rows the SASS lines."""
    out, name, header = [], None, None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if r and r[0] == "Kernel Name":
                name = r[1]
                out.append((name, None, []))
            elif r and r[0] == "Address":
                header = r
                out[-1] = (name, header, out[-1][2])
            elif out and header and len(r) == len(header):
                out[-1][2].append(r)
    return out


def main():
    weights = float(sys.argv[2]) if len(sys.argv) > 2 else 0
    for name, h, rows in kernels(sys.argv[1]):
        if not rows:
            continue
        ie, st = h.index("Instructions Executed"), h.index("Warp Stall Sampling (All Samples)")
        reasons = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
        ops, stalls, why = collections.Counter(), collections.Counter(), collections.Counter()
        for r in rows:
            words = r[1].split()
            op = (words[1] if words and words[0].startswith("@") else words[0]).split(".")[0]
            ops[op] += int(r[ie] or 0)
            stalls[op] += int(r[st] or 0)
            for i in reasons:
                why[h[i][len("stall_"):]] += int(r[i] or 0)
        total, sampled = sum(ops.values()), sum(why.values()) or 1
        per = f", {32 * total / weights:.2f} thread instructions a weight" if weights else ""
        print(f"{name}: {total:,} warp instructions{per}")
        for op, n in ops.most_common(12):
            print(f"  {op:10s} {n / total:6.1%}  stall samples {stalls[op]}")
        print("  stalls: " + "  ".join(f"{k} {v / sampled:.0%}" for k, v in why.most_common(8)))


if __name__ == "__main__":
    main()
