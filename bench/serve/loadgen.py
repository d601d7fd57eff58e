#!/usr/bin/env python3
"""bench/serve/loadgen.py — loadgen.mjs for machines without Node (the GPU machine): the same
requests, options and output, on Python's standard library only (asyncio streams, HTTP/1.1
keep-alive, one connection per concurrent client).

    python3 bench/serve/loadgen.py --url http://127.0.0.1:8080 --model A \\
        [--concurrency 1,8,64,256] [--requests N] [--input-len 128] [--output-len 128] \\
        [--swap-model B --swaps 3] [--api-key KEY] [--json out.json] [--id-range 1000-30000]

Each request is a streamed /v1/completions with a prompt of exactly --input-len token ids and
max_tokens --output-len with ignore_eos, temperature 0.  TTFT: request sent to the first
chunk with text; ITL: the gaps between such chunks; swap latency: with A resident, a request
for B sent to B's first token (run the server with --max-resident 1), then back to A.
"""
import argparse
import asyncio
import datetime
import json
import sys
import time
from urllib.parse import urlsplit


class Rand:
    """The generator of loadgen.mjs, so that both send the same prompts for a seed."""

    def __init__(self, seed):
        self.s = seed

    def __call__(self):
        self.s = (self.s * 1103515245 + 12345) % 2147483648
        return self.s / 2147483648


class Client:
    """One keep-alive connection; requests run one after the other on it."""

    def __init__(self, host, port, headers):
        self.host, self.port, self.headers = host, port, headers
        self.r = self.w = None

    async def _connect(self):
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def close(self):
        if self.w is not None:
            self.w.close()
            try:
                await self.w.wait_closed()
            except OSError:
                pass
            self.r = self.w = None

    async def _read_body(self, resp_headers):
        """Yields body pieces as they arrive (chunked or Content-Length)."""
        if resp_headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await self.r.readline()
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    await self.r.readline()  # the blank line after the last chunk
                    return
                data = await self.r.readexactly(n)
                await self.r.readexactly(2)
                yield data
        else:
            n = int(resp_headers.get("content-length", "0"))
            if n:
                yield await self.r.readexactly(n)

    async def completion(self, model, prompt, max_tokens):
        await self._connect()
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                           "ignore_eos": True, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
        for k, v in self.headers.items():
            head += f"{k}: {v}\r\n"
        t0 = time.perf_counter()
        self.w.write((head + "\r\n").encode() + body)
        await self.w.drain()
        status_line = await self.r.readline()
        if not status_line:
            raise RuntimeError("the server closed the connection")
        status = int(status_line.split()[1])
        hdrs = {}
        while True:
            line = await self.r.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        buf, first, last, tokens, failed, itl, raw = b"", 0.0, 0.0, 0, None, [], b""
        async for piece in self._read_body(hdrs):
            if status != 200:
                raw += piece
                continue
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                    continue
                j = json.loads(ev[6:])
                if j.get("error"):
                    failed = j["error"].get("message")
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
                ch = j.get("choices") or []
                if not ch or not ch[0].get("text"):
                    continue
                now = time.perf_counter()
                if not first:
                    first = now
                else:
                    itl.append(now - last)
                last = now
        if hdrs.get("connection", "").lower() == "close":
            await self.close()
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {raw.decode(errors='replace')[:300]}")
        if failed:
            raise RuntimeError(failed)
        return {"ttft": first - t0, "itl": itl, "e2e": time.perf_counter() - t0, "tokens": tokens}


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def ms(x):
    return f"{x * 1000:.1f}"


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--id-range", default="1000-30000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--swap-model")
    ap.add_argument("--swaps", type=int, default=3)
    ap.add_argument("--api-key")
    ap.add_argument("--json")
    a = ap.parse_args()
    u = urlsplit(a.url)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    lo, hi = (int(x) for x in a.id_range.split("-"))
    rand = Rand(a.seed)

    def prompt():
        return [lo + int(rand() * (hi - lo)) for _ in range(a.input_len)]

    solo = Client(u.hostname, u.port or 80, headers)

    async def one(model, n=a.output_len):
        return await solo.completion(model, prompt(), n)

    async def level(conc):
        total = a.requests or max(conc * 2, 8)
        issued, results = 0, []
        clients = [Client(u.hostname, u.port or 80, headers) for _ in range(conc)]

        async def worker(c):
            nonlocal issued
            while issued < total:
                issued += 1
                results.append(await c.completion(a.model, prompt(), a.output_len))

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(worker(c) for c in clients))
        finally:
            for c in clients:
                await c.close()
        wall = time.perf_counter() - t0
        toks = sum(r["tokens"] for r in results)
        itl = [x for r in results for x in r["itl"]]
        ttft = [r["ttft"] for r in results]
        e2e = [r["e2e"] for r in results]
        q = lambda xs: {"p50": ms(pct(xs, 50)), "p90": ms(pct(xs, 90)), "p99": ms(pct(xs, 99))}
        return {"concurrency": conc, "requests": total, "wall_s": wall, "output_tok_s": toks / wall,
                "total_tok_s": (toks + total * a.input_len) / wall, "req_s": total / wall,
                "ttft_ms": q(ttft), "itl_ms": q(itl), "e2e_ms": q(e2e)}

    report = {"url": a.url, "model": a.model, "input_len": a.input_len, "output_len": a.output_len,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "levels": [],
              "client": "bench/serve/loadgen.py"}
    await one(a.model, 2)  # warm-up: load the model
    print("conc  reqs   out tok/s  total tok/s   TTFT p50/p90/p99 ms        ITL p50/p90/p99 ms      E2E p50/p99 ms")
    for c in (int(x) for x in a.concurrency.split(",")):
        r = await level(c)
        report["levels"].append(r)
        t, i, e = r["ttft_ms"], r["itl_ms"], r["e2e_ms"]
        print(f"{c:4d} {r['requests']:5d} {r['output_tok_s']:11.1f} {r['total_tok_s']:12.1f}   "
              + f"{t['p50']}/{t['p90']}/{t['p99']}".ljust(26) + f"{i['p50']}/{i['p90']}/{i['p99']}".ljust(24)
              + f"{e['p50']}/{e['p99']}", flush=True)
    if a.swap_model:
        await one(a.model, 1)  # A resident
        report["swaps"] = []
        for _ in range(a.swaps):
            to_b = (await one(a.swap_model, 1))["ttft"]
            to_a = (await one(a.model, 1))["ttft"]
            report["swaps"].append({"a_to_b_s": to_b, "b_to_a_s": to_a})
            print(f"swap: {a.model} -> {a.swap_model} first token {ms(to_b)} ms; back {ms(to_a)} ms", flush=True)
    await solo.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
