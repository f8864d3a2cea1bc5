"""End-to-end, small parity points (issue 25, part 6):
- logprobs of the tokens that become tool_calls are returned in choices[].logprobs.content, as
  vLLM does, streamed and not (scripted model output, so the real parsing path runs);
- stream_options.continuous_usage_stats: every streamed chunk carries the usage so far;
- the load message gives the KV cache sizes in a unit that shows them (not "0.0 GiB (0 KiB per
  token)" for a small model)."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import TINY, Server, check  # noqa: E402

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


def test_tool_call_logprobs(call_tokens):
    scripted = call_tokens + [151645]  # then <|im_end|>
    with Server(TINY, "--scripted-output", ",".join(map(str, scripted))) as s:
        body = {"messages": PROMPT, "tools": TOOLS, "logprobs": True, "top_logprobs": 2}
        status, r = s.post("/v1/chat/completions", body)
        check(status == 200, f"tool call request: {status} {r}")
        choice = r["choices"][0]
        check(choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather",
              f"tool call parsed: {choice}")
        content = (choice.get("logprobs") or {}).get("content") or []
        check(len(content) == len(call_tokens), f"{len(content)} logprobs for the {len(call_tokens)} tool-call tokens")
        check("".join(e["token"] for e in content) == TOOL_CALL, f"logprob tokens spell {''.join(e['token'] for e in content)!r}")
        check(all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content), "each entry has its top_logprobs")

        chunks, done = s.stream("/v1/chat/completions", body)
        check(done, "tool call stream ended with [DONE]")
        streamed = [e for c in chunks if c.get("choices") for e in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
        calls = [d for c in chunks if c.get("choices") for d in c["choices"][0]["delta"].get("tool_calls", [])]
        check(calls, "the stream carried tool_calls deltas")
        check([e["token"] for e in streamed] == [e["token"] for e in content],
              f"streamed logprobs {len(streamed)} differ from the whole response's {len(content)}")
        check(s.stop() == 0, "SIGTERM exit code")
    print(f"tool-call logprobs: {len(content)} entries, streamed and not")


def check_continuous(chunks, prompt_tokens, max_tokens, what):
    usages = [c.get("usage") for c in chunks]
    check(all(u is not None for u in usages), f"{what}: a chunk without usage")
    completion = [u["completion_tokens"] for u in usages]
    check(completion == sorted(completion), f"{what}: completion tokens go back: {completion}")
    check(completion[-1] == max_tokens, f"{what}: completion tokens {completion}")
    check(all(u["prompt_tokens"] == prompt_tokens and u["total_tokens"] == prompt_tokens + u["completion_tokens"] for u in usages),
          f"{what}: usage {usages}")


def test_continuous_usage(s):
    options = {"include_usage": True, "continuous_usage_stats": True}
    for path, body in (("/v1/chat/completions", {"messages": PROMPT}), ("/v1/completions", {"prompt": "Once upon a time"})):
        body = dict(body, max_tokens=6, ignore_eos=True, temperature=0)
        status, whole = s.post(path, body)
        check(status == 200, f"{path}: {status}")
        prompt_tokens = whole["usage"]["prompt_tokens"]
        chunks, done = s.stream(path, dict(body, stream_options=options))
        check(done, f"{path}: [DONE]")
        check_continuous(chunks, prompt_tokens, 6, path)
        check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0,
              f"{path}: the final usage chunk stays as with include_usage alone: {chunks[-1]}")
        # Without the option (or without include_usage) only the final chunk has usage, as before.
        plain, _ = s.stream(path, dict(body, stream_options={"include_usage": True}))
        check([c for c in plain if c.get("usage")] == [plain[-1]], f"{path}: usage on chunks without continuous_usage_stats")
        alone, _ = s.stream(path, dict(body, stream_options={"continuous_usage_stats": True}))
        check(not any(c.get("usage") for c in alone), f"{path}: continuous_usage_stats without include_usage")
    print("continuous_usage_stats: every chunk carries the usage so far")


def expected_size(n):
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def test_load_message(stderr):
    with open(os.path.join(TINY, "config.json")) as f:
        c = json.load(f)
    per_token = c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2 * 2  # K and V, FP16
    m = re.search(r"KV reserved (\S+ \S+) \((\S+ \S+) per token, fp16\)", stderr)
    check(m is not None, f"no KV line in the load message: {stderr}")
    check(m.group(2) == expected_size(per_token), f"KV per token shown as {m.group(2)}, expected {expected_size(per_token)}")
    value, unit = m.group(1).split()
    check(float(value) >= 1 and unit in ("bytes", "KiB", "MiB", "GiB", "TiB"), f"KV reserved shown as {m.group(1)}")
    print(f"load message: KV reserved {m.group(1)} ({m.group(2)} per token)")


def main():
    with Server(TINY) as s:
        status, ids = s.post("/tokenize", {"prompt": TOOL_CALL})
        check(status == 200, "tokenize")
        test_continuous_usage(s)
        check(s.stop() == 0, "SIGTERM exit code")
        test_load_message(s.proc.stderr.read())
    test_tool_call_logprobs(ids["tokens"])
    print("ok")


if __name__ == "__main__":
    main()
