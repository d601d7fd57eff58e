#!/usr/bin/env python3
"""bench/gpu/beside.py — issue 37's part 1 measure, driven by bench/gpu/beside.sh against an
`atlas serve --max-resident 2 --log-format json` serving models a, b and c (standard library
only: the GPU machine has no pip).

  beside.py URL SERVER_LOG OUT_DIR [--streams N] [--max-tokens N] [--reps N] [--budget S]
            [--switch N]

1. Solo loads: a and b resident and idle, `POST /v1/models/c/load` (b, idle and least
   recently used, is released for it), then c unloaded and b loaded again; REPS times.
2. Beside: N streaming completions on a, back to back, each of max-tokens tokens
   (ignore_eos), their chunks' arrival times kept; after a quiet second, c loaded in place of
   b as in 1, a quiet second, c unloaded, b loaded again, a quiet 1.5 s; REPS times.
3. Switching: b's time to first token for a short streamed request (a prompt of a few
   tokens, one token out), SWITCH times with a idle (before 2) and SWITCH times while a's
   streams run (after 2's loads, b resident again); the difference of the medians is what a
   request for a resident model pays for the other one being busy (the done line: <= 2 ms).
4. Each load's window is read from the server's log (the model_loaded event's time less its
   duration_ms, both the server's clock, which is this machine's).  A's inter-token gaps (one
   stream's consecutive chunks, first token excluded) that overlap one of c's load windows
   are "during"; those that overlap no load or release window (0.2 s margin) are "baseline".

Prints, and writes OUT_DIR/beside.md and beside.json after every repetition (a run cut
short leaves what it measured): p99 of A's gaps during c's loads against the baseline's
(the done line: ratio <= 1.5) and c's median load time beside serving against solo (<= 1.2).
"""
import argparse
import datetime
import http.client
import json
import os
import signal
import statistics
import sys
import threading
import time
import urllib.parse


def post(url, path, body=None, timeout=300):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = json.dumps(body or {})
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode(errors="replace")
    c.close()
    return r.status, text


def wait_health(url, seconds=120):
    u = urllib.parse.urlparse(url)
    t_end = time.time() + seconds
    while time.time() < t_end:
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def log_events(path):
    """The residency events of the server's JSON log: (kind, model, t_start, t_end, steps),
    steps a load's {step: ms after it began} (the server's steps_ms), else {}."""
    out = []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            o = json.loads(line)
        except ValueError:
            continue
        ev = o.get("event")
        if ev not in ("model_loaded", "model_released", "model_load_failed"):
            continue
        t = datetime.datetime.strptime(o["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        t_end = t.replace(tzinfo=datetime.timezone.utc).timestamp()
        dur = float(o.get("duration_ms", 0)) / 1e3
        out.append((ev, o.get("model"), t_end - dur, t_end, o.get("steps_ms") or {}))
    return out


def wait_event(path, ev, model, after, seconds=120):
    """The first event ev of model ending after `after` (waits for the log to say it)."""
    t_end = time.time() + seconds
    while time.time() < t_end:
        for e in log_events(path):
            if e[0] == ev and e[1] == model and e[3] >= after - 0.05:
                return e
        time.sleep(0.05)
    return None


class Streams:
    """N threads, each streaming completions on model a back to back."""

    def __init__(self, url, n, max_tokens):
        self.url, self.n, self.max_tokens = url, n, max_tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.gaps = []  # (t_prev, t_now) of consecutive chunks of one request
        self.errors = []
        self.requests = 0
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(n)]

    def one(self, i):
        u = urllib.parse.urlparse(self.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        body = {"model": "a", "prompt": f"Stream {i} tells a story:", "max_tokens":
                self.max_tokens, "ignore_eos": True, "stream": True, "temperature": 0}
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        prev, mine = None, []
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.time()
            if prev is not None:
                mine.append((prev, now))
            prev = now
        c.close()
        with self.lock:
            self.gaps.extend(mine)
            self.requests += 1

    def run(self, i):
        while not self.stop.is_set():
            try:
                self.one(i)
            except Exception as e:  # noqa: BLE001 (a failed request is reported, not fatal)
                with self.lock:
                    self.errors.append(str(e))
                time.sleep(0.2)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)


def first_token(url, model, i):
    """Seconds from sending a streamed one-token completion on model to its first chunk."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {"model": model, "prompt": f"Switch {i}: one word", "max_tokens": 1,
            "ignore_eos": True, "stream": True, "temperature": 0}
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    t = None
    while True:
        line = r.readline()
        if not line:
            break
        if t is None and line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            t = time.time() - t0
    c.close()
    if t is None:
        raise RuntimeError("no chunk came")
    return t


def switch_times(url, n, tag):
    out = []
    for i in range(n):
        out.append(first_token(url, "b", f"{tag}{i}"))
        time.sleep(0.05)
    return out


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def p99(xs):
    return pct(xs, 0.99)


def p90(xs):
    return pct(xs, 0.90)


def overlaps(gap, win, margin=0.0):
    return gap[0] < win[1] + margin and gap[1] > win[0] - margin


class Result:
    def __init__(self, args):
        self.args = args
        self.solo = []       # c's load seconds, nothing streaming
        self.beside = []     # c's load seconds, a streaming
        self.reps = []       # per repetition: p99 during, gaps during
        self.during_all = []
        self.swap_all = []   # gaps overlapping B's release and C's load, both
        self.baseline_all = []
        self.errors = []
        self.requests = 0
        self.note = ""
        self.ttft_idle = []  # b's first token, a idle (s)
        self.ttft_busy = []  # b's first token, a streaming (s)

    def analyse(self, streams, events, t_from):
        gaps = [g for g in streams.gaps if g[0] >= t_from]
        c_loads = [e for e in events if e[0] == "model_loaded" and e[1] == "c" and e[3] >= t_from]
        c_wins = [(e[2], e[3]) for e in c_loads]
        busy = [(e[2], e[3]) for e in events if e[3] >= t_from]
        self.during_all = [b - a for a, b in gaps if any(overlaps((a, b), w) for w in c_wins)]
        # the whole swap: from the release before each of c's loads (b's) to its end
        swaps = []
        for w in c_wins:
            rel = [e[2] for e in events if e[0] == "model_released" and e[1] == "b"
                   and w[0] - 5 <= e[3] <= w[0] + 0.01]
            swaps.append((max(rel) if rel else w[0], w[1]))
        self.swap_all = [b - a for a, b in gaps if any(overlaps((a, b), w) for w in swaps)]
        self.baseline_all = [b - a for a, b in gaps
                             if not any(overlaps((a, b), w, 0.2) for w in busy)]
        self.reps = []
        for e in c_loads:
            w = (e[2], e[3])
            inside = [(a, b) for a, b in gaps if overlaps((a, b), w)]
            d = [b - a for a, b in inside]
            # the largest gaps, placed in the load (ms after it began) beside its steps: which
            # step holds A up
            top = sorted(inside, key=lambda g: g[0] - g[1])[:4]
            self.reps.append({"window_s": round(w[1] - w[0], 4), "gaps": len(d),
                              "p99_ms": round(p99(d) * 1e3, 2) if d else None,
                              "max_ms": round(max(d) * 1e3, 2) if d else None,
                              "top_gaps_ms": [[round((a - w[0]) * 1e3, 1),
                                               round((b - w[0]) * 1e3, 1)] for a, b in sorted(top)],
                              "steps_ms": e[4]})
        self.errors = list(streams.errors)
        self.requests = streams.requests

    def summary(self):
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        base, dur = p99(self.baseline_all), p99(self.during_all)
        solo, bes = med(self.solo), med(self.beside)
        r_gap = dur / base if self.baseline_all and self.during_all else float("nan")
        r_load = bes / solo if self.solo and self.beside else float("nan")
        ok = lambda r, lim: "yes" if r == r and r <= lim else ("no" if r == r else "n/a")  # noqa: E731
        rows = [
            "| what | value | target | met |",
            "|---|---|---|---|",
            f"| A's inter-token p99, no load (ms; {len(self.baseline_all)} gaps) | "
            f"{base * 1e3:.2f} | | |",
            f"| A's inter-token p99 during C's loads (ms; {len(self.during_all)} gaps) | "
            f"{dur * 1e3:.2f} | | |",
            f"| ratio | {r_gap:.2f} | <= 1.5 | {ok(r_gap, 1.5)} |",
            f"| A's inter-token p99 over the swaps, B's release included (ms; "
            f"{len(self.swap_all)} gaps) | {p99(self.swap_all) * 1e3:.2f} | | |",
            f"| C's load, solo (median of {len(self.solo)}, s) | {solo:.3f} | | |",
            f"| C's load beside A streaming (median of {len(self.beside)}, s) | {bes:.3f} | | |",
            f"| ratio | {r_load:.2f} | <= 1.2 | {ok(r_load, 1.2)} |",
        ]
        t_idle, t_busy = med(self.ttft_idle), med(self.ttft_busy)
        sw = (t_busy - t_idle) * 1e3 if self.ttft_idle and self.ttft_busy else float("nan")
        rows += [
            f"| B's first token, A idle (median of {len(self.ttft_idle)}, ms) | "
            f"{t_idle * 1e3:.2f} | | |",
            f"| B's first token, A streaming (median of {len(self.ttft_busy)}, ms; p90 "
            f"{p90(self.ttft_busy) * 1e3:.2f}) | {t_busy * 1e3:.2f} | | |",
            f"| switching to B while A is busy, less B's own prefill (ms) | {sw:.2f} | <= 2 | "
            f"{ok(sw, 2.0)} |",
        ]
        per = ", ".join(f"{r['p99_ms']} ms ({r['gaps']} gaps in {r['window_s']} s)"
                        for r in self.reps)
        md = "\n".join(rows) + (f"\n\nA's p99 in each of C's load windows: {per}" if per else "")
        for i, r in enumerate(self.reps):
            gaps = ", ".join(f"{a:.0f}-{b:.0f}" for a, b in r["top_gaps_ms"])
            steps = ", ".join(f"{k} {v:.0f}" for k, v in r["steps_ms"].items())
            md += (f"\n\nC's load {i + 1}: A's largest gaps at {gaps} ms after the load began; "
                   f"the load's steps ended at (ms) {steps or 'not logged'}")
        md += (f"\n\nA's requests: {self.requests} done, {len(self.errors)} failed"
               + (f" (first: {self.errors[0][:200]})" if self.errors else ""))
        md += (f"\n\nC's loads solo (s): {[round(x, 3) for x in self.solo]}; beside: "
               f"{[round(x, 3) for x in self.beside]}")
        if self.note:
            md += f"\n\n{self.note}"
        return md, {"gap_p99_baseline_ms": base * 1e3, "gap_p99_during_ms": dur * 1e3,
                    "gap_p99_swap_ms": p99(self.swap_all) * 1e3,
                    "gap_ratio": r_gap, "load_solo_s": self.solo, "load_beside_s": self.beside,
                    "load_ratio": r_load, "windows": self.reps,
                    "ttft_idle_s": self.ttft_idle, "ttft_busy_s": self.ttft_busy,
                    "switch_ms": sw,
                    "gaps_baseline": len(self.baseline_all), "gaps_during": len(self.during_all),
                    "requests": self.requests, "failed": len(self.errors),
                    "args": vars(self.args), "note": self.note}

    def write(self, out):
        md, js = self.summary()
        with open(os.path.join(out, "beside.md.tmp"), "w") as f:
            f.write("# Loads beside serving (bench/gpu/beside.sh)\n\n" + md + "\n")
        os.replace(os.path.join(out, "beside.md.tmp"), os.path.join(out, "beside.md"))
        with open(os.path.join(out, "beside.json.tmp"), "w") as f:
            json.dump(js, f, indent=1)
        os.replace(os.path.join(out, "beside.json.tmp"), os.path.join(out, "beside.json"))
        return md


def swap_c_in(url, log):
    """c loaded in place of b; its load's seconds from the log (None: it failed)."""
    t0 = time.time()
    st, text = post(url, "/v1/models/c/load")
    if st != 200:
        raise RuntimeError(f"loading c: HTTP {st}: {text[:300]}")
    e = wait_event(log, "model_loaded", "c", t0)
    return e[3] - e[2] if e else None


def swap_b_back(url):
    for path in ("/v1/models/c/unload", "/v1/models/b/load"):
        st, text = post(url, path)
        if st != 200:
            raise RuntimeError(f"{path}: HTTP {st}: {text[:300]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=240, help="seconds for phases 1 and 2")
    ap.add_argument("--switch", type=int, default=20, help="b's first tokens, each way")
    args = ap.parse_args()
    res = Result(args)
    t_stop = time.time() + args.budget
    streams = None

    def cut(signum, frame):  # a timeout: what was measured is written and printed
        res.note = f"cut short by signal {signum}"
        if streams:
            streams.stop.set()
            res.analyse(streams, log_events(args.log), t_from)
        print(res.write(args.out), flush=True)
        sys.exit(3)

    t_from = time.time()
    signal.signal(signal.SIGTERM, cut)
    if not wait_health(args.url):
        sys.exit("beside.py: the server did not come up")
    for m in ("a", "b"):
        st, text = post(args.url, f"/v1/models/{m}/load")
        if st != 200:
            sys.exit(f"beside.py: loading {m}: HTTP {st}: {text[:300]}")
    post(args.url, "/v1/completions", {"model": "a", "prompt": "warm", "max_tokens": 4})
    post(args.url, "/v1/completions", {"model": "b", "prompt": "warm", "max_tokens": 4})
    res.ttft_idle = switch_times(args.url, args.switch, "idle")  # 3, a idle
    for r in range(args.reps):  # 1. solo
        if time.time() > t_stop - args.budget / 2:
            res.note = "solo phase stopped at half the budget"
            break
        s = swap_c_in(args.url, args.log)
        if s is not None:
            res.solo.append(s)
        swap_b_back(args.url)
        print(f"solo {r + 1}: c loaded in {s} s", flush=True)
    streams = Streams(args.url, args.streams, args.max_tokens)  # 2. beside
    t_from = time.time()
    streams.start()
    time.sleep(2.0)
    for r in range(args.reps):
        if time.time() > t_stop:
            res.note = f"stopped after {r} repetitions: the budget ran out"
            break
        s = swap_c_in(args.url, args.log)
        if s is not None:
            res.beside.append(s)
        time.sleep(1.0)
        swap_b_back(args.url)
        time.sleep(1.5)
        res.analyse(streams, log_events(args.log), t_from)
        res.write(args.out)
        print(f"beside {r + 1}: c loaded in {s} s; {len(res.during_all)} gaps during loads",
              flush=True)
    try:  # 3, a streaming (b resident again)
        res.ttft_busy = switch_times(args.url, args.switch, "busy")
    except Exception as e:  # noqa: BLE001 (reported beside the rest)
        res.note += f" b's first tokens beside a failed: {e}"
    streams.finish()
    res.analyse(streams, log_events(args.log), t_from)
    print(res.write(args.out), flush=True)


if __name__ == "__main__":
    main()
