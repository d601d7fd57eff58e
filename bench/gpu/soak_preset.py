#!/usr/bin/env python3
"""bench/gpu/soak_preset.py — the models file and the memory budget of bench/gpu/soak.sh.

    python3 bench/gpu/soak_preset.py --out models.json --kv-unit 1 \\
        big=DIR mid=DIR one=DIR small=DIR

Writes a --models-preset file giving the four models their own settings (context, --parallel,
KV memory and dtype, step budget, keep-alive; "one" pinned and loaded at start), and prints
the --memory-budget in GiB on its first line, then one line a model with what the engine will
count it as taking before its first load (engine/pools.c: its *.safetensors bytes and its KV
pool in whole blocks of 16 tokens, capped at context x parallel).  The budget holds the pinned
model beside the largest other one, and half the smallest one's room more: the pinned model
fits beside any one other, the largest never beside a second one, so every request for the
largest while the others are resident is a swap and the other way round.  --kv-unit scales
the KV memory of the table (GiB; 1/1024 for the test fixtures on a CPU).  Exit status 2 when
the models' sizes do not give those swaps (the table says why)."""
import argparse
import json
import math
import os
import sys

# name: settings (kv_memory in --kv-unit); "big" must be the largest, "one" is pinned
SETTINGS = {
    "big": dict(ctx_size=1024, parallel=32, kv_dtype="bf16", kv_memory=4, batch_tokens=512,
                keep_alive="10m"),
    "mid": dict(ctx_size=4096, parallel=32, kv_dtype="fp8", kv_memory=1, batch_tokens=256,
                keep_alive="5m"),
    "one": dict(ctx_size=8192, parallel=64, kv_dtype="bf16", kv_memory=2, pinned=True,
                load=True, keep_alive=-1),
    "small": dict(ctx_size=512, parallel=16, kv_dtype="bf16", kv_memory=0.5, batch_tokens=128,
                  keep_alive="30s"),
}
PINNED = "one"
GIB = 1 << 30


def weights(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.endswith(".safetensors") and f != "reference.safetensors")


def estimate(d, s):
    c = json.load(open(os.path.join(d, "config.json")))
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    elem = {"bf16": 2, "fp8": 1}[s["kv_dtype"]]
    token = 2 * elem * c["num_hidden_layers"] * kv_heads * head_dim
    blocks = min(int(s["kv_memory"] * GIB // (16 * token)),
                 math.ceil(s["ctx_size"] / 16) * s["parallel"])
    return weights(d) + blocks * 16 * token


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-unit", type=float, default=1.0)
    ap.add_argument("models", nargs="+", help="NAME=DIR for " + ", ".join(SETTINGS))
    a = ap.parse_args()
    dirs = dict(m.split("=", 1) for m in a.models)
    if sorted(dirs) != sorted(SETTINGS):
        sys.exit(f"soak_preset.py: give {', '.join(SETTINGS)}")
    models, est = [], {}
    for name, s in SETTINGS.items():
        s = dict(s, kv_memory=s["kv_memory"] * a.kv_unit)
        models.append(dict(name=name, dir=os.path.abspath(dirs[name]), **s))
        est[name] = estimate(dirs[name], s)
    others = sorted((n for n in est if n != PINNED), key=est.get)
    largest, smallest = others[-1], others[0]
    budget = est[PINNED] + est[largest] + est[smallest] // 2
    print(f"{budget / GIB:.4f}")
    for n in SETTINGS:
        print(f"{n}: {est[n] / GIB:.3f} GiB ({weights(dirs[n]) / GIB:.3f} of weights)")
    rest = sum(est[n] for n in others[:-1])
    if largest != "big" or est[PINNED] + rest > budget:
        print(f"soak_preset.py: these models give no swaps of the largest: {largest} is the "
              f"largest (want big), {PINNED} beside all the others takes "
              f"{(est[PINNED] + rest) / GIB:.3f} GiB of {budget / GIB:.3f}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump({"models": models}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
