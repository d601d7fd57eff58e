#!/usr/bin/env python3
"""How far transformers itself moves from its float32 reference when it runs in bf16: the
conformance metric with transformers-bf16 in atlas's place (on the GPU machine).

    python3 tools/conformance/bf16_error.py DIR [DIR ...] [--kv fp8] [--max-len N] [--json F]

Each DIR is a conformance checkpoint with its reference beside it (reference.safetensors, or
reference-kvfp8.safetensors with --kv fp8): tests/data/small/NAME or the big set's
$CONF/NAME. The model is loaded with `from_pretrained(dtype=torch.bfloat16)` from the same
bf16 files (the weights as stored; the RoPE table as transformers builds it for bf16), with
the attention make.py used for the reference (an MXFP4 gpt-oss entry: its bf16 dequantization
in DIR's -float twin, as the reference was). For each stored length: the same prompt, the
same pieces, then the reference's forced tokens fed in turn; at each of the FORCED + 1
positions, transformers-bf16's top 8 ids are looked up among the reference's top 64 and the
largest |bf16 logprob - float32 logprob| is the cell's figure (inf when an id is not there),
exactly what atlas-conform computes for atlas. With --kv fp8, K and V are rounded as make.py's
Fp8KvCache rounds them for the FP8 reference.

A GPU path computes in bf16 as this does, so a cell's figure says how much of atlas's error on
it the shape itself explains: the small gpt-oss shape (swiglu's clamps reached) and an FP8
cache (a key near an e4m3 boundary flips code) move more than 5e-2 here too.
"""
import argparse
import json
import math
import os
import sys
import traceback

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make  # noqa: E402
import shapes  # noqa: E402

ATLAS_TOP = 8  # the ids atlas-conform compares: atlas's top 8


def spec_of(d):
    name = os.path.basename(os.path.normpath(d))
    for table in (shapes.BIG, shapes.SMALL):
        if name in table:
            return name, table[name]
    sys.exit(f"bf16_error: {d}: no shape named {name} in tools/conformance/shapes.py")


def weights_dir(d, name, spec):
    """The directory make.py's reference read: an MXFP4 gpt-oss entry's -float twin."""
    if spec["architectures"][0] == shapes.GPT_OSS and spec.get("experts") == "mxfp4":
        d = os.path.normpath(d)
        twin = os.path.join(os.path.dirname(d) + "-float", name)
        if not os.path.isdir(twin):
            sys.exit(f"bf16_error: {d}: its bf16 dequantization {twin} is missing (make.py "
                     "writes it beside the set)")
        return twin
    return d


def load_ref(path):
    ref = {}
    with safe_open(path, "pt") as st:
        for k in st.keys():
            ref[k] = st.get_tensor(k)
    return ref


def cell_error(logits, ids, lps):
    """max |lp_bf16(id) - lp_ref(id)| over bf16's top ATLAS_TOP ids; inf when one is not
    among the reference's stored ids."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    top = torch.topk(lp, ATLAS_TOP).indices.tolist()
    where = {int(i): float(v) for i, v in zip(ids.tolist(), lps.tolist())}
    worst = 0.0
    for i in top:
        if i not in where:
            return math.inf
        worst = max(worst, abs(float(lp[i]) - where[i]))
    return worst


@torch.no_grad()
def run_dir(d, kv, max_len):
    name, spec = spec_of(d)
    file = "reference-kvfp8.safetensors" if kv == "fp8" else "reference.safetensors"
    ref = load_ref(os.path.join(d, file))
    oss = spec["architectures"][0] == shapes.GPT_OSS
    eager = oss or spec.get("num_key_value_heads") == make.EAGER_KV_HEADS
    model = AutoModelForCausalLM.from_pretrained(
        weights_dir(d, name, spec), dtype=torch.bfloat16,
        attn_implementation="eager" if eager else "sdpa").cuda().eval()
    chunk = spec.get("chunk", make.EAGER_CHUNK if eager else 8192)
    lengths = sorted(int(k[1:-len(".prompt")]) for k in ref if k.endswith(".prompt"))
    rows = []
    for n in lengths:
        if max_len and n > max_len:
            continue
        seed, lo, hi = ref[f"L{n}.prompt"].tolist()
        forced = ref[f"L{n}.forced"].tolist()
        past, logits = make.prefill(model, shapes.prompt_ids(n, seed, lo, hi), chunk)
        worst = 0.0
        for j in range(len(forced) + 1):
            worst = max(worst, cell_error(logits, ref[f"L{n}.top_ids"][j],
                                          ref[f"L{n}.top_lp"][j]))
            if j == len(forced):
                break
            r = model(input_ids=torch.tensor([[forced[j]]], device="cuda"),
                      past_key_values=past, use_cache=True)
            past, logits = r.past_key_values, r.logits[0, -1]
        del past
        rows.append({"model": name, "kv": kv, "len": n, "bf16_err": worst})
        print(f"| {name} | {kv} | {n} | {worst:.2e} |", flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--kv", choices=["auto", "fp8"], default="auto")
    ap.add_argument("--max-len", type=int, default=0, help="skip longer prompts")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("| model | kv | prompt tokens | transformers bf16 vs fp32, top 8 |")
    print("|---|---|---|---|")
    rows, failed = [], 0
    for d in a.dirs:
        try:
            if a.kv == "fp8":
                with make.Fp8KvCache(make.kv_scales(d)):
                    rows += run_dir(d, a.kv, a.max_len)
            else:
                rows += run_dir(d, a.kv, a.max_len)
        except Exception:  # one shape's failure is reported and the others still run
            failed += 1
            print(f"bf16_error: {d}:", file=sys.stderr)
            traceback.print_exc()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
