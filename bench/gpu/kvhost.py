#!/usr/bin/env python3
"""bench/gpu/kvhost.py BASE [WORDS] -- a conversation of about WORDS tokens resumed on model
'a' of the server at BASE after a swap to 'b' and back; prints one JSON line: the turns'
time to first token (resident, after the swap back, and the swap's own request), their
prompt and cached tokens.  bench/gpu/kvhost.sh runs it against servers with and without
--host-cache."""
import json
import random
import sys
import time
import urllib.request

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name").split()


def stream(base, model, prompt, max_tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += c.get("text", "")
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft_ms": round(ttft * 1e3, 2), "prompt": (usage or {}).get("prompt_tokens"),
            "cached": cached}, text


def main():
    base = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    rng = random.Random(7)
    convo = " ".join(rng.choice(WORDS) for _ in range(n))
    out = {}
    out["turn1"], a1 = stream(base, "a", convo, 16)
    convo += a1 + " And then?"
    out["resident"], a2 = stream(base, "a", convo, 16)
    convo += a2 + " What next?"
    stream(base, "b", "Hello there", 4)                 # a swaps out
    out["swap_back"], _ = stream(base, "a", "Hi", 1)    # and in again: the swap alone
    out["resumed"], _ = stream(base, "a", convo, 16)    # the conversation goes on
    print(json.dumps(out))


if __name__ == "__main__":
    main()
