#!/usr/bin/env python3
"""bench/serve/loadgen.py — load generator for `atlas serve` (or any OpenAI-compatible server) on
Python's standard library only (asyncio streams, HTTP/1.1 keep-alive, one connection per client),
for machines without Node such as the GPU machine; loadgen.mjs is its Node twin for the fixed
workload at fixed concurrency.

    python3 bench/serve/loadgen.py --url http://127.0.0.1:8080 --model A \\
        [--concurrency 1,8,64,256 | --rate 10,20,40] [--requests N] \\
        [--workload fixed|mixed|shared-prefix] [--input-len 128] [--output-len 128] \\
        [--prefix-len 2000] [--temperature 0.7 --top-p 0.95] [--procs N] \\
        [--config-json DIR/config.json --matrix-tflops T | --roofline-from FILE] \\
        [--swap-model B --swaps 3] [--api-key KEY] [--json out.json] [--id-range 1000-30000]

Each request is a streamed /v1/completions whose prompt is token ids drawn from --id-range
(seeded), with max_tokens and ignore_eos, so every request does the work asked whatever the
model writes.  Workloads:
  fixed          every prompt --input-len ids, every answer --output-len tokens;
  mixed          input lengths log-uniform over --mixed-input (default 32-2048) and output
                 lengths log-uniform over --mixed-output (default 16-512), independent, drawn
                 from --seed (means about 485 and 143 tokens);
  shared-prefix  every prompt one common prefix of --prefix-len ids (default 2,000) followed by
                 a distinct suffix of --input-len ids; answers --output-len tokens.
Greedy (temperature 0) unless --temperature is given (then --top-p too, default 1).
Arrivals: closed loop (--concurrency C: C clients, each sending its next request when its last
one ends) or open loop (--rate R: Poisson arrivals, exponential gaps of mean 1/R s, seeded;
--requests per rate, default R x --rate-seconds).
Per level: output tok/s and total tok/s (prompt + output tokens over the level's wall time),
TTFT (request sent to the first chunk with text) and inter-token latency (the gaps between
such chunks) p50/p90/p99, failed requests, and from /metrics scraped before and after the
level: preemptions (atlas_preemptions_total) and the prefix hit rate
(atlas_prefix_cache_hits_total / atlas_prefix_cache_queries_total).
Roofline (with the model's shape and a matrix rate): a level's FLOPs are
  prompt tokens x 2 x P + output tokens x 2 x (P + lm_head)
  + 4 x layers x attn_dim x (sum over tokens of the context each attends)
where P is the non-embedding parameters, attn_dim = q heads x head_dim, a prompt token at
position i attends i + 1 tokens and the j-th output token (from 0) P_len + j + 1; all over the
matrix rate gives the roofline time, and roofline tok/s = output tokens / that time; the ratio
is the roofline time over the measured wall time.  Prompt tokens are all of them, prefix-cache
hits included (work the cache saves counts as done: the ratio can pass 1 on shared prefixes).
Swap latency: with A resident, a request for B sent to B's first token (run the server with
--max-resident 1), then back to A.
"""
import argparse
import asyncio
import datetime
import json
import math
import multiprocessing
import os
import random
import sys
import time
import urllib.request
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
                if not line:
                    raise ConnectionError("the server closed the connection mid-response")
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

    async def completion(self, model, prompt, max_tokens, sampling=None):
        await self._connect()
        req = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        req.update(sampling or {})
        body = json.dumps(req).encode()
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
        buf, first, last, tokens, ptoks, failed, itl, raw = b"", 0.0, 0.0, 0, None, None, [], b""
        done = False
        async for piece in self._read_body(hdrs):
            if status != 200:
                raw += piece
                continue
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev == b"data: [DONE]":
                    done = True
                if not ev.startswith(b"data: ") or done:
                    continue
                # A plain token chunk is told apart without parsing it (one a token, at up to
                # tens of thousands a second: the client must not be what limits the rate).
                if b'"usage":null' in ev and b'"error"' not in ev and b'"text":"' in ev:
                    if b'"text":""' in ev:
                        continue
                else:
                    j = json.loads(ev[6:])
                    if j.get("error"):
                        failed = j["error"].get("message") or str(j["error"])
                    if j.get("usage"):
                        tokens = j["usage"]["completion_tokens"]
                        ptoks = j["usage"].get("prompt_tokens")
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
        if not done:
            raise RuntimeError("the stream ended without data: [DONE]")
        end = time.perf_counter()
        return {"ttft": first - t0 if first else float("nan"), "itl": itl, "e2e": end - t0,
                "end": end, "tokens": tokens, "prompt_tokens": ptoks if ptoks is not None else len(prompt)}


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def ms(x):
    return f"{x * 1000:.1f}"


# ---- workloads ----------------------------------------------------------------------------

def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


class Workload:
    """Makes the requests of a level: (prompt ids, max_tokens), from the seeded generators."""

    def __init__(self, a):
        self.a = a
        self.lo, self.hi = (int(x) for x in a.id_range.split("-"))
        self.rand = Rand(a.seed)  # the ids, as loadgen.mjs draws them
        self.lens = random.Random(a.seed)  # the mixed workload's lengths
        self.mi = [int(x) for x in a.mixed_input.split("-")]
        self.mo = [int(x) for x in a.mixed_output.split("-")]
        self.prefix = self.ids(a.prefix_len) if a.workload == "shared-prefix" else []

    def ids(self, n):
        return [self.lo + int(self.rand() * (self.hi - self.lo)) for _ in range(n)]

    def one(self):
        a = self.a
        if a.workload == "mixed":
            n_in, n_out = log_uniform(self.lens, *self.mi), log_uniform(self.lens, *self.mo)
            return self.ids(n_in), n_out
        return self.prefix + self.ids(a.input_len), a.output_len

    def describe(self):
        a = self.a
        if a.workload == "mixed":
            return (f"mixed: input log-uniform {a.mixed_input}, output log-uniform {a.mixed_output} "
                    f"tokens, seed {a.seed}")
        if a.workload == "shared-prefix":
            return f"shared-prefix: {a.prefix_len} common + {a.input_len} own prompt tokens, {a.output_len} out"
        return f"fixed: {a.input_len} in, {a.output_len} out"


# ---- one level: its requests run by one or several client processes -------------------------

class Counter:
    """The next request of a closed-loop level, shared by the client processes."""

    def __init__(self, shared):
        self.v = multiprocessing.get_context("fork").Value("l", 0) if shared else None
        self.n = 0

    def next(self):
        if self.v is None:
            self.n += 1
            return self.n - 1
        with self.v.get_lock():
            self.v.value += 1
            return self.v.value - 1


async def run_share(lv, k, nproc):
    """Process k's part of a level: its clients (closed loop) or its arrivals (Poisson)."""
    a, reqs, out = lv["a"], lv["reqs"], []
    host, port, headers = lv["addr"]

    async def one(c, i):
        prompt, n = reqs[i]
        t = time.perf_counter()
        try:
            r = await c.completion(a.model, prompt, n, lv["sampling"])
        except Exception as e:  # noqa: BLE001 — every failure is counted, whatever it is
            await c.close()
            r = {"error": str(e) or type(e).__name__, "end": time.perf_counter(), "e2e": time.perf_counter() - t}
        r["i"] = i
        out.append(r)

    made = []

    def client():
        made.append(Client(host, port, headers))
        return made[-1]

    async def closed_loop():
        conc = lv["conc"]

        async def worker(c):
            while (i := lv["counter"].next()) < len(reqs):
                await one(c, i)

        await asyncio.gather(*(worker(client()) for _ in range(conc // nproc + (k < conc % nproc))))

    async def poisson():
        idle, tasks = [], []

        async def open_one(i):
            c = idle.pop() if idle else client()
            await one(c, i)
            idle.append(c)

        try:
            for i in range(k, len(reqs), nproc):
                delay = lv["start"] + lv["arrivals"][i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(open_one(i)))
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:  # cut while still sending: the requests out go too
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    delay = lv["start"] - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    drive, cut = closed_loop() if lv["arrivals"] is None else poisson(), False
    try:
        if lv["deadline"] is None:
            await drive
        else:  # past the deadline, requests still running are dropped and the level marked cut
            await asyncio.wait_for(drive, max(0.0, lv["deadline"] - time.perf_counter()))
    except asyncio.TimeoutError:
        cut = True
    finally:
        for c in made:
            await c.close()
    return {"recs": out, "cut": cut}


def child(lv, k, nproc, conn):
    try:
        conn.send(asyncio.run(run_share(lv, k, nproc)))
    except BaseException as e:  # noqa: BLE001 — the parent reports it
        conn.send(e)
    conn.close()


def run_records(lv, nproc):
    """Runs a level in this process (nproc 1) or in nproc forked ones; every request's record."""
    lv["counter"] = Counter(nproc > 1)
    lv["start"] = time.perf_counter() + (0.3 if nproc > 1 else 0.0)  # the processes start together
    if nproc == 1:
        got = asyncio.run(run_share(lv, 0, 1))
        return got["recs"], got["cut"]
    ctx = multiprocessing.get_context("fork")
    pipes, procs, recs, cut = [], [], [], False
    for k in range(nproc):
        rd, wr = ctx.Pipe(False)
        p = ctx.Process(target=child, args=(lv, k, nproc, wr))
        p.start()
        wr.close()
        pipes.append(rd)
        procs.append(p)
    for rd in pipes:
        got = rd.recv()
        if isinstance(got, BaseException):
            raise got
        recs += got["recs"]
        cut = cut or got["cut"]
    for p in procs:
        p.join()
    return recs, cut


# ---- /metrics and the roofline --------------------------------------------------------------

def scrape(url, headers):
    """The unlabelled samples of /metrics, or {} where there is none."""
    try:
        req = urllib.request.Request(url.rstrip("/") + "/metrics", headers=headers)
        text = urllib.request.urlopen(req, timeout=30).read().decode()
    except (OSError, ValueError):
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def shape_from_config(path):
    """Non-embedding parameters, lm_head, layers and attention width of a Llama-shaped
    config.json (norms counted, biases not: they are far below a percent)."""
    c = json.load(open(path))
    c = c.get("text_config", c)
    h, L = c["hidden_size"], c["num_hidden_layers"]
    nh = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = c.get("head_dim") or h // nh
    q, kv = nh * hd, nkv * hd
    layer = h * q + 2 * h * kv + q * h + 3 * h * c["intermediate_size"] + 2 * h
    return {"params": L * layer + h, "lm_head": c["vocab_size"] * h, "layers": L, "attn_dim": q}


def level_flops(shape, recs):
    P, lm, L, d = shape["params"], shape["lm_head"], shape["layers"], shape["attn_dim"]
    f = 0.0
    for r in recs:
        p, o = r["prompt_tokens"], r["tokens"]
        ctx = p * (p + 1) / 2 + o * p + o * (o + 1) / 2
        f += p * 2 * P + o * 2 * (P + lm) + 4 * L * d * ctx
    return f


ROOFLINE_TEXT = ("roofline FLOPs = prompt tokens x 2 x P + output tokens x 2 x (P + lm_head) + "
                 "4 x layers x attn_dim x sum(context of each token); P = non-embedding parameters")


def summarize(a, lv, recs, before, after, roof):
    ok = [r for r in recs if "error" not in r]
    bad = [r for r in recs if "error" in r]
    ends = [r["end"] for r in recs]
    wall = (max(ends) - lv["start"]) if ends else float("nan")
    toks = sum(r["tokens"] for r in ok)
    ptoks = sum(r["prompt_tokens"] for r in ok)
    itl = [x for r in ok for x in r["itl"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] == r["ttft"]]
    e2e = [r["e2e"] for r in ok]
    # a stream's own pace once it runs: tokens after the first over the time after it
    dec_t = sum(r["e2e"] - r["ttft"] for r in ok if r["tokens"] > 1 and r["ttft"] == r["ttft"])
    dec_n = sum(r["tokens"] - 1 for r in ok if r["tokens"] > 1 and r["ttft"] == r["ttft"])
    q = lambda xs: {"p50": ms(pct(xs, 50)), "p90": ms(pct(xs, 90)), "p99": ms(pct(xs, 99))}
    d = lambda k: after[k] - before[k] if k in after and k in before else None
    qs, hits = d("atlas_prefix_cache_queries_total"), d("atlas_prefix_cache_hits_total")
    out = {"workload": a.workload, "mode": lv["mode"], "requests": len(recs), "failed": len(bad),
           "requests_planned": len(lv["reqs"]),
           "wall_s": wall, "prompt_tokens": ptoks, "output_tokens": toks,
           "output_tok_s": toks / wall, "total_tok_s": (toks + ptoks) / wall, "req_s": len(ok) / wall,
           "stream_decode_tok_s": dec_n / dec_t if dec_t > 0 else None,
           "ttft_ms": q(ttft), "itl_ms": q(itl), "e2e_ms": q(e2e),
           "preemptions": d("atlas_preemptions_total"),
           "prefix_queries": qs, "prefix_hits": hits,
           "prefix_hit_rate": hits / qs if qs else None,
           "prompt_tokens_computed": d("atlas_prompt_tokens_total"),
           "failures": sorted({r["error"] for r in bad})[:5]}
    out.update({"concurrency": lv["conc"]} if lv["arrivals"] is None else {"rate": lv["rate"]})
    if roof and ok:
        t = level_flops(roof, ok) / (roof["matrix_tflops"] * 1e12)
        out.update({"roofline_s": t, "roofline_output_tok_s": toks / t, "roofline_ratio": t / wall})
    return out


def print_level(r, header=False):
    if header:
        print("workload      mode     conc/rate  reqs fail   out tok/s  total tok/s  TTFT p50/p99 ms   "
              "ITL p50/p99 ms   preempt  prefix hit  roofline tok/s  ratio")
    where = f"c={r['concurrency']}" if "concurrency" in r else f"r={r['rate']:g}/s"
    hit = f"{100 * r['prefix_hit_rate']:.1f}%" if r["prefix_hit_rate"] is not None else "-"
    pre = f"{r['preemptions']:.0f}" if r["preemptions"] is not None else "-"
    roof = (f"{r['roofline_output_tok_s']:14.0f}  {100 * r['roofline_ratio']:4.1f}%"
            if "roofline_ratio" in r else f"{'-':>14}  -")
    t, i = r["ttft_ms"], r["itl_ms"]
    print(f"{r['workload']:<13} {r['mode']:<8} {where:<10} {r['requests']:5d} {r['failed']:4d} "
          f"{r['output_tok_s']:11.1f} {r['total_tok_s']:12.1f}  " + f"{t['p50']}/{t['p99']}".ljust(18)
          + f"{i['p50']}/{i['p99']}".ljust(17) + f"{pre:>7}  {hit:>10}  {roof}", flush=True)
    for f in r["failures"]:
        print(f"    failed: {f}", flush=True)
    if r.get("cut"):
        print("    cut at --deadline: requests still running were dropped", flush=True)


# ---- options and the run ---------------------------------------------------------------------

def roofline_of(a):
    roof = {}
    if a.roofline_from:
        got = json.load(open(a.roofline_from))
        roof.update(got.get("roofline", got))
    if a.config_json:
        roof.update(shape_from_config(a.config_json))
    for k in ("params", "lm_head", "layers", "matrix_tflops"):
        if getattr(a, k) is not None:
            roof[k] = getattr(a, k)
    if a.hidden is not None:
        roof["attn_dim"] = a.hidden
    need = ("params", "lm_head", "layers", "attn_dim", "matrix_tflops")
    if not roof:
        return None
    missing = [k for k in need if roof.get(k) is None]
    if missing:
        sys.exit(f"loadgen: the roofline needs {', '.join(missing)} too (--params, --lm-head, "
                 "--layers, --hidden, --matrix-tflops, or --config-json / --roofline-from)")
    return {k: roof[k] for k in need}


def options():
    head, _, rest = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(description=head.replace("\n", " "), epilog=rest,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,8", help="closed-loop levels (default 1,8)")
    ap.add_argument("--rate", help="Poisson levels in requests/s, e.g. 10,20,40 (instead of --concurrency)")
    ap.add_argument("--rate-seconds", type=float, default=10.0,
                    help="a Poisson level's default length: requests = rate x this (default 10)")
    ap.add_argument("--requests",
                    help="requests a level, or one a level: N1,N2,... (default: closed loop "
                         "2 x concurrency, at least 8; Poisson rate x --rate-seconds)")
    ap.add_argument("--workload", choices=("fixed", "mixed", "shared-prefix"), default="fixed")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefix-len", type=int, default=2000, help="shared-prefix: common prefix (2000)")
    ap.add_argument("--mixed-input", default="32-2048", help="mixed: input lengths, log-uniform (32-2048)")
    ap.add_argument("--mixed-output", default="16-512", help="mixed: output lengths, log-uniform (16-512)")
    ap.add_argument("--temperature", type=float, help="sampled mode (default: greedy)")
    ap.add_argument("--top-p", type=float, help="with --temperature (default 1)")
    ap.add_argument("--id-range", default="1000-30000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--procs", type=int,
                    help="client processes a level (default: 1 up to 16 clients or 4 req/s, "
                         "else up to 8 with half the cores)")
    ap.add_argument("--params", type=float, help="roofline: non-embedding parameters")
    ap.add_argument("--lm-head", type=float, help="roofline: lm_head parameters (vocab x hidden)")
    ap.add_argument("--layers", type=int, help="roofline: layers")
    ap.add_argument("--hidden", type=int, help="roofline: attention width, q heads x head_dim")
    ap.add_argument("--matrix-tflops", type=float, help="roofline: matrix rate, TFLOP/s")
    ap.add_argument("--config-json", help="roofline: the shape from a model's config.json")
    ap.add_argument("--roofline-from", help="roofline: a JSON with params, lm_head, layers, "
                    "attn_dim, matrix_tflops (this script's --json output has it as 'roofline')")
    ap.add_argument("--label", help="a name for the run, kept in the JSON")
    ap.add_argument("--deadline", type=float,
                    help="seconds from the start: no level starts after it, and a level running "
                         "then is cut (its running requests dropped, the level marked cut)")
    ap.add_argument("--swap-model")
    ap.add_argument("--swaps", type=int, default=3)
    ap.add_argument("--api-key")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.temperature is None and a.top_p is not None:
        ap.error("--top-p needs --temperature (greedy ignores it)")
    if a.workload == "mixed" and (a.input_len != 128 or a.output_len != 128):
        ap.error("--workload mixed draws its lengths: use --mixed-input / --mixed-output")
    return a


def main():
    a = options()
    u = urlsplit(a.url)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    addr = (u.hostname, u.port or 80, headers)
    roof = roofline_of(a)
    sampling = ({"temperature": a.temperature, "top_p": a.top_p if a.top_p is not None else 1.0}
                if a.temperature is not None else {})
    mode = "sampled" if sampling else "greedy"
    wl = Workload(a)
    cores = os.cpu_count() or 1

    async def solo(model, n, prompt=None):
        c = Client(*addr)
        try:
            return await c.completion(model, prompt or wl.ids(a.input_len), n)
        finally:
            await c.close()

    report = {"url": a.url, "model": a.model, "label": a.label, "workload": a.workload,
              "workload_text": wl.describe(), "mode": mode, "sampling": sampling,
              "input_len": a.input_len, "output_len": a.output_len, "seed": a.seed,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "levels": [],
              "roofline": roof, "roofline_formula": ROOFLINE_TEXT, "skipped": [],
              "client": "bench/serve/loadgen.py"}
    deadline = time.perf_counter() + a.deadline if a.deadline else None
    asyncio.run(solo(a.model, 2))  # warm-up: load the model
    print(f"# {wl.describe()}; {mode}" + (f" {sampling}" if sampling else ""))
    if roof:
        print(f"# {ROOFLINE_TEXT}\n#   P {roof['params']:.4g}, lm_head {roof['lm_head']:.4g}, "
              f"layers {roof['layers']}, attn_dim {roof['attn_dim']}, matrix {roof['matrix_tflops']:g} TFLOP/s")
    levels = ([("rate", float(x)) for x in a.rate.split(",")] if a.rate
              else [("conc", int(x)) for x in a.concurrency.split(",")])
    counts = [int(x) for x in a.requests.split(",")] if a.requests else []
    if len(counts) > 1 and len(counts) != len(levels):
        sys.exit(f"loadgen: --requests has {len(counts)} counts for {len(levels)} levels")
    for n, (kind, v) in enumerate(levels):
        count = (counts[n if len(counts) > 1 else 0] if counts else
                 max(int(v) * 2, 8) if kind == "conc" else max(8, round(v * a.rate_seconds)))
        if deadline is not None and time.perf_counter() >= deadline:
            report["skipped"].append(f"{kind} {v:g}")
            print(f"skipped {kind} {v:g}: past --deadline", flush=True)
            continue
        lv = {"a": a, "addr": addr, "sampling": sampling, "mode": mode, "deadline": deadline,
              "reqs": [wl.one() for _ in range(count)], "conc": int(v) if kind == "conc" else None,
              "rate": v if kind == "rate" else None, "arrivals": None}
        if kind == "rate":
            rng, t, lv["arrivals"] = random.Random(a.seed * 1000003 + n), 0.0, []
            for _ in range(count):
                t += rng.expovariate(v)
                lv["arrivals"].append(t)
        busy = v > 16 if kind == "conc" else v > 4
        nproc = a.procs or (min(8, max(1, cores // 2)) if busy else 1)
        nproc = max(1, min(nproc, int(v) if kind == "conc" else count))
        before = scrape(a.url, headers)
        recs, cut = run_records(lv, nproc)
        r = summarize(a, lv, recs, before, scrape(a.url, headers), roof)
        r["client_procs"], r["cut"] = nproc, cut
        report["levels"].append(r)
        print_level(r, header=n == 0)
        if a.json:  # after every level: a run stopped from outside keeps what it measured
            with open(a.json, "w") as f:
                json.dump(report, f, indent=2)
    if a.swap_model:
        report["swaps"] = []
        asyncio.run(solo(a.model, 1))  # A resident
        for _ in range(a.swaps):
            to_b = asyncio.run(solo(a.swap_model, 1))["ttft"]
            to_a = asyncio.run(solo(a.model, 1))["ttft"]
            report["swaps"].append({"a_to_b_s": to_b, "b_to_a_s": to_a})
            print(f"swap: {a.model} -> {a.swap_model} first token {ms(to_b)} ms; back {ms(to_a)} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if any(r["failed"] for r in report["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
