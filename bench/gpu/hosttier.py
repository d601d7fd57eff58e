#!/usr/bin/env python3
"""bench/gpu/hosttier.py BASE COPY_S [SWAPS [FILLS]] -- issue 37's part 4 check against the
server at BASE serving models 'a' and 'b' with --max-resident 1: after both loaded once (with
FILLS 1, each time until the tier kept its image, which is filled after the load while the
model serves: atlas_host_tier_models), SWAPS swaps A->B and B->A, each timed from the request
for the model just released to its first token (a 1-token prompt, 1 token: the swap
and one step).  Prints one JSON line: each swap's time, the median and worst of the swaps to
B, the copy time COPY_S of B's weights measured by the caller, and whether the done line
(swap to B's first token <= COPY_S + 80 ms) holds."""
import json
import statistics
import sys
import time
import urllib.request


def first_token(base, model):
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    t = time.perf_counter() - t0
                    for _ in r:  # to the end of the stream
                        pass
                    return t
    raise SystemExit("no token from " + model)


def images(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("atlas_host_tier_models "):
                return float(line.split()[1])
    return 0


def wait_images(base, n, t0):
    """Seconds from t0 until the tier keeps n images (None after 120 s)."""
    while time.perf_counter() < t0 + 120:
        if images(base) >= n:
            return round(time.perf_counter() - t0, 2)
        time.sleep(0.1)
    return None


def main():
    base, copy_s = sys.argv[1], float(sys.argv[2])
    swaps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    fills = len(sys.argv) > 4 and sys.argv[4] == "1"
    fill_s = []
    t0 = time.perf_counter()
    first = [first_token(base, "a")]  # a loads (its image filled after the load)
    if fills:
        fill_s.append(wait_images(base, 1, t0))
    t0 = time.perf_counter()
    first.append(first_token(base, "b"))  # b loads in a's place
    if fills:
        fill_s.append(wait_images(base, 2, t0))
    to_a, to_b = [], []
    for _ in range(swaps):
        to_a.append(first_token(base, "a"))
        to_b.append(first_token(base, "b"))
    med = statistics.median(to_b)
    out = {"swap_to_b_s": [round(x, 4) for x in to_b], "swap_to_a_s": [round(x, 4) for x in to_a],
           "median_to_b_s": round(med, 4), "worst_to_b_s": round(max(to_b), 4),
           "copy_b_s": round(copy_s, 4), "bound_s": round(copy_s + 0.080, 4),
           "done": max(to_b) <= copy_s + 0.080,
           "first_loads_to_token_s": [round(x, 4) for x in first],
           "image_kept_after_s": fill_s}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
