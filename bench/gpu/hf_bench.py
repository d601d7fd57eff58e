#!/usr/bin/env python3
"""HF transformers on the same checkpoint as `atlas bench`, for the ratio issue 4 asks for:
prefill tok/s (median of 3 after a warm-up) and batch-1 greedy decode tok/s (eager, dynamic
cache: transformers' default), timed with CUDA synchronisation.

  python3 bench/gpu/hf_bench.py DIR [-p 512] [-n 128]"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.bfloat16, device_map="cuda")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.bfloat16,
                                                     device_map="cuda")
    model.eval()
    load_s = time.time() - t0
    V = model.config.vocab_size
    ids = (torch.arange(a.p, device="cuda") * 2654435761 + 17) % V
    ids = ids.unsqueeze(0)
    times = []
    with torch.no_grad():
        model(ids)
        for _ in range(3):
            torch.cuda.synchronize()
            s = time.time()
            model(ids)
            torch.cuda.synchronize()
            times.append(time.time() - s)
        times.sort()
        prefill = a.p / times[1]
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        s = time.time()
        model.generate(ids, max_new_tokens=a.n, min_new_tokens=a.n, do_sample=False)
        torch.cuda.synchronize()
        total = time.time() - s
    decode = a.n / (total - times[1])  # generate's prefill taken out
    print(json.dumps({"engine": "transformers eager", "load_s": round(load_s, 1),
                      "prefill_tokens": a.p, "prefill_tok_s": round(prefill, 1),
                      "decode_tokens": a.n, "decode_tok_s": round(decode, 1)}))


if __name__ == "__main__":
    main()
