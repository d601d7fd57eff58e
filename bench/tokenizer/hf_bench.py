#!/usr/bin/env python3
"""bench/tokenizer/hf_bench.py — HF `tokenizers` encode speed on the same files as tok-bench.

    python3 hf_bench.py [--ids-dir DIR] [-r REPEATS] MODEL_DIR FILE...

Prints the same lines as tok-bench (1 MB = 1e6 bytes, best of REPEATS):
  whole     Tokenizer.encode(file text), one thread
  lines     Tokenizer.encode(line) for each line (split at '\\n'), one thread
  lines-Nt  Tokenizer.encode_batch(lines) on N rayon threads (RAYON_NUM_THREADS or all CPUs)
With --ids-dir, compares the ids of "whole" with DIR/<file>.ids written by tok-bench.
"""
import argparse
import array
import os
import sys
import time

from tokenizers import Tokenizer


def best_of(repeats, fn):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids-dir")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("model_dir")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json"))
    print(f"{'load':12} {'':9} {time.perf_counter() - t0:8.3f} s    ({a.model_dir})")
    threads = int(os.environ.get("RAYON_NUM_THREADS", 0)) or os.cpu_count()
    status = 0
    for path in a.files:
        name = os.path.basename(path)
        raw = open(path, "rb").read()
        text = raw.decode("utf-8")
        t, enc = best_of(a.repeats, lambda: tok.encode(text, add_special_tokens=False))
        ids = enc.ids
        print(f"{name:12} {'whole':9} {len(raw) / t / 1e6:8.2f} MB/s  {len(raw):9d} bytes {len(ids):8d} ids  {t:.3f} s")
        if a.ids_dir:
            ours = array.array("i")
            with open(os.path.join(a.ids_dir, name + ".ids"), "rb") as f:
                ours.frombytes(f.read())
            if sys.byteorder != "little":
                ours.byteswap()
            ours = ours.tolist()
            if ours == ids:
                print(f"{name:12} ids identical to atlas ({len(ids)} ids)")
            else:
                diff = next((i for i, (x, y) in enumerate(zip(ours, ids)) if x != y), min(len(ours), len(ids)))
                print(f"{name:12} IDS DIFFER from atlas at index {diff} (atlas {len(ours)} ids, HF {len(ids)})")
                status = 1
        lines = text.split("\n")
        n_bytes = len(raw) - (len(lines) - 1)
        t, _ = best_of(a.repeats, lambda: [tok.encode(l, add_special_tokens=False) for l in lines])
        print(f"{name:12} {'lines':9} {n_bytes / t / 1e6:8.2f} MB/s  {n_bytes:9d} bytes  {t:.3f} s  ({len(lines)} lines)")
        t, _ = best_of(a.repeats, lambda: tok.encode_batch(lines, add_special_tokens=False))
        mode = f"lines-{threads}t"
        print(f"{name:12} {mode:9} {n_bytes / t / 1e6:8.2f} MB/s  {n_bytes:9d} bytes  {t:.3f} s  ({len(lines)} lines)")
    return status


if __name__ == "__main__":
    sys.exit(main())
