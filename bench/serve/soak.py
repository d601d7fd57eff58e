#!/usr/bin/env python3
"""bench/serve/soak.py — soak.mjs for machines without Node (the GPU machine): the same
options, requests, checks, output and exit status, on Python's standard library only
(asyncio streams, HTTP/1.1 keep-alive, one connection per client, a new one after a hang-up).

    python3 bench/serve/soak.py --url http://127.0.0.1:8080 --models a,b,c [--streams 64] \\
        [--swaps 200] [--duration 300] [--disconnect 0.15] [--max-tokens 4-32] [--seed 1] \\
        [--pid PID] [--api-key KEY] [--json out.json]

--streams clients stream at once, each request for a model drawn at random, a share of them
(--disconnect) hanging up before the response, after its headers or after a random number of
events, until --swaps swaps happened (atlas_model_swaps_total in /metrics, else its loads) or --duration
seconds passed.  Every request not hung up on must be well-formed (soak.mjs says what that
means).  Exit status 0 when none failed and the swap target (if any) was met.
"""
import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from urllib.parse import urlsplit

WORDS = ("the a swap model stream token river stone light night queen soak memory "
         "engine cache block page thread socket answer question again more three").split()


class Rand:
    """mulberry32, as soak.mjs: a seed gives the same sequence in both."""

    def __init__(self, seed):
        self.a = seed & 0xFFFFFFFF

    def __call__(self):
        def imul(x, y):
            return (x * y) & 0xFFFFFFFF
        self.a = (self.a + 0x6D2B79F5) & 0xFFFFFFFF
        a = self.a
        t = imul(a ^ (a >> 15), 1 | a)
        t = ((t + imul(t ^ (t >> 7), 61 | t)) & 0xFFFFFFFF) ^ t
        return ((t ^ (t >> 14)) & 0xFFFFFFFF) / 4294967296


def parse_metrics(text):
    out = {}
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        k, _, v = line.rpartition(" ")
        out[k] = float(v)
    return out


async def http_get(host, port, path, headers):
    """GET on a connection of its own, closed after (keep-alive sockets would count as the
    server's open descriptors)."""
    r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        for k, v in headers.items():
            head += f"{k}: {v}\r\n"
        w.write((head + "\r\n").encode())
        await w.drain()
        data = await asyncio.wait_for(r.read(), 30)
    finally:
        w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            n_s, _, rest = rest.partition(b"\r\n")
            n = int(n_s.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, body.decode("utf-8", "replace")


async def metrics(host, port, headers):
    status, body = await http_get(host, port, "/metrics", headers)
    if status != 200:
        raise RuntimeError(f"/metrics: HTTP {status}")
    return parse_metrics(body)


def proc_stats(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            st = f.read()
        get = lambda key: int(st.split(key + ":", 1)[1].split()[0])
        return {"rssKiB": get("VmRSS"), "threads": get("Threads"), "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, IndexError, ValueError):
        return None


def swaps_of(m):
    """Loads that released another model (under --max-resident auto a load into free room is
    no swap), or all loads on a server that does not count swaps."""
    return m.get("atlas_model_swaps_total", m.get("atlas_model_loads_total", 0))


def finished(m, reason):
    return m.get(f'atlas_requests_finished_total{{reason="{reason}"}}', 0)


def http5xx(m):
    return sum(v for k, v in m.items() if k.startswith("atlas_http_requests_total{") and 'code="5xx"' in k)


def check_stream(spec, events, status, ctype):
    """None when the stream is well-formed, else what is wrong (soak.mjs's checkStream)."""
    if status != 200:
        return f"HTTP {status}: {''.join(events)[:300]}"
    if not (ctype or "").startswith("text/event-stream"):
        return f"content-type {ctype}"
    if not events or events[-1] != "[DONE]":
        return "the stream did not end with [DONE]"
    if events.index("[DONE]") != len(events) - 1:
        return "events after [DONE]"
    obj = "chat.completion.chunk" if spec["chat"] else "text_completion"
    cid, finish, usage, usage_at = None, [], None, -1
    for i, ev in enumerate(events[:-1]):
        try:
            j = json.loads(ev)
        except ValueError:
            return f"event {i} is not JSON: {ev[:200]}"
        if j.get("error"):
            return f"error event: {json.dumps(j['error'])[:300]}"
        if j.get("object") != obj:
            return f"event {i}: object {j.get('object')}"
        if j.get("model") != spec["model"]:
            return f"event {i}: model {j.get('model')}, asked {spec['model']}"
        if cid is None:
            cid = j.get("id")
        elif j.get("id") != cid:
            return f"event {i}: id {j.get('id')} after {cid}"
        if not isinstance(j.get("choices"), list):
            return f"event {i}: no choices"
        for c in j["choices"]:
            if c.get("index") != 0:
                return f"event {i}: choice index {c.get('index')}"
            if not (isinstance(c.get("delta"), dict) if spec["chat"] else isinstance(c.get("text"), str)):
                return f"event {i}: no delta/text"
            if c.get("finish_reason") is not None:
                finish.append(c["finish_reason"])
        if j.get("usage"):
            usage, usage_at = j["usage"], i
    if len(finish) != 1:
        return f"{len(finish)} finish_reasons"
    if finish[0] not in ("stop", "length"):
        return f"finish_reason {finish[0]}"
    if not usage or usage_at != len(events) - 2:
        return "no usage chunk before [DONE]"
    n = usage.get("completion_tokens")
    if not isinstance(n, int) or n < 1 or n > spec["max_tokens"]:
        return f"completion_tokens {n} (max_tokens {spec['max_tokens']})"
    if spec["ignore_eos"] and (n != spec["max_tokens"] or finish[0] != "length"):
        return f"ignore_eos: {n} tokens, finish_reason {finish[0]} (max_tokens {spec['max_tokens']})"
    return None


class Hangup(Exception):
    pass


class Client:
    """One keep-alive connection; requests one after the other; dropped after a hang-up."""

    def __init__(self, host, port, headers):
        self.host, self.port, self.headers = host, port, headers
        self.r = self.w = None

    def drop(self):
        if self.w is not None:
            self.w.transport.abort()  # a reset, at once, as a client that goes away
            self.r = self.w = None

    async def request(self, spec):
        """Runs one request; returns (events, status, content-type); raises Hangup when it hung
        up as planned, or another exception when the exchange failed."""
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        if spec["chat"]:
            body = {"model": spec["model"], "messages": [{"role": "user", "content": spec["prompt"]}]}
        else:
            body = {"model": spec["model"], "prompt": spec["prompt"]}
        body.update(max_tokens=spec["max_tokens"], stream=True, stream_options={"include_usage": True},
                    ignore_eos=spec["ignore_eos"], temperature=spec["temperature"], seed=spec["seed"])
        data = json.dumps(body).encode()
        path = "/v1/chat/completions" if spec["chat"] else "/v1/completions"
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n")
        for k, v in self.headers.items():
            head += f"{k}: {v}\r\n"
        self.w.write((head + "\r\n").encode() + data)
        await self.w.drain()
        if spec["hangup"] == "before_response":
            raise Hangup()
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
        if spec["hangup"] == "after_headers":
            raise Hangup()
        events, buf, n_events, raw = [], b"", 0, b""
        async for piece in self._body(hdrs):
            if status != 200:
                raw += piece
                continue
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):
                    events.append("(not data) " + ev.decode("utf-8", "replace"))
                    continue
                events.append(ev[6:].decode("utf-8", "replace"))
                n_events += 1
                if spec["hangup"] == "mid_stream" and n_events >= spec["hang_at"] and ev != b"data: [DONE]":
                    raise Hangup()
        if status != 200:
            events.append(raw.decode("utf-8", "replace"))
        elif buf.strip():
            events.append("(unterminated) " + buf.decode("utf-8", "replace"))
        if hdrs.get("connection", "").lower() == "close":
            self.drop()
        return events, status, hdrs.get("content-type")

    async def _body(self, hdrs):
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await self.r.readline()
                if not line:
                    raise RuntimeError("the connection closed inside a chunked body")
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    await self.r.readline()
                    return
                data = await self.r.readexactly(n)
                await self.r.readexactly(2)
                yield data
        elif "content-length" in hdrs:
            n = int(hdrs["content-length"])
            if n:
                yield await self.r.readexactly(n)
        else:  # until the server closes
            while True:
                data = await self.r.read(65536)
                if not data:
                    self.drop()
                    return
                yield data


async def soak(a):
    u = urlsplit(a.url)
    host, port = u.hostname, u.port or 80
    auth = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    models = a.models.split(",")
    lo, hi = (int(x) for x in a.max_tokens.split("-"))
    rand = Rand(a.seed)
    pick = lambda xs: xs[int(rand() * len(xs))]
    r = {"streams": a.streams, "models": models, "started": 0, "completed": 0, "failed": 0, "failures": [],
         "hangups": {"before_response": 0, "after_headers": 0, "mid_stream": 0}, "hangups_outlived": 0,
         "tokens": 0, "per_model": {m: 0 for m in models}}
    m0 = await metrics(host, port, auth)
    p0 = proc_stats(a.pid) if a.pid else None
    state = {"stop": False, "swaps": 0, "rss_peak": p0["rssKiB"] if p0 else 0}
    t0 = time.perf_counter()

    def fail(model, chat, why):
        r["failed"] += 1
        if len(r["failures"]) < 20:
            r["failures"].append({"model": model, "chat": chat, "why": why})

    def next_spec():
        max_tokens = lo + int(rand() * (hi - lo + 1))
        spec = {"model": pick(models), "chat": rand() < 0.5, "max_tokens": max_tokens,
                "ignore_eos": rand() < 0.5, "temperature": 0 if rand() < 0.5 else 0.8,
                "seed": int(rand() * 1e6), "hangup": None}
        spec["prompt"] = " ".join(pick(WORDS) for _ in range(3 + int(rand() * 12)))
        if rand() < a.disconnect:
            x = rand()
            spec["hangup"] = "before_response" if x < 0.15 else "after_headers" if x < 0.3 else "mid_stream"
            spec["hang_at"] = 1 + int(rand() * (max_tokens + 1))
        return spec

    async def worker():
        c = Client(host, port, auth)
        while not state["stop"]:
            spec = next_spec()
            r["started"] += 1
            r["per_model"][spec["model"]] += 1
            try:
                events, status, ctype = await asyncio.wait_for(c.request(spec), a.request_timeout)
            except Hangup:
                c.drop()
                r["hangups"][spec["hangup"]] += 1
                continue
            except asyncio.TimeoutError:
                c.drop()
                fail(spec["model"], spec["chat"], f"no end in {a.request_timeout} s")
                continue
            except (OSError, RuntimeError, ValueError, asyncio.IncompleteReadError) as e:
                c.drop()
                fail(spec["model"], spec["chat"], f"request: {e!r}")
                continue
            why = check_stream(spec, events, status, ctype)
            if why:
                fail(spec["model"], spec["chat"], why)
                c.drop()
                continue
            r["completed"] += 1
            if spec["hangup"]:
                r["hangups_outlived"] += 1
            r["tokens"] += json.loads(events[-2])["usage"]["completion_tokens"]
        c.drop()

    async def watcher():
        last_log, down = t0, 0
        while not state["stop"]:
            await asyncio.sleep(0.25)
            try:
                m = await metrics(host, port, auth)
                state["swaps"] = swaps_of(m) - swaps_of(m0)
                down = 0
            except (OSError, RuntimeError, ValueError, asyncio.TimeoutError) as e:
                fail("/metrics", False, repr(e))
                down += 1
                if down >= 3:  # the server is gone: no point going on
                    state["stop"] = True
            if a.pid:
                p = proc_stats(a.pid)
                if p:
                    state["rss_peak"] = max(state["rss_peak"], p["rssKiB"])
            el = time.perf_counter() - t0
            if (a.swaps > 0 and state["swaps"] >= a.swaps) or el >= a.duration:
                state["stop"] = True
            if time.perf_counter() - last_log > 10:
                last_log = time.perf_counter()
                hung = sum(r["hangups"].values())
                print(f"soak: {el:.0f} s, {state['swaps']:.0f} swaps, {r['started']} requests, {r['completed']} "
                      f"completed, {r['failed']} failed, {hung} hung up", flush=True)

    await asyncio.gather(watcher(), *(worker() for _ in range(a.streams)))
    r["wall_s"] = time.perf_counter() - t0
    try:
        m1 = await metrics(host, port, auth)
    except (OSError, RuntimeError, ValueError, asyncio.TimeoutError) as e:
        fail("/metrics", False, repr(e))
        m1 = m0
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    r["swaps"] = int(swaps_of(m1) - swaps_of(m0))
    r["swaps_target_met"] = not a.swaps > 0 or r["swaps"] >= a.swaps
    src = lambda s: int(d(f'atlas_model_loads_by_source_total{{source="{s}"}}'))
    r["server"] = {
        "loads": int(d("atlas_model_loads_total")), "unloads": int(d("atlas_model_unloads_total")),
        "load_failures": int(d("atlas_model_load_failures_total")),
        "submitted": int(d("atlas_requests_submitted_total")),
        "cancelled": int(finished(m1, "cancelled") - finished(m0, "cancelled")),
        "preempted": int(d("atlas_preemptions_total")),  # paused for a swap, or for KV blocks
        "errors": int(finished(m1, "error") - finished(m0, "error")),
        "rejected": int(d("atlas_requests_rejected_total")),
        "http_5xx": int(http5xx(m1) - http5xx(m0)),
        "swap_s_mean": d("atlas_swap_duration_seconds_sum") / max(1, d("atlas_swap_duration_seconds_count")),
        # where the loads read the weights from, and the released models' prefix KV in host memory
        "loads_by_source": {"host": src("host"), "page_cache": src("page_cache"), "disk": src("disk")},
        "kv_host": {"saved_blocks": int(d("atlas_kv_host_saved_blocks_total")),
                    "restored_blocks": int(d("atlas_kv_host_restored_blocks_total")),
                    "dropped_blocks": int(d("atlas_kv_host_dropped_blocks_total"))},
    }
    if a.pid:
        p1 = proc_stats(a.pid)
        r["memory"] = {"rss_start_kib": p0 and p0["rssKiB"], "rss_peak_kib": state["rss_peak"],
                       "rss_end_kib": p1 and p1["rssKiB"], "fds_start": p0 and p0["fds"],
                       "fds_end": p1 and p1["fds"], "alive": p1 is not None}
    r["hung_up"] = sum(r["hangups"].values())
    h, s = r["hangups"], r["server"]
    ls = s["loads_by_source"]
    print(f"soak: {r['wall_s']:.1f} s, {r['swaps']} swaps ({s['swap_s_mean'] * 1000:.1f} ms each), "
          f"{s['loads']} loads ({ls['host']} from the host tier, {ls['page_cache']} the page cache, {ls['disk']} disk), "
          f"{r['started']} requests: {r['completed']} completed, {r['failed']} failed, {r['hung_up']} hung up "
          f"({h['before_response']} before the response, {h['after_headers']} after the headers, "
          f"{h['mid_stream']} mid-stream; {r['hangups_outlived']} planned ones ended first), {r['tokens']} tokens; "
          f"server: {s['cancelled']} cancelled, {s['errors']} errors, {s['http_5xx']} 5xx", flush=True)
    for f in r["failures"]:
        print(f"soak: FAILED {f['model']} {'chat' if f['chat'] else 'completion'}: {f['why']}", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--swaps", type=int, default=0)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--disconnect", type=float, default=0.15)
    ap.add_argument("--max-tokens", default="4-32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--json")
    a = ap.parse_args()
    r = asyncio.run(soak(a))
    r["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    r["client"] = "bench/serve/soak.py"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0 if r["failed"] == 0 and r["swaps_target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
