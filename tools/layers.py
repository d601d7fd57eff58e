#!/usr/bin/env python3
"""tools/layers.py — the house rules for dependencies, checked from the build.

Reads the object files of the library and the CLI (their symbols, through `nm`) and the
sources' `#include "..."` lines, and fails when
  * a file includes a header of a higher layer, or calls a function defined in one;
  * files call each other in a cycle (of any length, within a layer too);
  * src/ reads an ATLAS_* environment variable that docs/SERVER.md does not list, or more than
    MAX_ENV of them (options are flags and params, not environment switches);
  * src/cli, src/server or the `atlas bench` command (bench/cmd/bench.c) include a library
    header outside include/atlas/ and their own directory (the bench command may include
    the one header listed in PRIVATE_OK).
The layers, lowest first, are those of docs/ARCHITECTURE.md.

usage: tools/layers.py BUILD_DIR [--graph]   (run by the ctest `layers`)
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Directory (under src/, or include/atlas) -> layer; a file may use its own layer and below.
LAYERS = [
    ("core", 0),
    ("format", 1),
    ("tokenizer", 2),
    ("chat", 3),
    ("backend", 4),
    ("model", 5),
    ("engine", 6),
    ("parallel", 6),
    ("server", 7),
    ("cli", 7),
]
LAYER_NAMES = {0: "core", 1: "format", 2: "tokenizer", 3: "chat", 4: "backend", 5: "model",
               6: "engine/parallel", 7: "server/cli"}

# The one internal header the `atlas bench` command may include besides include/atlas/.
PRIVATE_OK = {("bench/cmd/bench.c", "bench/cmd/bench_internal.h")}

# Lower layers that a layer still may not include or call: (layer dir, lower dir) -> why.
NOT_BELOW = {
    ("backend", "format"): "the backend knows no files or checkpoint formats: it is handed "
                           "weight sources (backend.h's atlas_weight_src) that the model "
                           "builds and reads",
}


def layer_of(path):
    """Layer of a source path relative to ROOT; None outside the layered tree."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2:
        for name, rank in LAYERS:
            if parts[1] == name:
                return rank
        return None
    if parts[0] == "src" and len(parts) == 2:
        return None
    if parts[:2] == ["bench", "cmd"]:
        return 7  # the `atlas bench` command and its measuring code, beside the CLI
    if parts[:2] == ["include", "atlas"]:
        return PUBLIC_LAYER.get(parts[2])
    return None


# Public headers declare functions of one layer each.
PUBLIC_LAYER = {
    "status.h": 0, "host.h": 4, "tokenizer.h": 2, "template.h": 3, "toolcall.h": 3,
    "reasoning.h": 3, "harmony.h": 3, "shield.h": 3, "model.h": 5, "sampler.h": 4, "constraint.h": 6, "engine.h": 6,
    "parallel.h": 6, "server.h": 7, "atlas.h": 7, "version.h": 0, "memdir.h": 0, "utf8.h": 0,
}


def objects(build):
    out = {}
    # the library's objects are compiled once in atlas_obj (libatlas.a and .so link them)
    for target in ("atlas_obj.dir", "atlas.dir", "atlas_bench.dir"):
        base = os.path.join(build, "CMakeFiles", target)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".c.o"):
                    obj = os.path.join(dirpath, f)
                    src = os.path.relpath(obj, base)[: -len(".o")]
                    if os.path.exists(os.path.join(ROOT, src)):  # not a file since removed
                        out[src] = obj
    return out


def symbols(obj):
    res = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCWVG" and kind.isupper():
            defined.add(name)
    return defined, undefined


MAX_ENV = 6
GETENV = re.compile(r'getenv\("(ATLAS_[A-Z0-9_]+)"\)')


def env_problems(sources):
    names = set()
    for p in sources:
        if p.startswith(("src/", "bench/cmd/")):
            with open(os.path.join(ROOT, p), encoding="utf-8", errors="replace") as fh:
                names.update(GETENV.findall(fh.read()))
    with open(os.path.join(ROOT, "docs", "SERVER.md"), encoding="utf-8") as fh:
        listed = fh.read()
    out = [f"{n} is read in src/ but docs/SERVER.md (\"Environment\") does not list it"
           for n in sorted(names) if f"`{n}`" not in listed]
    if len(names) > MAX_ENV:
        out.append(f"{len(names)} ATLAS_* environment variables read ({', '.join(sorted(names))}); "
                   f"at most {MAX_ENV}: make it a flag")
    return out


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def resolve(path, inc):
    for base in (os.path.dirname(path), "src", "include"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(os.path.join(ROOT, cand)):
            return cand
    return None


def includes(paths):
    edges = {}
    for p in paths:
        with open(os.path.join(ROOT, p), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        edges[p] = [r for r in (resolve(p, i) for i in INCLUDE.findall(text)) if r]
    return edges


def sccs(graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = argv[1]
    objs = objects(build)
    if not objs:
        print(f"layers: no object files under {build}/CMakeFiles", file=sys.stderr)
        return 2
    syms = {src: symbols(obj) for src, obj in objs.items()}
    owner = {}
    for src, (defined, _) in syms.items():
        for s in defined:
            owner.setdefault(s, src)
    calls = {src: sorted({owner[s] for s in und if s in owner and owner[s] != src})
             for src, (_, und) in syms.items()}

    sources = []
    for top in ("src", "include/atlas", "bench/cmd"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".c", ".h")):
                    sources.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    incs = includes(sorted(sources))

    problems = []
    for f in sorted(sources):
        if layer_of(f) is None:
            problems.append(f"{f}: in no layer (add its directory to tools/layers.py)")
    for kind, graph in (("includes", incs), ("calls", calls)):
        for a, bs in sorted(graph.items()):
            la = layer_of(a)
            for b in bs:
                lb = layer_of(b)
                if la is not None and lb is not None and lb > la:
                    problems.append(f"{a} ({LAYER_NAMES[la]}) {kind} {b} ({LAYER_NAMES[lb]}): "
                                    "upward")
                why = NOT_BELOW.get((a.split("/")[1], b.split("/")[1])) \
                    if a.startswith("src/") and b.startswith("src/") else None
                if why:
                    problems.append(f"{a} {kind} {b}: {why}")
    fronts = ("src/cli/", "src/server/", "bench/cmd/bench.c")
    for a, bs in sorted(incs.items()):
        if a.startswith(fronts):
            own = os.path.dirname(a) + "/"
            for b in bs:
                if (not b.startswith("include/atlas/") and not b.startswith(own)
                        or b.startswith("bench/") and a.startswith("bench/")) \
                        and (a, b) not in PRIVATE_OK:
                    problems.append(f"{a} includes {b}: front ends use include/atlas/ only")
    problems += env_problems(sources)
    for comp in sccs(calls):
        problems.append("files call each other: " + " <-> ".join(comp))

    if "--graph" in argv:
        for a, bs in sorted(calls.items()):
            print(f"{a} -> {' '.join(bs)}")
    for p in problems:
        print("layers: " + p)
    print(f"layers: {len(objs)} objects, {len(sources)} sources, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
