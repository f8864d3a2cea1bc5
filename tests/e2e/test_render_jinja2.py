#!/usr/bin/env python3
"""Differential test: `ellm render` against Python jinja2 configured as Hugging Face does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF's tojson), on
seeded random conversations with tools, tool calls, reasoning and awkward values, for both
shared templates. Skips when jinja2 is not installed."""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 not installed: skipped")
    sys.exit(0)

ELLM = os.environ["ELLM_BIN"]
TEXT = os.path.join(os.environ["ELLM_SHARED"], "text")
CASES_PER_TEMPLATE = int(os.environ.get("ELLM_RENDER_CASES", "60"))


def hf_environment():
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def vllm_normalize(messages):
    out = json.loads(json.dumps(messages))
    for m in out:
        if m.get("role") == "assistant" and "content" in m and m["content"] is None:
            m["content"] = ""
        for call in m.get("tool_calls") or []:
            f = call.get("function")
            if isinstance(f, dict) and isinstance(f.get("arguments"), str):
                try:
                    f["arguments"] = json.loads(f["arguments"])
                except ValueError:
                    pass
    return out


WORDS = ["hello", "naïve", "日本語", "emoji 😀", "tab\there", "quote \"q\" 'a'", "back\\slash", "<tag>",
         "line\nbreak", "  padded  ", "{{ not a template }}", "</think>", "", "\u2028sep", "100%"]


def text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))


def value(rng, depth=0):
    kinds = ["str", "int", "float", "bool", "null", "list", "dict"] if depth < 3 else ["str", "int", "float"]
    k = rng.choice(kinds)
    if k == "str":
        return text(rng)
    if k == "int":
        return rng.choice([0, -1, 7, 2**40, -(2**53)])
    if k == "float":
        return rng.choice([0.5, 1.0, -2.25, 1e-7, 3.14159, 1e16, 123456.789, 2.5e-5])
    if k == "bool":
        return rng.random() < 0.5
    if k == "null":
        return None
    if k == "list":
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "zeta", "Beta", "ключ", "x y"]) + str(i): value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def tool(rng, i):
    props = {}
    for j in range(rng.randint(0, 3)):
        p = {"type": rng.choice(["string", "integer", "number", "boolean", "array", ["string", "null"]])}
        if rng.random() < 0.7:
            p["description"] = text(rng) + " "
        if rng.random() < 0.3:
            p["enum"] = ["a", "b"]
        if rng.random() < 0.2:
            p["items"] = {"type": "string"}
        props[f"p{j}"] = p
    function = {"name": f"tool_{i}"}
    if rng.random() < 0.8:
        function["description"] = text(rng)
    if rng.random() < 0.9:
        function["parameters"] = {"type": "object", "properties": props, "required": list(props)[:1]}
    if rng.random() < 0.2:
        function["strict"] = True
    return {"type": "function", "function": function} if rng.random() < 0.9 else function


def tool_call(rng):
    args = {f"arg{i}": value(rng) for i in range(rng.randint(0, 3))}
    as_string = rng.random() < 0.5
    return {"id": "call_%d" % rng.randint(0, 999), "type": "function",
            "function": {"name": "tool_%d" % rng.randint(0, 2), "arguments": json.dumps(args) if as_string else args}}


def conversation(rng):
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": text(rng) if rng.random() < 0.9 else "<tool_response>x</tool_response>"})
        if rng.random() < 0.3:
            continue
        reply = {"role": "assistant", "content": text(rng)}
        r = rng.random()
        if r < 0.3:
            reply["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + text(rng)
        elif r < 0.45:
            reply["reasoning_content"] = text(rng)
        if rng.random() < 0.35:
            reply["tool_calls"] = [tool_call(rng) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.4:
                reply["content"] = None
            messages.append(reply)
            for _ in range(rng.randint(1, 2)):
                messages.append({"role": "tool", "content": text(rng)})
            if rng.random() < 0.5:
                messages.append({"role": "assistant", "content": text(rng)})
        else:
            messages.append(reply)
    return messages


def main():
    env = hf_environment()
    rng = random.Random(1234)
    failures = 0
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["qwen3", "qwen3-coder"]:
            with open(os.path.join(TEXT, name, "chat_template.jinja"), encoding="utf-8") as f:
                template = env.from_string(f.read())
            for i in range(CASES_PER_TEMPLATE):
                messages = conversation(rng)
                tools = [tool(rng, j) for j in range(rng.randint(1, 3))] if rng.random() < 0.5 else None
                request = {"messages": messages, "add_generation_prompt": rng.random() < 0.7}
                if tools is not None:
                    request["tools"] = tools
                kwargs = {}
                if rng.random() < 0.5:
                    kwargs["enable_thinking"] = rng.random() < 0.5
                    request["chat_template_kwargs"] = kwargs
                try:
                    expected = template.render(messages=vllm_normalize(messages), tools=tools,
                                               add_generation_prompt=request["add_generation_prompt"],
                                               eos_token="<|im_end|>", **kwargs)
                except Exception as e:  # the template itself rejects this input
                    expected = None
                path = os.path.join(tmp, "req.json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(request, f, ensure_ascii=False)
                run = subprocess.run([ELLM, "render", "--model-path", os.path.join(TEXT, name), "--request", path],
                                     capture_output=True)
                total += 1
                got = run.stdout.decode("utf-8") if run.returncode == 0 else None
                if got != expected:
                    failures += 1
                    if failures <= 3:
                        print(f"MISMATCH {name} case {i}: request {json.dumps(request, ensure_ascii=False)[:2000]}")
                        print("  expected:", repr(expected)[:2000])
                        print("  got:     ", repr(got)[:2000], run.stderr.decode(errors="replace")[:500])
    print(f"render vs jinja2: {total - failures}/{total} identical")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
