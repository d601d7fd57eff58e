#!/usr/bin/env python3
"""Writes expected.json: each family's chat template here rendered by jinja2 the way
transformers' apply_chat_template(tokenize=False) renders it (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now), after
the tool-call argument conversion vLLM does (a JSON string holding an object becomes the
object). tests/test-template.c renders the same cases and compares byte for byte.

Run from this directory with jinja2 installed:  python3 make_expected.py
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """transformers' AssistantTracker, reduced to what rendering needs: the body as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token(cfg, key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v


def convert_arguments(messages):
    for m in messages:
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            if isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
    return messages


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def tool_round(arguments):
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 22, \"sky\": \"clear\"}"},
    ]


CASES = [
    ("chat", {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello! Ça va? 你好"},
        {"role": "assistant", "content": "  Fine, thanks.  "},
        {"role": "user", "content": "Tell me a joke."}]}),
    ("no-system-no-prompt", {"gen": False, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}]}),
    ("tools-offered", {"tools": [WEATHER], "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"}]}),
    ("tool-round-object-args", {"tools": [WEATHER], "messages": tool_round({"city": "Paris", "unit": "celsius"})}),
    ("tool-round-string-args", {"tools": [WEATHER], "messages": tool_round("{\"city\": \"Paris\"}")}),
    ("thinking-effort", {"tools": [WEATHER], "extra": {"reasoning_effort": "high"}, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "thinking": "Need the weather tool.", "tool_calls": [
            {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 22}"},
        {"role": "assistant", "content": "It is 22 degrees."},
        {"role": "user", "content": "Thanks"}]}),
]


def load(d):
    """(template source, tokenizer_config) of a directory: chat_template.jinja wins over the
    config's chat_template, as in transformers."""
    cfg = {}
    path = os.path.join(d, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    jinja = os.path.join(d, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), cfg
    return cfg.get("chat_template"), cfg


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    env = environment()
    out = []
    for family in sorted(os.listdir(here)):
        if not os.path.isdir(os.path.join(here, family)):
            continue
        source, cfg = load(os.path.join(here, family))
        if not source:
            continue
        tmpl = env.from_string(source)
        for name, case in CASES:
            extra = {"date_string": "26 Jul 2024", **case.get("extra", {})}
            kwargs = {k: token(cfg, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token") if token(cfg, k)}
            messages = convert_arguments(json.loads(json.dumps(case["messages"])))
            entry = {"family": family, "case": name, "messages": case["messages"], "gen": case.get("gen", True), "extra": extra}
            if "tools" in case:
                entry["tools"] = case["tools"]
            try:
                entry["expected"] = tmpl.render(messages=messages, tools=case.get("tools"), documents=None,
                                                add_generation_prompt=entry["gen"], **kwargs, **extra)
            except Exception as e:  # the template refuses this conversation: atlas must refuse too
                entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
    with open(os.path.join(here, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} renderings ({sum('error' in e for e in out)} refused) with jinja2 {jinja2.__version__}")
    constructs(env, here)
    random_conversations(env, here)


CONSTRUCT_MESSAGES = [
    {"role": "system", "content": "  sys  "},
    {"role": "user", "content": "hi </think> there"},
    {"role": "assistant", "content": "<think>\nr\n</think>\n\nans", "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [1, 2.5, None, True, "é"]}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": "bye"},
]


def constructs(env, here):
    """constructs.txt: small templates (separated by a line "=====") exercising one
    construct each; constructs.json: what jinja2 renders for each with CONSTRUCT_MESSAGES."""
    with open(os.path.join(here, "constructs.txt"), encoding="utf-8") as f:
        sources = [t for t in f.read().split("\n=====\n") if t.strip()]
    out = []
    for src in sources:
        entry = {"template": src}
        try:
            entry["expected"] = env.from_string(src).render(
                messages=CONSTRUCT_MESSAGES, tools=None, documents=None, add_generation_prompt=True,
                bos_token="<s>", eos_token="</s>")
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    with open(os.path.join(here, "constructs.json"), "w", encoding="utf-8") as f:
        json.dump({"messages": CONSTRUCT_MESSAGES, "cases": out}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} constructs")



TEXTS = ["", "hi", "  padded  ", "multi\nline\n", "ünïcödé 你好 🙂", "quote \" and ' and \\",
         "<think>\nplan\n</think>\n\nanswer", "{\"json\": 1}", "tab\there", "<tool_response>x</tool_response>"]


def random_conversations(env, here, seed=7, per_template=16):
    """random.json: seeded random conversations (roles out of order, tool calls with object,
    string and invalid arguments, missing or null content, reasoning_content, tools or not)
    for every template here and the two model templates, as jinja2 renders or refuses them."""
    import random
    rnd = random.Random(seed)

    def arguments():
        c = rnd.random()
        if c < 0.3:
            return {"city": rnd.choice(TEXTS), "n": rnd.randint(-5, 5)}
        if c < 0.5:
            return json.dumps({"q": rnd.choice(TEXTS), "f": round(rnd.random(), 3)})
        if c < 0.6:
            return "not json"
        if c < 0.7:
            return {}
        return {"nested": {"l": [1, 2.5, None, True], "s": rnd.choice(TEXTS)}}

    def message(role):
        m = {"role": role, "content": rnd.choice(TEXTS)}
        if role == "assistant" and rnd.random() < 0.4:
            m["tool_calls"] = [{"id": rnd.choice(["call12345", "abcdefghi", "x"]), "type": "function",
                                "function": {"name": rnd.choice(["f", "get_weather"]), "arguments": arguments()}}
                               for _ in range(rnd.randint(1, 2))]
            if rnd.random() < 0.5:
                m["content"] = rnd.choice(["", None])
        if role == "assistant" and rnd.random() < 0.2:
            m["reasoning_content"] = rnd.choice(TEXTS)
        if role == "tool":
            m["tool_call_id"] = rnd.choice(["call12345", "abcdefghi"])
        if rnd.random() < 0.05:
            del m["content"]
        return m

    def conversation():
        ms = [message("system")] if rnd.random() < 0.5 else []
        for i in range(rnd.randint(1, 6)):
            roles = ["user", "assistant", "user", "assistant", "tool"] if rnd.random() < 0.3 else [["user", "assistant"][i % 2]]
            ms.append(message(rnd.choice(roles)))
        return ms

    dirs = ["../tiny-llama3", "../tiny-qwen3"] + sorted(d for d in os.listdir(here) if os.path.isdir(os.path.join(here, d)))
    out = []
    for d in dirs:
        source, cfg = load(os.path.join(here, d))
        tmpl = env.from_string(source)
        kwargs = {k: token(cfg, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token") if token(cfg, k)}
        for _ in range(per_template):
            extra = {"date_string": "26 Jul 2024"}
            if rnd.random() < 0.5:
                extra["enable_thinking"] = rnd.random() < 0.5
            if d == "gpt_oss" and rnd.random() < 0.5:  # a draw only here: the others' stay as they were
                extra["reasoning_effort"] = rnd.choice(["low", "medium", "high"])
            entry = {"family": d, "messages": conversation(), "gen": rnd.random() < 0.7, "extra": extra}
            if rnd.random() < 0.4:
                entry["tools"] = [WEATHER]
            messages = convert_arguments(json.loads(json.dumps(entry["messages"])))
            try:
                entry["expected"] = tmpl.render(messages=messages, tools=entry.get("tools"), documents=None,
                                                add_generation_prompt=entry["gen"], **kwargs, **extra)
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
    with open(os.path.join(here, "random.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} random conversations ({sum('error' in e for e in out)} refused)")


if __name__ == "__main__":
    main()
