#!/usr/bin/env python3
"""bench/gpu/start.py ATLAS MODEL_DIR OUT N [--device cpu] [--host-cache GIB] -- issue 37's
part 6 record: N times, start `ATLAS serve` on MODEL_DIR, ask it for a one-token completion
until it answers, and time process start -> first answer from here (the spawn) and from the
server's own start lines (startup.h: each phase in seconds after the process started); then
kill it.  With --host-cache, one more run with the host tier on: its first load's time, and
how long after it the tier's image of the weights was kept (atlas_host_tier_models).
Writes OUT/start.md (the medians, a table), OUT/start.json (every run) and OUT/start-logs.txt
(the servers' logs).  Standard library only."""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

PHASE = re.compile(r"\binfo start: (host|model \S+|listening|first answer)[: ]?(.*)$")
PAIR = re.compile(r"([A-Za-z][\w]*) (\d+\.\d+) s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(base, deadline):
    """The first answer to a one-token completion, retried until deadline."""
    body = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 1, "temperature": 0}).encode()
    while time.monotonic() < deadline:
        req = urllib.request.Request(base + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=max(1, deadline - time.monotonic())) as r:
                if r.status == 200 and json.loads(r.read()).get("choices"):
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.005)  # refused: the socket is not bound yet
    return None


def phases(log):
    """{phase: seconds} from the server's start lines."""
    out = {}
    for line in log.splitlines():
        m = PHASE.search(line)
        if not m:
            continue
        what, rest = m.group(1), m.group(2)
        if what in ("listening", "first answer"):
            v = re.search(r"(\d+\.\d+) s", rest)
            if v:
                out[what] = float(v.group(1))
            continue
        prefix = "host" if what == "host" else "model"
        for name, v in PAIR.findall(rest):
            out[f"{prefix} {name}"] = float(v)
    return out


def metric(base, name):
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except (urllib.error.URLError, OSError):
        pass
    return None


def run(atlas, model, extra, logs, fill_wait=False):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [atlas, "serve", "--model", f"m={model}", "--port", str(port), "--ctx-size", "4096",
           "--parallel", "4"] + extra
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t1 = ask(base, t0 + 60)
    r = {"cmd": " ".join(cmd), "client_s": round(t1 - t0, 3) if t1 else None}
    if fill_wait and t1:  # the tier's image, filled after the load
        while time.monotonic() < t1 + 60 and not metric(base, "atlas_host_tier_models"):
            time.sleep(0.1)
        models = metric(base, "atlas_host_tier_models")
        r["tier_kept_after_answer_s"] = round(time.monotonic() - t1, 2) if models else None
        r["tier_pinned_bytes"] = metric(base, "atlas_host_tier_pinned_bytes")
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    logs.append(f"==== {r['cmd']}\n{err}")
    r["phases"] = phases(err)
    loaded = re.search(r"model m: loaded in (\d+\.\d+) s .* from ([^,]+),", err)
    if loaded:
        r["load_s"], r["load_from"] = float(loaded.group(1)), loaded.group(2)
    return r


def table(runs, cached):
    names = []
    for r in runs:
        for k in r["phases"]:
            if k not in names:
                names.append(k)
    rows = []
    for k in names:
        v = [r["phases"][k] for r in runs if k in r["phases"]]
        rows.append((statistics.median(v), k, min(v), max(v), len(v)))
    rows.sort(key=lambda r: r[0])  # stable: a line's phases keep their order on ties
    client = [r["client_s"] for r in runs if r["client_s"] is not None]
    out = ["| phase (s after the process started) | median | min | max | runs |",
           "|---|---|---|---|---|"]
    for med, k, lo, hi, n in rows:
        out.append(f"| {k} | {med:.3f} | {lo:.3f} | {hi:.3f} | {n} |")
    if client:
        out.append(f"| **spawn -> first answer, measured by the client** | "
                   f"**{statistics.median(client):.3f}** | {min(client):.3f} | "
                   f"{max(client):.3f} | {len(client)} |")
    if cached:
        out.append("")
        out.append(f"with --host-cache: first answer {cached.get('client_s')} s, the load "
                   f"{cached.get('load_s')} s from {cached.get('load_from')}; the image kept "
                   f"{cached.get('tier_kept_after_answer_s')} s after the answer "
                   f"({cached.get('tier_pinned_bytes')} bytes pinned)")
    return "\n".join(out) + "\n"


def main():
    atlas, model, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    args = sys.argv[5:]
    extra, cache = [], None
    if "--device" in args:
        extra += ["--device", args[args.index("--device") + 1]]
    if "--host-cache" in args:
        cache = args[args.index("--host-cache") + 1]
    logs, runs = [], []
    for _ in range(n):
        runs.append(run(atlas, model, extra, logs))
        print(json.dumps({k: runs[-1][k] for k in ("client_s", "load_s") if k in runs[-1]}),
              file=sys.stderr)
    on_gpu = "cpu" not in extra  # the CPU keeps no weights in the host tier: nothing to wait for
    cached = run(atlas, model, extra + ["--host-cache", cache], logs, on_gpu) if cache else None
    md = table(runs, cached)
    with open(os.path.join(out, "start.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "start.json"), "w") as f:
        json.dump({"runs": runs, "host_cache": cached}, f, indent=1)
    with open(os.path.join(out, "start-logs.txt"), "w") as f:
        f.write("\n".join(logs))
    print(md)
    if any(r["client_s"] is None for r in runs):
        sys.exit("a run got no answer: see start-logs.txt")


if __name__ == "__main__":
    main()
