"""Structured output and forced tool calls by constrained decoding (issue 24), on the random-weight
tiny models, whose unconstrained output is garbage: every output must parse and validate against
its schema with an independent validator (Debian's python3-jsonschema), for 20 seeds per schema;
tool_choice required / named / none in the Qwen3 and Qwen3-Coder formats, streamed and not;
errors name the schema keyword; strict false ignores what cannot be enforced (the output fits the
schema without it), strict true refuses it; an output cut by max_tokens ends with "length"."""
import json
import os
import sys
import tempfile
import time

import jsonschema

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, TINY, TINY_MOE, Server, check  # noqa: E402

CODER_TEMPLATE = os.path.join(SHARED, "text", "qwen3-coder", "chat_template.jinja")
MESSAGES = [{"role": "user", "content": "Describe a person."}]

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                              "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 130},
                                              "score": {"type": "number"}, "ok": {"type": "boolean"}},
             "required": ["name", "age", "score", "ok"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"first": {"type": "string", "minLength": 1, "maxLength": 8},
                                                    "address": {"type": "object", "properties": {
                                                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                        "city": {"type": ["string", "null"], "maxLength": 10}},
                                                        "required": ["zip", "city"]}},
                   "required": ["first", "address"]}}, "required": ["person"]},
    "enums": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3, None]},
                                               "kind": {"const": "shirt"}}, "required": ["color", "size", "kind"]},
    "arrays": {"type": "array", "minItems": 1, "maxItems": 4,
               "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                          "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3}},
                         "required": ["id", "tags"]}},
    "anyof": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer"}, {"type": "string", "maxLength": 6},
        {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}]}},
        "required": ["value"]},
    "ref": {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{2,4}", "minLength": 7},
                                                                "qty": {"type": "integer"}}, "required": ["sku", "qty"]}},
            "type": "object", "properties": {"main": {"$ref": "#/$defs/item"},
                                             "extra": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2}},
            "required": ["main", "extra"]},
    "tool_parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city", "unit"]},
}

# Enough tokens for each schema's shortest output and some more: the grammar closes the output in
# time (counting a byte a token), so a random model's rambling ends early and the test stays short.
MAX_TOKENS = {"flat": 60, "nested": 85, "enums": 60, "arrays": 50, "anyof": 40, "ref": 65, "tool_parameters": 50}

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                      "parameters": SCHEMAS["tool_parameters"]}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 12}, "limit": {"type": "integer"},
                                         "filters": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["query", "limit"]}}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validate(text, schema, what):
    try:
        value = json.loads(text)
        jsonschema.validate(value, schema)
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"{what}: {e}\noutput: {text!r}")
    return value


def schema_body(name, schema, seed, **extra):
    # top_k/top_p off: this random-weight model's sampling then costs less than the model.
    return dict({"messages": MESSAGES, "max_tokens": 60, "seed": seed, "n": 10, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                 "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}}, **extra)


def check_schemas(s):
    for name, schema in SCHEMAS.items():
        outputs = []
        for seed in (0, 10):  # n = 10 choices, seeded seed + i: 20 seeds
            status, r = s.post("/v1/chat/completions", schema_body(name, schema, seed, max_tokens=MAX_TOKENS[name]))
            check(status == 200, f"{name}: {status} {r}")
            for choice in r["choices"]:
                check(choice["finish_reason"] == "stop", f"{name}: finish_reason {choice['finish_reason']}")
                outputs.append(validate(choice["message"]["content"], schema, name))
        check(len(outputs) == 20 and len({json.dumps(o) for o in outputs}) > 1, f"{name}: 20 different outputs")
    # json_object: any object. Completions too, streamed and not.
    status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 60, "n": 8, "seed": 3,
                                                "response_format": {"type": "json_object"}})
    for choice in r["choices"]:
        check(isinstance(validate(choice["message"]["content"], {"type": "object"}, "json_object"), dict), "json_object")
    schema = SCHEMAS["enums"]
    status, r = s.post("/v1/completions", {"prompt": "JSON:", "max_tokens": 60, "n": 4, "seed": 5,
                                           "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": schema}}})
    check(status == 200, f"completions: {status} {r}")
    for choice in r["choices"]:
        validate(choice["text"], schema, "completions")
    chunks, done = s.stream("/v1/completions", {"prompt": "JSON:", "max_tokens": 60, "seed": 6,
                                                "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": schema}}})
    validate("".join(c["choices"][0]["text"] for c in chunks if c["choices"]), schema, "streamed completions")
    chunks, done = s.stream("/v1/chat/completions", schema_body("nested", SCHEMAS["nested"], 7, n=1))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    validate(text, SCHEMAS["nested"], "streamed chat")


def check_errors(s):
    def error(schema, strict=True):
        status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}})
        check(status == 400 and r["error"]["param"] == "response_format", f"{schema}: {status} {r}")
        return r["error"]["message"]
    check("'minimum'" in error({"type": "number", "minimum": 3}), "the unsupported keyword is named")
    check("'uniqueItems'" in error({"type": "array", "uniqueItems": True}), "the unsupported keyword is named")
    check("'pattern'" in error({"type": "string", "pattern": "a(?=b)"}), "an unsupported pattern is named")
    for strict in (True, False):  # malformed: refused either way
        check("'type'" in error({"type": "text"}, strict), "an invalid type is named")
        check("'$ref'" in error({"$ref": "#/nowhere"}, strict), "a bad $ref is named")
        check("'minimum'" in error({"type": "integer", "minimum": "3"}, strict), "a keyword of the wrong type is named")
    status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS,
                                                "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    check(status == 400 and r["error"]["param"] == "tool_choice", f"unknown named function: {status} {r}")
    status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"})
    check(status == 400, f"required without tools: {status} {r}")
    # A function called "none", forced by name, is called (tool_choice "none" is another thing).
    named_none = [{"type": "function", "function": {"name": "none", "parameters": {"type": "object", "properties": {}}}}]
    status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "tools": named_none, "max_tokens": 40,
                                                "tool_choice": {"type": "function", "function": {"name": "none"}}})
    calls = r["choices"][0]["message"].get("tool_calls") or [] if status == 200 else []
    check(len(calls) == 1 and calls[0]["function"]["name"] == "none", f"a function named none: {status} {r}")
    # Too few tokens to close the JSON: cut, and said so.
    long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 40}}, "required": ["text"]}
    status, r = s.post("/v1/chat/completions", schema_body("long", long, 1, max_tokens=12, n=1))
    check(status == 200 and r["choices"][0]["finish_reason"] == "length", f"cut by max_tokens: {r}")
    # Just enough tokens: the grammar steers towards closing in time.
    tight = schema_body("tight", {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array"}},
                                  "required": ["a", "b"]}, 2, max_tokens=16, n=4)
    status, r = s.post("/v1/chat/completions", tight)
    for choice in r["choices"]:
        check(choice["finish_reason"] == "stop", f"tight budget: {choice}")
        validate(choice["message"]["content"], tight["response_format"]["json_schema"]["schema"], "tight budget")


# strict false (OpenAI's default): what only narrows the values and cannot be enforced is ignored;
# the output then fits the schema without those keywords (an integer's bounds still hold).
LENIENT = {"type": "object", "properties": {
    "count": {"type": "integer", "minimum": 1, "maximum": 9},  # enforced: an integer's bounds are
    "ratio": {"type": "number", "minimum": 0.5, "multipleOf": 0.25},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True, "maxItems": 3},
    "code": {"type": "string", "pattern": "^(?!x)[a-z]{2}$", "maxLength": 5}},
    "required": ["count", "ratio", "tags", "code"], "minProperties": 3, "additionalProperties": False}
UNENFORCEABLE = {"uniqueItems", "minProperties", "pattern"}  # and a number's minimum, multipleOf


def without(schema, keywords):
    if isinstance(schema, dict):
        return {k: without(v, keywords) for k, v in schema.items() if k not in keywords}
    return schema


LOOSER = without(dict(LENIENT, properties=dict(LENIENT["properties"], ratio={"type": "number"})), UNENFORCEABLE)


def check_lenient(s):
    looser = LOOSER
    for strict in (False, None):
        spec = {"name": "lenient", "schema": LENIENT}
        if strict is not None:
            spec["strict"] = strict
        status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 60, "seed": 4, "n": 4, "temperature": 1.0,
                                                    "top_k": 0, "top_p": 1.0, "response_format": {"type": "json_schema", "json_schema": spec}})
        check(status == 200, f"strict {strict}: {status} {r}")
        for choice in r["choices"]:
            validate(choice["message"]["content"], looser, f"strict {strict}")
    status, r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10, "response_format": {
        "type": "json_schema", "json_schema": {"name": "lenient", "schema": LENIENT, "strict": True}}})
    named = [k for k in UNENFORCEABLE | {"minimum", "multipleOf"} if f"keyword '{k}'" in r["error"]["message"]]
    check(status == 400 and named and "strict" in r["error"]["message"], f"strict true: {status} {r}")
    # Tool parameters: strict only when the function says so.
    tool = {"type": "function", "function": {"name": "count", "parameters": LENIENT}}
    body = {"messages": MESSAGES, "tools": [tool], "tool_choice": "required", "max_tokens": 80, "seed": 2}
    status, r = s.post("/v1/chat/completions", body)
    check(status == 200, f"lenient tool: {status} {r}")
    validate(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], looser, "lenient tool arguments")
    strict_tool = {"type": "function", "function": dict(tool["function"], strict=True)}
    status, r = s.post("/v1/chat/completions", dict(body, tools=[strict_tool]))
    named = [k for k in UNENFORCEABLE | {"minimum", "multipleOf"} if f"keyword '{k}'" in r["error"]["message"]]
    check(status == 400 and r["error"]["param"] == "tools" and named, f"strict tool: {status} {r}")


def stream_calls(s, body):
    """The streamed tool calls, rebuilt from their deltas; checks id and name come first."""
    chunks, done = s.stream("/v1/chat/completions", body)
    check(done, "stream ends with [DONE]")
    calls, finish, content, fragments = {}, None, "", {}
    for c in chunks:
        for choice in c["choices"]:
            content += choice["delta"].get("content") or ""
            for tc in choice["delta"].get("tool_calls") or []:
                i = tc["index"]
                if i not in calls:
                    check(tc.get("id") and tc["function"].get("name"), f"the first delta of a call has id and name: {tc}")
                    calls[i] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
                    fragments[i] = 0
                else:
                    check(not tc.get("id") and not tc["function"].get("name"), f"id and name only once: {tc}")
                if tc["function"].get("arguments"):
                    calls[i]["arguments"] += tc["function"]["arguments"]
                    fragments[i] += 1
            finish = choice["finish_reason"] or finish
    return [calls[i] for i in sorted(calls)], finish, content, fragments


def check_calls(calls, finish, only=None, single=False, what=""):
    check(finish == "tool_calls", f"{what}: finish_reason {finish}")
    check(len(calls) >= 1 and (not single or len(calls) == 1), f"{what}: {len(calls)} calls")
    for call in calls:
        name = call["function"]["name"] if "function" in call else call["name"]
        arguments = call["function"]["arguments"] if "function" in call else call["arguments"]
        check(name in PARAMETERS and (only is None or name == only), f"{what}: called {name}")
        validate(arguments, PARAMETERS[name], f"{what}: {name} arguments")


def check_tools(s, fmt):
    base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "max_tokens": 110,
            "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    fragmented = 0
    for seed in range(2):
        for choice, only, single in (("required", None, False), ({"type": "function", "function": {"name": "search"}}, "search", True)):
            body = dict(base, seed=seed, tool_choice=choice, parallel_tool_calls=seed % 2 == 0)
            single = single or seed % 2 == 1
            status, r = s.post("/v1/chat/completions", body)
            check(status == 200, f"{fmt}: {status} {r}")
            message = r["choices"][0]["message"]
            check(not (message["content"] or "").strip(), f"{fmt}: no content beside forced calls: {message}")
            check_calls(message.get("tool_calls") or [], r["choices"][0]["finish_reason"], only, single, f"{fmt} {choice}")
            calls, finish, content, fragments = stream_calls(s, body)
            check(not content.strip(), f"{fmt} stream: no content: {content!r}")
            check_calls(calls, finish, only, single, f"{fmt} {choice} streamed")
            fragmented += sum(1 for n in fragments.values() if n > 1)
    check(fragmented > 0, f"{fmt}: streamed arguments come in fragments")
    # tool_choice none: no tool-call markup, whatever the random model wants.
    for seed in range(3):
        status, r = s.post("/v1/chat/completions", dict(base, seed=seed, tool_choice="none", max_tokens=40))
        message = r["choices"][0]["message"]
        check(not message.get("tool_calls") and "<tool_call>" not in (message["content"] or ""), f"{fmt} none: {message}")


def check_thinking():
    """A template that opens <think>: the reasoning is free, the content after it is JSON."""
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}{# ends with </think> #}")
    try:
        with Server(TINY_MOE, "--chat-template", f.name) as s:
            schema = SCHEMAS["enums"]
            for stream in (False, True):
                body = schema_body("t", schema, 11, n=1, max_tokens=50)
                if stream:
                    chunks, _ = s.stream("/v1/chat/completions", body)
                    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
                    content = "".join(d.get("content") or "" for d in deltas)
                    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
                else:
                    status, r = s.post("/v1/chat/completions", body)
                    content = r["choices"][0]["message"]["content"]
                    reasoning = r["choices"][0]["message"]["reasoning_content"] or ""
                check(len(reasoning) > 0, "the model thought first")
                validate(content, schema, "content after </think>")
    finally:
        os.unlink(f.name)


def main():
    start = time.time()
    with Server(TINY, "--batch-size", "4") as s:  # choices decode together
        check_schemas(s)
        check_errors(s)
        check_lenient(s)
        check_tools(s, "qwen3")
    with Server(TINY, "--chat-template", CODER_TEMPLATE, sequence_length=1024) as s:
        check_tools(s, "qwen3_coder")
    check_thinking()
    print(f"ok ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()
