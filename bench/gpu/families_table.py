#!/usr/bin/env python3
"""bench/gpu/families_table.py — the table of bench/gpu/families.sh: one row a figure, with the
ceiling measured in the same `atlas bench` run, the ratio, the target and whether it is met.

    python3 bench/gpu/families_table.py DIR NAME [NAME ...] > families.md

DIR/NAME.config.json (the checkpoint's), NAME.bench.log (`atlas bench` output), NAME.make.json
(tools/make_checkpoint.py's last line; absent for a checkpoint given as a directory) and
NAME.serve.json (bench/serve/loadgen.py --json; only with SERVE=1).  Standard library only.

Figures and their ceilings:
- decode at batch 1: tok/s x the weight bytes a token reads (atlas_model_info's
  token_weight_bytes: for a MoE layer only the k routed experts of E, k/E of its expert bytes;
  checked here against the same sum from config.json) over the read bandwidth;
- prefill at 2,048 tokens, dense: FLOPs (2 a multiply-add: every projection a token, the
  attention's QK and PV over each token's causal context, cut to the layer's window, and the
  lm_head for the last token) a second over the matrix rate;
- prefill, MoE: the roofline time max(FLOPs / matrix rate, bytes read / read bandwidth), the
  FLOPs with the k routed experts a token and the bytes every weight once (every expert is
  chosen at 2,048 tokens) less the embedding table (its rows only), over the measured time;
- decode of 64 sequences at once (`atlas bench --batch 64`) and the served step (loadgen's
  median inter-token latency at 64 streams, taken at the generation's middle context): the
  ratio is max(read, compute) / step, with bytes = the token's bytes + the experts the 64
  tokens' routing adds (E (1 - (1 - k/E)^64) distinct experts a layer, as uniform routing
  gives) + the KV cache read (bf16, windows cut), FLOPs = 64 tokens' at that context.
A shape run at fewer layers than published has the same per-layer work but its embedding row
and lm_head weigh more in each figure.
"""
import json
import math
import os
import re
import sys

# name: (kind, decode target, prefill target); None: reported, no target
TARGETS = {"qwen3-30b-a3b": ("moe", 0.60, 0.45), "gpt-oss-20b": ("moe", 0.50, 0.45),
           "gpt-oss-20b-bf16": ("moe", None, 0.45), "mixtral-8x7b": ("moe", None, 0.45),
           "phi-4": ("dense", 0.85, 0.60), "gemma3-12b": ("dense", 0.85, 0.60),
           "gemma3-27b": ("dense", 0.85, 0.60), "gemma3-1b": ("dense", None, None),
           "llama3.1-8b": ("dense", None, None)}


def grab(log, pat, cast=float):
    m = re.search(pat, log, re.M)
    return tuple(cast(x) for x in m.groups()) if m else None


def parse(log):
    """The figures of one `atlas bench` output."""
    r = {"prefill": {}, "batch": {}}
    for p, ms, tps in re.findall(r"^prefill\s+(\d+) tokens:\s+([\d.]+) ms\s+(\d+) tok/s", log, re.M):
        r["prefill"][int(p)] = (float(ms), float(tps))
    for b, ctx, ms, tps in re.findall(r"^decode b(\d+)\s+\d+ steps of \d+ sequences after (\d+) "
                                      r"tokens: ([\d.]+) ms/step, (\d+) tok/s", log, re.M):
        r["batch"][int(b)] = (int(ctx), float(ms), float(tps))
    r["decode"] = grab(log, r"^decode\s+\d+ steps after (\d+) tokens: ([\d.]+) ms/token, ([\d.]+) "
                       r"tok/s \(([\d.]+) GB of weights a token")
    r["load"] = grab(log, r"^load\s+([\d.]+) s, ([\d.]+) GB of weights in the files")
    r["read_bw"] = grab(log, r"^read bw\s+(\d+) GB/s")
    mx = grab(log, r"^matrix\s+bf16 \S+: atlas mma.sync (\d+) TFLOP/s, cuBLASLt .* (\d+) TFLOP/s")
    r["matrix"] = max(mx) if mx else None
    r["device"] = (grab(log, r"^device\s+(.+)$", str) or ("?",))[0]
    return r


class Shape:
    """A checkpoint's widths, layer kinds, FLOPs and bytes from its config.json."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.d, self.V, self.L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        self.H, self.K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or self.d // self.H
        self.E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        self.k = cfg.get("num_experts_per_tok") or 0
        self.f = cfg.get("intermediate_size") or 0
        self.fe = cfg.get("moe_intermediate_size") or self.f
        self.tied = bool(cfg.get("tie_word_embeddings"))
        self.mxfp4 = (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4"

    def window(self, i):
        """Layer i's attention window in tokens (None: full)."""
        c, w = self.cfg, self.cfg.get("sliding_window")
        if c.get("layer_types"):
            return w if c["layer_types"][i] == "sliding_attention" else None
        if c.get("sliding_window_pattern"):  # Gemma 3: every P-th layer global
            return None if (i + 1) % c["sliding_window_pattern"] == 0 else w
        if c.get("use_sliding_window") is False:
            return None
        return w

    def moe(self, i):
        c = self.cfg
        step = c.get("decoder_sparse_step") or 1
        return self.E > 0 and i not in (c.get("mlp_only_layers") or []) and (i + 1) % step == 0

    def proj_flops(self, i):
        """A token's multiply-adds x 2 in layer i's matrices (routed experts only)."""
        d, H, K, hd = self.d, self.H, self.K, self.hd
        attn = 2 * d * (H + 2 * K) * hd + 2 * H * hd * d
        if self.moe(i):
            return attn + 2 * d * self.E + self.k * 6 * d * self.fe
        return attn + 6 * d * self.f

    def attn_flops(self, i, ctx):
        """QK and PV of one query over ctx positions in layer i."""
        w = self.window(i)
        return 4 * self.H * self.hd * (min(ctx, w) if w else ctx)

    def prefill_flops(self, p):
        f = 2 * self.d * self.V  # the last token's logits
        for i in range(self.L):
            w = self.window(i) or p
            # sum over t = 1..p of min(t, w)
            ctx_sum = w * (w + 1) // 2 + (p - w) * w if p > w else p * (p + 1) // 2
            f += p * self.proj_flops(i) + 4 * self.H * self.hd * ctx_sum
        return f

    def step_flops(self, B, ctx):
        return B * (2 * self.d * self.V + sum(self.proj_flops(i) + self.attn_flops(i, ctx)
                                              for i in range(self.L)))

    def expert_bytes(self):
        """One expert's bytes as stored: gate, up and down (MXFP4: half a byte a weight and a
        scale byte per 32), gpt-oss's biases of gate|up and down in bf16."""
        n = 3 * self.fe * self.d
        oss = self.cfg["architectures"][0] == "GptOssForCausalLM"
        bias = 2 * (2 * self.fe + self.d) if oss else 0
        return (n // 2 + n // 32 if self.mxfp4 else 2 * n) + bias

    def n_moe(self):
        return sum(self.moe(i) for i in range(self.L))

    def token_bytes(self, all_bytes):
        """A decode token's weight bytes from the file total: k of E experts, one embedding row."""
        b = all_bytes - self.n_moe() * (self.E - self.k) * self.expert_bytes()
        return b - (0 if self.tied else 2 * self.V * self.d) + 2 * self.d

    def kv_bytes(self, ctx):
        """bf16 K and V a sequence reads at ctx positions (windows cut it)."""
        return sum(4 * self.K * self.hd * (min(ctx, self.window(i)) if self.window(i) else ctx)
                   for i in range(self.L))


def pct(x):
    return f"{100 * x:.1f}%"


def verdict(ratio, target):
    if target is None:
        return "report"
    return "met" if ratio >= target else "missed"


def depth(name, cfg, mk):
    L = cfg["num_hidden_layers"]
    if not mk:
        return f"{L} (given)"
    s = f"{L} of {mk['published_layers']}"
    if mk["layers"] < mk["layers_asked"]:
        s += f" (cut from {mk['layers_asked']} to fit)"
    return s


def rows(name, cfg, r, mk, serve, notes):
    sh = Shape(cfg)
    kind, t_dec, t_pre = TARGETS.get(name, ("moe" if sh.E else "dense", None, None))
    dep = depth(name, cfg, mk)
    out = []
    bw, mx = (r["read_bw"] or (None,))[0], r["matrix"]
    if r["decode"]:
        ctx, ms, tps, gb = r["decode"]
        if r["load"]:
            want = sh.token_bytes(r["load"][1] * 1e9) / 1e9
            if gb >= 0.05 and abs(want - gb) > 0.02 * gb:
                notes.append(f"{name}: atlas counts {gb:.2f} GB a token, config.json's sum "
                             f"{want:.2f} GB: the ratio uses atlas's figure")
        val = f"{tps:.1f} tok/s x {gb:.2f} GB = {tps * gb:.0f} GB/s"
        if bw:
            out.append((dep, "decode b1", val, f"read {bw:.0f} GB/s", pct(tps * gb / bw),
                        pct(t_dec) if t_dec else "report", verdict(tps * gb / bw, t_dec)))
        else:
            out.append((dep, "decode b1", val, "not measured", "—", "—", "—"))
    else:
        out.append((dep, "decode b1", "not measured", "—", "—", "—", "—"))
    p = max(r["prefill"]) if r["prefill"] else None
    if p and mx:
        ms, tps = r["prefill"][p]
        fl = sh.prefill_flops(p)
        if kind == "moe":
            read = (r["load"][1] * 1e9 - (0 if sh.tied else 2 * sh.V * sh.d)) if r["load"] else 0
            tc, tr = fl / (mx * 1e12) * 1e3, read / (bw * 1e9) * 1e3 if bw else 0
            roof = max(tc, tr)
            out.append((dep, f"prefill {p}", f"{ms:.1f} ms ({tps:.0f} tok/s)",
                        f"max(compute {tc:.1f}, read {tr:.1f}) = {roof:.1f} ms", pct(roof / ms),
                        pct(t_pre) if t_pre else "report", verdict(roof / ms, t_pre)))
        else:
            tf = fl / (ms / 1e3) / 1e12
            out.append((dep, f"prefill {p}", f"{tps:.0f} tok/s = {tf:.0f} TFLOP/s",
                        f"matrix {mx:.0f} TFLOP/s", pct(tf / mx),
                        pct(t_pre) if t_pre else "report", verdict(tf / mx, t_pre)))
    elif p:
        out.append((dep, f"prefill {p}", f"{r['prefill'][p][1]:.0f} tok/s", "not measured", "—", "—", "—"))
    def roofs(B, ctx):
        """read and compute ms of a step of B sequences at ctx, and its bytes"""
        byt = r["decode"][3] * 1e9 + B * sh.kv_bytes(ctx)
        if sh.E:
            distinct = sh.E * (1 - (1 - sh.k / sh.E) ** B)
            byt += sh.n_moe() * (distinct - sh.k) * sh.expert_bytes()
        return byt / (bw * 1e9) * 1e3, sh.step_flops(B, ctx) / (mx * 1e12) * 1e3, byt

    for B, (ctx, ms, tps) in sorted(r["batch"].items()):
        if not (bw and mx and r["decode"]):
            out.append((dep, f"decode b{B}", f"{ms:.2f} ms/step ({tps:.0f} tok/s)", "not measured",
                        "—", "report", "—"))
            continue
        tr, tc, byt = roofs(B, ctx)
        out.append((dep, f"decode b{B} (ctx {ctx})", f"{ms:.2f} ms/step ({tps:.0f} tok/s)",
                    f"read {tr:.2f} ms ({byt / 1e9:.1f} GB), compute {tc:.2f} ms",
                    pct(max(tr, tc) / ms), "report", "report"))
    if serve:
        lv = serve["levels"][0]
        c, n_in, n_out = lv["concurrency"], serve["input_len"], serve["output_len"]
        itl = float(lv["itl_ms"]["p50"])
        roof, ratio = "—", "—"
        if bw and mx and r["decode"]:  # the middle of the generation: n_in + n_out / 2
            tr, tc, _ = roofs(c, n_in + n_out // 2)
            roof, ratio = f"step: read {tr:.2f} ms, compute {tc:.2f} ms", pct(max(tr, tc) / itl)
        out.append((dep, f"serve c{c} {n_in}/{n_out}", f"{lv['output_tok_s']:.0f} out tok/s, "
                    f"step (ITL p50) {itl:.2f} ms, {lv['requests']} requests", roof, ratio,
                    "report", "report"))
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    d, names = sys.argv[1], sys.argv[2:]
    print("| shape | layers | figure | value | ceiling (same run) | ratio | target | result |")
    print("|---|---|---|---|---|---|---|---|")
    notes, devices, served = [], set(), {}

    def load(n, ext):
        path = os.path.join(d, f"{n}.{ext}")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            txt = f.read()
        if not ext.endswith("json"):
            return txt
        return json.loads(txt.strip().splitlines()[-1] if ext == "make.json" else txt)

    for n in names:
        cfg, log = load(n, "config.json"), load(n, "bench.log")
        if not cfg or log is None:
            why = load(n, "skip")
            print(f"| {n} | — | — | not run{': ' + why.strip() if why else ''} | — | — | — | — |")
            continue
        mk = load(n, "make.json")
        serve = load(n, "serve.json")
        r = parse(log)
        devices.add(r["device"])
        if serve:
            served[n] = serve["levels"][0]["output_tok_s"]
        for row in rows(n, cfg, r, mk, serve, notes):
            print("| " + " | ".join((n,) + row) + " |")
        if mk:
            notes.append(f"{n}: checkpoint {mk['bytes'] / 1e9:.1f} GB written in {mk['seconds']} s "
                         f"({mk['gb_per_s']} GB/s)")
        if not r["decode"]:
            tail = [x for x in log.strip().splitlines() if x][-1:] or ["(empty log)"]
            notes.append(f"{n}: bench ended with: {tail[0][:200]}")
    if len(served) == 2:
        (a, x), (b, y) = served.items()
        notes.append(f"serving at the same settings: {a} {x:.0f} against {b} {y:.0f} output "
                     f"tok/s ({x / y:.2f}x)")
    print()
    print(f"Device: {', '.join(sorted(devices)) or '?'}. Ceilings are the read bandwidth and the "
          "matrix rate `atlas bench` measured in the same run (bench/gpu/families_table.py "
          "says how each figure is computed).")
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    main()
