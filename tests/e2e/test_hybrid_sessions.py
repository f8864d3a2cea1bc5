"""Sessions of a hybrid model (tiny-qwen35: Gated DeltaNet layers whose recurrent state folds in
the whole prefix) through the real server, as an agent uses it: conversations sharing a long
system prompt with tools take turns on fewer slots than conversations, resending their whole
history, with a RAM tier so small that sessions go through --session-dir. Each turn resumes from
a snapshot of the state: >= 95% of the reusable prompt tokens come from the store, and the replies
are those of a server without the session cache wherever the reference's margin is clear. Then
a restart resumes every conversation from disk, and the Qwen3.6 template with preserve_thinking
resumes after the reply too."""
import json
import os
import re
import shutil
import tempfile

from server_harness import SHARED, Server, check, same_at_clear_margins

MODEL = os.path.join(SHARED, "models", "tiny-qwen35")
QWEN36_TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template.jinja")
MARGIN_MIN = json.load(open(os.path.join(SHARED, "golden", "tiny-qwen35", "session.json")))["margin_min"]
SYSTEM = ("You are a coding agent working in a large repository. Read files before changing them, "
          "run the tests after every change, and explain the plan first. " * 5)
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} in the workspace",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
         for name in ("read_file", "write_file", "run_tests", "search")]


def chat(server, messages, kwargs):
    status, body = server.post("/v1/chat/completions", {
        "messages": messages, "tools": TOOLS, "max_tokens": 8, "temperature": 0, "logprobs": True,
        "top_logprobs": 2, "chat_template_kwargs": kwargs})
    check(status == 200, f"chat status {status}: {body}")
    choice = body["choices"][0]
    reply = {"role": "assistant", "content": choice["message"]["content"] or ""}
    if choice["message"].get("reasoning_content"):
        reply["reasoning_content"] = choice["message"]["reasoning_content"]
    return reply, choice["logprobs"]["content"], body["usage"]


def metric(text, name, tier):
    m = re.search(r'^' + re.escape(name) + r'\{[^}]*tier="' + tier + r'"\} (\S+)$', text, re.M)
    check(m is not None, f"{name} for tier {tier} in /metrics")
    return float(m.group(1))


def run_turns(server, reference, conversations, turns, kwargs, first_turn=0):
    """Round-robin turns; returns (reusable, served, past) prompt tokens over turns after a
    conversation's first, the reusable part being the previous turn's prompt, and how many of
    those turns were served past the previous prompt (its reply included)."""
    reusable = served = past = 0
    last_prompt = [None] * len(conversations)
    for turn in range(first_turn, first_turn + turns):
        for i, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"Turn {turn} of agent {i}: fix bug {turn * 7 + i} in module {i}."})
            reply, got, usage = chat(server, messages, kwargs)
            _, expected, _ = chat(reference, messages, kwargs)
            same_at_clear_margins(got, expected, f"turn {turn} agent {i}", MARGIN_MIN)
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            if last_prompt[i] is not None:
                reusable += last_prompt[i]
                served += min(cached, last_prompt[i])
                past += cached > last_prompt[i]
            last_prompt[i] = usage["prompt_tokens"]
            messages.append(reply)
    return reusable, served, past


def main():
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-hybrid-sessions-")
    flags = ("--session-dir", os.path.join(tmp, "sessions"), "--session-memory", "300k", "--shutdown-grace", "5")
    no_thinking = {"enable_thinking": False}
    try:
        conversations = [[{"role": "system", "content": SYSTEM}] for _ in range(4)]
        with Server(MODEL, "--no-session-cache", sequence_length=4096) as reference:
            with Server(MODEL, *flags, sequence_length=4096) as server:
                reusable, served, _ = run_turns(server, reference, conversations, 4, no_thinking)
                check(served >= 0.95 * reusable, f"reuse {served}/{reusable} = {served / reusable:.3f} < 0.95")
                _, text = server.get("/metrics")
                check(metric(text, "ellm:session_snapshots_taken_total", "hot") > 0, "snapshots taken by passes")
                check(metric(text, "ellm:session_snapshots_restored_total", "disk") > 0,
                      "snapshots restored from disk:\n" + text)
                check(metric(text, "ellm:session_snapshot_bytes_taken_total", "disk") > 0, "snapshots written to disk")
                check(server.stop() == 0, "clean exit on SIGTERM")
            print(f"reuse {served}/{reusable} = {100 * served / reusable:.1f}%")

            # After a restart every conversation resumes from disk: all of its last prompt but the
            # generation prompt, which the history replaces with the reply.
            with Server(MODEL, *flags, sequence_length=4096) as server:
                for i, messages in enumerate(conversations):
                    previous = len(messages)
                    messages.append({"role": "user", "content": f"After the restart, agent {i} goes on."})
                    _, got, usage = chat(server, messages, no_thinking)
                    _, expected, _ = chat(reference, messages, no_thinking)
                    same_at_clear_margins(got, expected, f"after the restart, agent {i}", MARGIN_MIN)
                    check(usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 60,
                          f"after the restart, agent {i} ({previous} messages): {usage}")
                _, text = server.get("/metrics")
                check(metric(text, "ellm:session_hits_total", "disk") >= 4, "restored from disk after the restart")

        # Qwen3.6's template keeps the reasoning with preserve_thinking: the next turn resumes
        # after the reply, at the snapshot taken where the request ended.
        thinking = {"preserve_thinking": True}
        template = ("--chat-template", QWEN36_TEMPLATE)
        conversations = [[{"role": "system", "content": SYSTEM}] for _ in range(2)]
        with Server(MODEL, *template, "--no-session-cache", sequence_length=4096) as reference, \
                Server(MODEL, *template, sequence_length=4096) as server:
            reusable, served, past = run_turns(server, reference, conversations, 3, thinking)
            check(served >= 0.99 * reusable, f"preserve_thinking: reuse {served}/{reusable}")
            check(past == 4, f"preserve_thinking: {past} of 4 later turns resumed after the reply")
        print("1 passed, 0 failed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
