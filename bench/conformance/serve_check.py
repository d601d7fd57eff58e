#!/usr/bin/env python3
"""The conformance suite through `atlas serve`: each model's prompts sent 8 at once (mixed
lengths) as /v1/completions with token-id prompts, temperature 0, logprobs 8, max_tokens
FORCED + 1 and return_tokens_as_token_ids, compared with the model dir's
reference.safetensors (tools/conformance/make.py).  The server has no teacher forcing: the
first position is always compared, a later one while atlas's greedy tokens before it are the
reference's.  For each of atlas's top 8 ids: |logprob - reference| <= --bound (an id absent
from the reference's top K fails).

    python3 bench/conformance/serve_check.py --url http://127.0.0.1:8090 [--bound 5e-2] \\
        NAME=DIR ...
Standard library only.  Prints one line a (model, length); exits 1 on any failure.
"""
import argparse
import concurrent.futures
import json
import os
import struct
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "conformance"))
import shapes  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        fmt = {"I32": "i", "F32": "f"}[v["dtype"]]
        out[k] = (v["shape"], struct.unpack(f"<{len(raw) // 4}{fmt}", raw))
    return out


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def check(url, name, ref, n, bound):
    seed, lo, hi = ref[f"L{n}.prompt"][1]
    forced = ref[f"L{n}.forced"][1]
    (_, k), ids = ref[f"L{n}.top_ids"]
    lps = ref[f"L{n}.top_lp"][1]
    body = {"model": name, "prompt": shapes.prompt_ids(n, seed, lo, hi), "temperature": 0,
            "max_tokens": len(forced) + 1, "logprobs": 8, "ignore_eos": True,
            "return_tokens_as_token_ids": True}
    try:
        lp = post(url, body)["choices"][0]["logprobs"]
    except urllib.error.HTTPError as e:
        return n, float("inf"), 0, f"HTTP {e.code}: {e.read()[:200]!r}"
    except (OSError, ValueError, KeyError, IndexError) as e:  # refused, cut, not JSON
        return n, float("inf"), 0, f"{type(e).__name__}: {e}"
    worst, compared = 0.0, 0
    for p, top in enumerate(lp["top_logprobs"]):
        if p > 0 and int(lp["tokens"][p - 1][9:]) != forced[p - 1]:
            break  # atlas chose another token: later positions see another prefix
        compared += 1
        row = dict(zip(ids[p * k:(p + 1) * k], lps[p * k:(p + 1) * k]))
        if len(top) < 8:
            return n, float("inf"), compared, f"position {p}: {len(top)} top logprobs"
        for key, v in top.items():
            r = row.get(int(key[9:]))
            worst = max(worst, abs(v - r) if r is not None else float("inf"))
    return n, worst, compared, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--bound", type=float, default=5e-2)
    ap.add_argument("--markdown")
    ap.add_argument("--label", default="serve", help="the rows' device column")
    ap.add_argument("--reference", default="reference.safetensors",
                    help="the file in each DIR (reference-kvfp8.safetensors for a server run "
                         "with --kv-cache-dtype fp8)")
    ap.add_argument("models", nargs="+", help="NAME=DIR")
    a = ap.parse_args()
    bad = 0
    md = open(a.markdown, "a") if a.markdown else None
    for spec in a.models:
        name, d = spec.split("=", 1)
        ref = read_safetensors(os.path.join(d, a.reference))
        lengths = sorted(int(key[1:].split(".")[0]) for key in ref if key.endswith(".prompt"))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            rows = list(pool.map(lambda n: check(a.url, name, ref, n, a.bound), lengths))
        for n, worst, compared, msg in rows:
            ok = worst <= a.bound
            bad += not ok
            print(f"{name:20s} {a.label} {n:6d} tokens: max |dlogprob| {worst:.2e} over {compared} "
                  f"positions  {'pass' if ok else 'FAIL'} {msg}", flush=True)
            if md:
                md.write(f"| {name} | {a.label} | {n} | {worst:.2e} ({compared} positions) | "
                         f"{'pass' if ok else '**fail**'} |\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
