#!/usr/bin/env python3
"""bench/serve/report.py — the table of a serving benchmark run (bench/gpu/serve.sh): every
level of every loadgen.py report in DIR (run-*.json), the ceilings measured in the same call
(DIR/ceilings.json) and the issue's targets computed from them.

    python3 bench/serve/report.py DIR        # writes DIR/summary.md and DIR/summary.json
    python3 bench/serve/report.py ceilings DIR BENCH_LOG [CONFIG_JSON] [KEY=VALUE ...]
        # reads `atlas bench` output: writes DIR/ceilings.json and DIR/roofline.json (the
        # model's shape from CONFIG_JSON, else from the bench's model line; the matrix rate:
        # the better of its two GEMMs, or on a CPU without them the prefill's own rate)

ceilings.json: {"device", "model", "commit", "matrix_tflops", "matrix_text", "read_gbps",
"bench_decode_tok_s", "bench_decode_text", "roofline": {...}} (any may be missing).
A run's "label" names it; runs labelled "fp8-..." are the FP8 checkpoint's, compared with the
bf16 run of the same workload and concurrency.
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadgen import shape_from_config  # noqa: E402


def fmt(x, spec=".0f", none="-"):
    return none if x is None else format(x, spec)


def where(lv):
    w = f"c={lv['concurrency']}" if "concurrency" in lv else f"{lv['rate']:g} req/s"
    # a level cut at the deadline: its running requests were dropped, its figures partial
    return w + (f" (cut: {lv['requests']} of {lv.get('requests_planned', '?')} ended)" if lv.get("cut") else "")


def find(runs, label, conc=None):
    for r in runs:
        if r.get("label") == label:
            for lv in r["levels"]:
                if conc is None or lv.get("concurrency") == conc:
                    return lv
    return None


def targets(runs, ceil):
    """The issue's four targets, each (what, figure, aim, met) where the run has the levels."""
    out = []
    g512, s512 = find(runs, "fixed-greedy", 512), find(runs, "fixed-sampled", 512)
    if g512 and "roofline_ratio" in g512:
        out.append(("128/128 at 512 concurrent, greedy: share of the roofline",
                    f"{100 * g512['roofline_ratio']:.1f}% ({g512['output_tok_s']:.0f} of "
                    f"{g512['roofline_output_tok_s']:.0f} output tok/s)", ">= 60%", g512["roofline_ratio"] >= 0.6))
    if g512 and s512 and g512["output_tok_s"] > 0:
        q = s512["output_tok_s"] / g512["output_tok_s"]
        out.append(("128/128 at 512 concurrent: sampled / greedy",
                    f"{100 * q:.1f}% ({s512['output_tok_s']:.0f} / {g512['output_tok_s']:.0f})", ">= 95%", q >= 0.95))
    g256 = find(runs, "fixed-greedy", 256)
    if g256:
        itl, ttft = float(g256["itl_ms"]["p50"]), float(g256["ttft_ms"]["p99"])
        out.append(("128/128 at 256 concurrent: inter-token p50", f"{itl:.1f} ms", "<= 25 ms", itl <= 25))
        out.append(("128/128 at 256 concurrent: TTFT p99", f"{ttft:.0f} ms", "<= 1,000 ms", ttft <= 1000))
    g1, bench = find(runs, "fixed-greedy", 1), ceil.get("bench_decode_tok_s")
    if g1 and bench:
        sd = g1.get("stream_decode_tok_s") or 0
        out.append(("concurrency 1 through the server / `atlas bench` decode",
                    f"{100 * sd / bench:.1f}% ({sd:.1f} tok/s a stream after its first token, "
                    f"{g1['output_tok_s']:.1f} with prefill and HTTP; bench {bench:.1f})", ">= 95%", sd / bench >= 0.95))
    f512 = find(runs, "fp8-fixed-greedy", 512)
    if f512 and g512:
        q = f512["output_tok_s"] / g512["output_tok_s"]
        out.append(("FP8 / bf16 weights, 128/128 at 512 concurrent",
                    f"{q:.2f}x ({f512['output_tok_s']:.0f} / {g512['output_tok_s']:.0f})", ">= 1.4x", q >= 1.4))
    return out


def ceilings(d, log, config, extra):
    text = open(log).read()
    c = dict(kv.split("=", 1) for kv in extra)
    m = re.search(r"^model +(\S+) \((\S+), (\d+) layers, hidden (\d+), heads (\d+)/(\d+) x (\d+), "
                  r"ffn (\d+), vocab (\d+)\)", text, re.M)
    if config and os.path.exists(config):
        shape = shape_from_config(config)
    elif m:
        L, h, nh, nkv, hd, ffn, V = (int(x) for x in m.groups()[2:])
        layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * ffn + 2 * h
        shape = {"params": L * layer + h, "lm_head": V * h, "layers": L, "attn_dim": nh * hd}
    else:
        sys.exit(f"report: no model line in {log} and no config.json")
    if m:
        c.setdefault("model", f"{m.group(1)} ({m.group(2)}, {m.group(3)} layers, hidden {m.group(4)})")
    if (g := re.search(r"^device +(.+)$", text, re.M)):
        c["device"] = g.group(1)
    if (g := re.search(r"^read bw +([0-9.]+) GB/s", text, re.M)):
        c["read_gbps"] = float(g.group(1))
    if (g := re.search(r"^decode +\d+ steps after \d+ tokens: ([0-9.]+) ms/token, ([0-9.]+) tok/s", text, re.M)):
        c["bench_decode_tok_s"] = float(g.group(2))
        c["bench_decode_text"] = g.group(0).split(None, 1)[1]
    g = re.search(r"^matrix +bf16 (\S+): atlas mma.sync ([0-9.]+) TFLOP/s, cuBLASLt (.*) ([0-9.]+) TFLOP/s",
                  text, re.M)
    if g:
        own, lt = float(g.group(2)), float(g.group(4))
        c["matrix_tflops"] = max(own, lt)
        c["matrix_text"] = (f"{max(own, lt):.0f} TFLOP/s ({'cuBLASLt ' + g.group(3) if lt >= own else 'atlas mma.sync'}, "
                            f"bf16 {g.group(1)}; atlas mma.sync {own:.0f}, cuBLASLt {lt:.0f})")
    elif (g := re.search(r"^prefill +(\d+) tokens: +[0-9.]+ ms +([0-9.]+) tok/s", text, re.M)):
        n, tps = int(g.group(1)), float(g.group(2))
        c["matrix_tflops"] = tps * 2 * (shape["params"] + shape["lm_head"] / n) / 1e12
        c["matrix_text"] = (f"{c['matrix_tflops'] * 1e3:.3f} GFLOP/s: no GEMM probe here (CPU), the "
                            f"{n}-token prefill's own rate stands in for it")
    shape["matrix_tflops"] = c.get("matrix_tflops")
    c["roofline"] = shape
    json.dump(c, open(os.path.join(d, "ceilings.json"), "w"), indent=2)
    if shape["matrix_tflops"]:
        json.dump(shape, open(os.path.join(d, "roofline.json"), "w"), indent=2)
    print(json.dumps(c))


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "ceilings":
        a = sys.argv[2:]
        cfg = a[2] if len(a) > 2 and "=" not in a[2] else None
        return ceilings(a[0], a[1], cfg, [x for x in a[2:] if "=" in x])
    if len(sys.argv) != 2:
        sys.exit("usage: report.py DIR | report.py ceilings DIR BENCH_LOG [CONFIG_JSON] [KEY=VALUE ...]")
    d = sys.argv[1]
    try:
        ceil = json.load(open(os.path.join(d, "ceilings.json")))
    except (OSError, ValueError):
        ceil = {}
    runs = []
    for p in sorted(glob.glob(os.path.join(d, "run-*.json")), key=os.path.getmtime):
        try:
            runs.append(json.load(open(p)))
        except (OSError, ValueError) as e:
            print(f"report: {p}: {e}", file=sys.stderr)
    lines = [f"device: {ceil.get('device', '?')}; model: {ceil.get('model', '?')}; commit "
             f"{ceil.get('commit', '?')}; {ceil.get('server', '')}", "",
             f"- matrix rate: {ceil.get('matrix_text', 'not measured')}",
             f"- read bandwidth: {fmt(ceil.get('read_gbps'))} GB/s",
             f"- `atlas bench` decode, batch 1: {ceil.get('bench_decode_text', 'not measured')}"]
    if runs and runs[0].get("roofline_formula"):
        lines.append(f"- {runs[0]['roofline_formula']}; ratio = roofline time / wall time "
                     f"(prompt tokens include prefix-cache hits)")
    lines += ["", "| run | workload | mode | level | reqs | failed | out tok/s | total tok/s | "
              "TTFT p50 / p99 ms | ITL p50 / p99 ms | preempt | prefix hit | roofline out tok/s | of roofline |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for lv in r["levels"]:
            hit = lv.get("prefix_hit_rate")
            lines.append(
                f"| {r.get('label') or '-'} | {r.get('workload_text', lv['workload'])} | {lv['mode']} | "
                f"{where(lv)} | {lv['requests']} | {lv['failed']} | {lv['output_tok_s']:.0f} | "
                f"{lv['total_tok_s']:.0f} | {lv['ttft_ms']['p50']} / {lv['ttft_ms']['p99']} | "
                f"{lv['itl_ms']['p50']} / {lv['itl_ms']['p99']} | {fmt(lv.get('preemptions'))} | "
                f"{fmt(None if hit is None else 100 * hit, '.1f')}{'' if hit is None else '%'} | "
                f"{fmt(lv.get('roofline_output_tok_s'))} | "
                f"{fmt(None if 'roofline_ratio' not in lv else 100 * lv['roofline_ratio'], '.1f')}"
                f"{'%' if 'roofline_ratio' in lv else ''} |")
    for r in runs:
        for sk in r.get("skipped", []):
            lines.append(f"| {r.get('label') or '-'} | {r.get('workload_text', '')} | {r.get('mode', '')} | "
                         f"{sk}: skipped, past the deadline |" + " |" * 10)
    tg = targets(runs, ceil)
    if tg:
        if "smoke" in str(ceil.get("device", "")):
            lines += ["", "The targets are the H200's: on a CPU smoke run they mean nothing."]
        lines += ["", "| target | figure | aim | met |", "|---|---|---|---|"]
        lines += [f"| {w} | {f} | {aim} | {'yes' if ok else 'NO'} |" for w, f, aim, ok in tg]
    if ceil.get("skipped"):
        lines.append("\nskipped: " + "; ".join(ceil["skipped"]))
    text = "\n".join(lines) + "\n"
    open(os.path.join(d, "summary.md"), "w").write(text)
    json.dump({"ceilings": ceil, "runs": runs,
               "targets": [{"what": w, "figure": f, "aim": aim, "met": ok} for w, f, aim, ok in tg]},
              open(os.path.join(d, "summary.json"), "w"), indent=2)
    print(text, end="")


if __name__ == "__main__":
    main()
