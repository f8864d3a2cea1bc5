"""Qwen3.8-Flash-Next (tiny-qwen4exp) served as a user runs it, with the Qwen3.8 chat template
(XML tool calls, reasoning on by default, reasoning_effort): chat and its stream agree; a tool
call in the model's own format comes back parsed, whole and streamed; reasoning is split off;
a follow-up turn resumes from the session store (>= 95% of the previous prompt) and answers as a
server without the session cache does wherever the reference's margin is clear, also after a
restart from --session-dir; prompt-lookup speculation gives the plain greedy output; /metrics
reports the n-gram table read in place."""
import json
import os
import re
import shutil
import subprocess
import tempfile

from server_harness import SHARED, Server, check, same_at_clear_margins
from test_qwen_code import token_ids

MODEL = os.path.join(SHARED, "models", "tiny-qwen4exp")
TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template_qwen38.jinja")
MARGIN_MIN = json.load(open(os.path.join(SHARED, "golden", "tiny-qwen4exp", "session.json")))["margin_min"]
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                   "required": ["path"]}}}]
SYSTEM = "You are a coding agent. Read the files before you change them and explain your plan. " * 6


def chat(server, messages, **kw):
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, **kw}
    status, r = server.post("/v1/chat/completions", body)
    check(status == 200, f"chat: {status} {r}")
    return r


def scripted_checks():
    """The model's turns scripted: an XML tool call after a thought, then a thought and an answer."""
    # The template's generation prompt opens the thought (thinking is on by default).
    call = "The notes first.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nnotes/todo.md\n" \
           "</parameter>\n<parameter=lines>\n20\n</parameter>\n</function>\n</tool_call>"
    answer = "It says ship it.\n</think>\n\nShip it today."
    scripts = [token_ids(call + "<|im_end|>", MODEL), token_ids(call + "<|im_end|>", MODEL),
               token_ids(answer + "<|im_end|>", MODEL)]
    script_flag = ";".join(",".join(map(str, ids)) for ids in scripts)
    with Server(MODEL, "--chat-template", TEMPLATE, "--scripted-output", script_flag, sequence_length=2048) as s:
        messages = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": "What is on my todo list?"}]
        r = chat(s, messages, tools=TOOLS, max_tokens=200, reasoning_effort="low")
        choice = r["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        check(choice["finish_reason"] == "tool_calls" and len(calls) == 1, f"tool call: {choice}")
        check(calls[0]["function"]["name"] == "read_file", f"name: {calls[0]}")
        check(json.loads(calls[0]["function"]["arguments"]) == {"path": "notes/todo.md", "lines": 20},
              f"arguments (typed by the schema): {calls[0]['function']['arguments']}")
        check(choice["message"].get("reasoning_content", "").strip() == "The notes first.", f"reasoning: {choice}")

        chunks, done = s.stream("/v1/chat/completions", {"messages": messages, "tools": TOOLS, "max_tokens": 200,
                                                          "temperature": 0})
        arguments = "".join(tc["function"].get("arguments", "") for c in chunks if c.get("choices")
                            for tc in c["choices"][0]["delta"].get("tool_calls") or [])
        reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c.get("choices"))
        check(done and json.loads(arguments) == {"path": "notes/todo.md", "lines": 20}, f"streamed arguments {arguments!r}")
        check(reasoning.strip() == "The notes first.", f"streamed reasoning {reasoning!r}")

        messages += [{"role": "assistant", "content": "", "tool_calls": calls},
                     {"role": "tool", "tool_call_id": calls[0]["id"], "content": "- ship it"}]
        r = chat(s, messages, tools=TOOLS, max_tokens=200)
        message = r["choices"][0]["message"]
        check(message["content"].strip() == "Ship it today." and "ship it" in message["reasoning_content"],
              f"answer: {message}")
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, f"the tool result's turn resumed: {r['usage']}")

        low, high = (chat(s, messages[:2], tools=TOOLS, reasoning_effort=e)["usage"]["prompt_tokens"] for e in ("low", "xhigh"))
        check(low != high, "reasoning_effort reaches the template")
        status, r = s.post("/v1/chat/completions", {"messages": messages, "reasoning_effort": "maximal"})
        check(status == 400 and "reasoning effort" in json.dumps(r).lower(), f"an effort the template refuses: {status} {r}")


def session_checks():
    """Three conversations on two slots, then a restart: each follow-up resumes from the store."""
    session_dir = tempfile.mkdtemp(prefix="ellm-qwen38-sessions-")
    args = ["--chat-template", TEMPLATE, "--session-dir", session_dir]
    conversations = [[{"role": "system", "content": SYSTEM}] for _ in range(3)]
    try:
        with Server(MODEL, "--chat-template", TEMPLATE, "--no-session-cache", sequence_length=2048) as reference:
            def turns(server, first, count):
                reusable = served = 0
                for turn in range(first, first + count):
                    for i, messages in enumerate(conversations):
                        messages.append({"role": "user", "content": f"Turn {turn}, agent {i}: fix bug {turn * 5 + i}."})
                        kw = {"logprobs": True, "top_logprobs": 2}
                        r = chat(server, messages, **kw)
                        expected = chat(reference, messages, **kw)
                        same_at_clear_margins(r["choices"][0]["logprobs"]["content"],
                                              expected["choices"][0]["logprobs"]["content"], f"turn {turn} agent {i}",
                                              MARGIN_MIN)
                        if len(messages) > 2:
                            reusable += previous[i]
                            served += min(r["usage"]["prompt_tokens_details"]["cached_tokens"], previous[i])
                        previous[i] = r["usage"]["prompt_tokens"]
                        m = r["choices"][0]["message"]
                        messages.append({"role": "assistant", "content": m["content"] or "",
                                         "reasoning_content": m.get("reasoning_content") or ""})
                return reusable, served

            previous = [0] * len(conversations)
            with Server(MODEL, *args, sequence_length=2048) as s:
                reusable, served = turns(s, 0, 3)
                check(served >= 0.95 * reusable, f"served {served} of {reusable} reusable prompt tokens")
                check(s.stop() == 0, "clean shutdown")
            check(any(name.endswith(".kv") for name in os.listdir(session_dir)), "sessions written to --session-dir")
            with Server(MODEL, *args, sequence_length=2048) as s:  # after a restart: from the disk tier
                reusable, served = turns(s, 3, 1)
                check(served >= 0.95 * reusable, f"after a restart: served {served} of {reusable}")
        print(f"ok: sessions ({served}/{reusable} after the restart)")
    finally:
        shutil.rmtree(session_dir, ignore_errors=True)


def speculative_and_metrics_checks():
    """Prompt lookup proposes where the output repeats the context (the random model's greedy
    output keeps coming back to a few tokens); its greedy output is the plain one."""
    prompt = [100] * 30
    with Server(MODEL, "--speculative", "ngram", "--num-speculative-tokens", "4", sequence_length=2048) as s:
        outputs = {}
        for mode in ("none", "ngram"):
            status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 150, "temperature": 0,
                                                   "ignore_eos": True, "speculative": mode, "session_cache": False})
            check(status == 200, f"{mode}: {status} {r}")
            outputs[mode] = r["choices"][0]["text"]
        check(outputs["ngram"] == outputs["none"], f"prompt lookup changed the output: {outputs}")
        status, text = s.get("/metrics")
        accepted = re.search(r'^ellm:spec_decode_num_accepted_tokens_total\{[^}]*proposer="ngram"[^}]*\} (\S+)$', text, re.M)
        proposed = re.search(r'^ellm:spec_decode_num_draft_tokens_total\{[^}]*proposer="ngram"[^}]*\} (\S+)$', text, re.M)
        # Proposals cut short roll the n-gram module's windows and the Gated DeltaNet states back.
        check(accepted is not None and proposed and float(proposed.group(1)) > 0, "tokens proposed by prompt lookup")
        table = re.search(r"^ellm:mapped_table_bytes\{[^}]*\} (\S+)$", text, re.M)
        gathered = re.search(r"^ellm:mapped_table_gathered_tokens_total\{[^}]*\} (\S+)$", text, re.M)
        faults = re.search(r"^ellm:mapped_table_page_faults_per_token\{[^}]*\} (\S+)$", text, re.M)
        check(table and float(table.group(1)) == 4096 * 16 * 2, "the table's bytes in /metrics")
        check(gathered and float(gathered.group(1)) > 0 and faults is not None, "gathered tokens and faults in /metrics")
    print(f"ok: prompt lookup gives the greedy output ({float(accepted.group(1)):.0f} of "
          f"{float(proposed.group(1)):.0f} proposed tokens accepted)")


def main():
    scripted_checks()
    print("ok: tool calls, reasoning and the Qwen3.8 template")
    session_checks()
    speculative_and_metrics_checks()


if __name__ == "__main__":
    main()
