"""Tool calls the model writes on its own (tool_choice auto or absent), streamed as vLLM streams
them: the text before the call as content, then the call's id and name (with the first arguments
fragment when one step completes the name and starts them: one entry per call index in a chunk),
then its arguments in fragments as they are generated, which add up to the arguments of the whole (non-streamed) reply.
Both formats (Qwen3 JSON, Qwen3-Coder XML), through the real server with --scripted-output so the
model's text is fixed. Also: an unknown function stays text, and with tool_choice "none" a call
spelled by ordinary tokens ("<", "tool", "_call", ">") stays text too."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, TINY, Server, check  # noqa: E402

CODER_TEMPLATE = os.path.join(SHARED, "text", "qwen3-coder", "chat_template.jinja")
QWEN36_TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template.jinja")
QWEN38_TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template_qwen38.jinja")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "integer"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
ARGUMENTS = {"city": "Paris", "unit": "celsius", "days": 3}
BEFORE = "Let me check."
QWEN3_CALL = '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}\n</tool_call>'
CODER_CALL = ("\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
              "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def token_ids(s, *pieces):
    """The ids of the pieces, each tokenized alone, then <|im_end|>; checks they spell the text."""
    ids = []
    for piece in pieces + ("<|im_end|>",):
        status, r = s.post("/tokenize", {"prompt": piece})
        check(status == 200, f"tokenize {piece!r}: {r}")
        ids += r["tokens"]
    status, r = s.post("/detokenize", {"tokens": ids[:-1]})
    check(r["prompt"] == "".join(pieces), f"the ids spell {r['prompt']!r}")
    return ids


def stream_events(s, body):
    """The stream as an ordered list of ("content", text) and ("call", tool-call delta) events,
    with the number of chunks that carried argument text and the finish_reason."""
    chunks, done = s.stream("/v1/chat/completions", body)
    check(done, "the stream ends with [DONE]")
    events, argument_chunks, finish = [], 0, None
    for c in chunks:
        for choice in c["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                events.append(("content", delta["content"]))
            carried = False
            indices = [tc["index"] for tc in delta.get("tool_calls") or []]
            check(len(indices) == len(set(indices)), f"one entry per call index in a chunk (as OpenAI, vLLM): {delta}")
            for tc in delta.get("tool_calls") or []:
                events.append(("call", tc))
                carried = carried or bool(tc["function"].get("arguments"))
            argument_chunks += carried
            finish = choice["finish_reason"] or finish
    return events, argument_chunks, finish


def check_auto_call(fmt, call_text, template_args):
    with Server(TINY) as s:
        scripted = token_ids(s, BEFORE, call_text)
    # 10 ms per token: the reader keeps pace, so the arguments' fragments do not merge (a stream
    # merges the text its reader has not taken yet; under a loaded CI machine they did).
    with Server(TINY, *template_args, "--scripted-output", ",".join(map(str, scripted)),
                "--scripted-token-ms", "10") as s:
        for tool_choice in (None, "auto"):
            body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": len(scripted) + 5}
            if tool_choice:
                body["tool_choice"] = tool_choice
            what = f"{fmt}, tool_choice {tool_choice}"
            status, whole = s.post("/v1/chat/completions", body)
            check(status == 200, f"{what}: {status} {whole}")
            message = whole["choices"][0]["message"]
            check(message["content"] == BEFORE and len(message["tool_calls"]) == 1, f"{what}: whole reply {message}")
            whole_arguments = message["tool_calls"][0]["function"]["arguments"]
            check(json.loads(whole_arguments) == ARGUMENTS, f"{what}: arguments {whole_arguments}")

            events, argument_chunks, finish = stream_events(s, body)
            kinds = [kind for kind, _ in events]
            first_call = kinds.index("call")
            check(set(kinds[first_call:]) == {"call"}, f"{what}: content after the call began: {events}")
            check("".join(text for kind, text in events[:first_call]) == BEFORE, f"{what}: streamed content {events}")
            calls = [tc for kind, tc in events if kind == "call"]
            header = calls[0]
            # The step that completes the name may also start the arguments: then the header
            # carries that first fragment (one entry per index).
            check(header.get("id", "").startswith("call_") and header.get("type") == "function" and
                  header["function"].get("name") == "get_weather",
                  f"{what}: the first delta is the call's id and name: {header}")
            fragments = [tc["function"].get("arguments") or "" for tc in calls]
            check(all(tc["index"] == 0 and "id" not in tc and "name" not in tc["function"] for tc in calls[1:]),
                  f"{what}: id and name only once: {calls}")
            check(argument_chunks >= 3, f"{what}: the arguments came in {argument_chunks} chunks: {fragments}")
            check("".join(fragments) == whole_arguments,
                  f"{what}: the fragments {fragments} add up to {''.join(fragments)!r}, the whole reply says {whole_arguments!r}")
            check(finish == "tool_calls", f"{what}: finish_reason {finish}")
    print(f"{fmt}: the auto call streamed its id and name, then {argument_chunks} argument fragments")


def check_text_stays_text(what, pieces, body_extra):
    """The scripted text comes back as content, verbatim, streamed and not, with no tool call."""
    with Server(TINY) as s:
        scripted = token_ids(s, *pieces)
        status, special = s.post("/tokenize", {"prompt": "<tool_call>"})
    text = "".join(pieces)
    with Server(TINY, "--scripted-output", ",".join(map(str, scripted))) as s:
        body = dict({"messages": MESSAGES, "tools": TOOLS, "max_tokens": len(scripted) + 5}, **body_extra)
        status, whole = s.post("/v1/chat/completions", body)
        message = whole["choices"][0]["message"]
        check(status == 200 and message["content"] == text and not message.get("tool_calls"), f"{what}: {message}")
        check(whole["choices"][0]["finish_reason"] == "stop", f"{what}: finish_reason {whole['choices'][0]}")
        events, _, finish = stream_events(s, body)
        check(all(kind == "content" for kind, _ in events) and "".join(t for _, t in events) == text,
              f"{what}: streamed {events}")
        check(finish == "stop", f"{what}: streamed finish_reason {finish}")
        if body_extra.get("tool_choice") == "none":  # the same text is a call when the parser runs
            status, auto = s.post("/v1/chat/completions", dict(body, tool_choice="auto"))
            check(auto["choices"][0]["message"].get("tool_calls"), f"{what}: with auto it is a call: {auto}")
    return special["tokens"], scripted


def check_qwen35_reply(version, template, model):
    """Qwen3.6 / Qwen3.8's official template: the prompt opens the reply with <think>\n, so the model
    writes its reasoning, </think>, then text and an XML call (the qwen3_coder format, detected from
    the template). Whole and streamed, the reasoning, content and call land in their fields; the
    template's switches (preserve_thinking, Qwen3.8's reasoning_effort) reach it."""
    reasoning = "The user wants the weather."
    with Server(TINY) as s:
        scripted = token_ids(s, reasoning, "</think>", "\n\n", BEFORE, CODER_CALL)
    with Server(model, "--chat-template", template, "--scripted-output", ",".join(map(str, scripted))) as s:
        body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": len(scripted) + 5}
        status, r = s.post("/tokenize", dict(body, add_generation_prompt=True))
        status, text = s.post("/detokenize", {"tokens": r["tokens"]})
        check(text["prompt"].endswith("<|im_start|>assistant\n<think>\n"), f"{version}: the prompt opens the reply in reasoning: {text['prompt'][-60:]!r}")
        if version == "qwen3.8":
            low = s.post("/tokenize", dict(body, add_generation_prompt=True, chat_template_kwargs={"reasoning_effort": "low"}))[1]
            low_text = s.post("/detokenize", {"tokens": low["tokens"]})[1]["prompt"]
            check("Reasoning effort is set to low" in low_text, f"reasoning_effort reaches the template: {low_text[:120]!r}")
        status, whole = s.post("/v1/chat/completions", body)
        check(status == 200, f"{version}: {status} {whole}")
        message = whole["choices"][0]["message"]
        check(message.get("reasoning_content") == reasoning, f"{version}: reasoning {message}")
        check(message["content"].strip() == BEFORE and len(message["tool_calls"]) == 1, f"{version}: reply {message}")
        check(json.loads(message["tool_calls"][0]["function"]["arguments"]) == ARGUMENTS, f"{version}: call {message}")
        check(whole["choices"][0]["finish_reason"] == "tool_calls", f"{version}: finish {whole['choices'][0]}")
        chunks, done = s.stream("/v1/chat/completions", body)
        streamed_reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
        arguments = "".join(tc["function"].get("arguments") or "" for c in chunks if c["choices"]
                            for tc in c["choices"][0]["delta"].get("tool_calls") or [])
        check(done and streamed_reasoning == reasoning and json.loads(arguments) == ARGUMENTS,
              f"{version}: streamed reasoning {streamed_reasoning!r}, arguments {arguments!r}")
    print(f"{version} on {os.path.basename(model)}: reasoning, content and the XML call parsed, whole and streamed")


def main():
    check_auto_call("qwen3", QWEN3_CALL, ())
    check_auto_call("qwen3_coder", CODER_CALL, ("--chat-template", CODER_TEMPLATE))
    check_text_stays_text("unknown function", ('<tool_call>\n{"name": "launch", "arguments": {"when": "now"}}\n</tool_call>',), {})
    # tool_choice none: the parser does not run (as in vLLM), so tool-call markup is text, even
    # spelled without the <tool_call> token that the mask bans.
    spelled = ("<", "tool", "_call", ">", '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</", "tool", "_call", ">")
    special, scripted = check_text_stays_text("tool_choice none", spelled, {"tool_choice": "none"})
    check(len(special) == 1 and special[0] not in scripted, f"the markup is spelled without the special token {special}")
    # On the hybrid model itself (its forward runs; the script picks the tokens) and on Qwen3.
    check_qwen35_reply("qwen3.6", QWEN36_TEMPLATE, os.path.join(SHARED, "models", "tiny-qwen35"))
    check_qwen35_reply("qwen3.8", QWEN38_TEMPLATE, TINY)
    print("ok")


if __name__ == "__main__":
    main()
