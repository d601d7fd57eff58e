#!/usr/bin/env python3
"""tests/bench/checkpoints.py ATLAS — the published shapes tools/make_checkpoint.py writes for
bench/gpu/families.sh, at two layers as sparse all-zero files (--fill zeros: no torch, no
disk): `atlas info` reads every header as a load would (each tensor the architecture calls
for, its shape and dtype), and the bytes a decode token reads that it reports (the routed
experts only) match bench/gpu/families_table.py's sum from config.json, which the table's MoE
figures rest on."""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tools"), os.path.join(ROOT, "bench", "gpu")]
import families_table  # noqa: E402
import make_checkpoint  # noqa: E402

# one shape a layout: each family's tensor names, MXFP4 and bf16 experts, tied and untied,
# and the 70B shape issue 34's benchmark makes in AutoGPTQ's layout (bench/gpu/quant.sh)
SHAPES = ["qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-20b-bf16", "mixtral-8x7b", "phi-4",
          "gemma3-27b", "llama3.1-8b", "qwen2.5-7b", "llama3.3-70b --quant gptq"]


def main():
    atlas = sys.argv[1]
    with tempfile.TemporaryDirectory() as t:
        for spec in SHAPES:
            s, *extra = spec.split()
            d = os.path.join(t, s)
            sys.argv = ["make_checkpoint.py", "--shape", s, "--layers", "2", "--fill", "zeros",
                        "--out", d, *extra]
            make_checkpoint.main()
            r = subprocess.run([atlas, "info", "-m", d, "--device", "cpu"], capture_output=True,
                               text=True)
            if r.returncode:
                sys.exit(f"{s}: atlas info refused the checkpoint:\n{r.stdout}{r.stderr}")
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                total = json.load(f)["metadata"]["total_size"]
            got = float(re.search(r"a token reads: +([\d.]+) MiB", r.stdout).group(1)) * 2**20
            want = families_table.Shape(cfg).token_bytes(total)
            if abs(got - want) > 0.001 * want + 0.01 * 2**20:  # atlas prints 2 decimals
                sys.exit(f"{s}: atlas reads {got / 2**20:.2f} MiB a token, families_table.py "
                         f"{want / 2**20:.2f} MiB")
            print(f"{s}: {want / 2**20:.2f} MiB a token, as atlas info says", flush=True)


if __name__ == "__main__":
    main()
