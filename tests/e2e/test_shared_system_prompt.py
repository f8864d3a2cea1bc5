"""Agents start every conversation with the same long system prompt and tools. On a hybrid model a
new conversation can resume only at a snapshot of the recurrent state, so the server snapshots
where the system messages end: the second conversation, and a new one after many turns of
others on fewer slots than conversations, each serve >= 95% of that shared prefix from the
session store, in chat completions and in the Anthropic Messages API. Checked on the tiny
hybrid models and on a cut Qwen3.5-0.8B shape (4 layers).'"""
import os
import shutil
import subprocess
import tempfile

from server_harness import BIN, SHARED, Server, check

TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template.jinja")
SYSTEM = ("You are a coding agent working in a large repository. Read files before changing them, "
          "run the tests after every change, and explain the plan first. ") * 20
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} in the workspace",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
         for name in ("read_file", "write_file", "run_tests")]


def chat(server, messages):
    status, r = server.post("/v1/chat/completions", {"messages": messages, "tools": TOOLS, "max_tokens": 4,
                                                      "temperature": 0})
    check(status == 200, f"chat: {status} {r}")
    return r


def system_tokens(server):
    """The length of the prefix all these conversations share: the tokens two first turns have
    in common (the system block with the tools, and the start of the user turn)."""
    prompts = []
    for user in ("Fix the parser.", "Where is the config read?"):
        status, r = server.post("/tokenize", {"messages": [{"role": "system", "content": SYSTEM},
                                                           {"role": "user", "content": user}], "tools": TOOLS})
        check(status == 200, f"tokenize: {status} {r}")
        prompts.append(r["tokens"])
    same = 0
    while prompts[0][same] == prompts[1][same]:
        same += 1
    check(same > 500, f"a long shared prefix ({same} tokens)")
    return same


def check_model(path, name):
    with Server(path, "--chat-template", TEMPLATE, sequence_length=4096) as s:
        shared = system_tokens(s)
        conversations = [[{"role": "system", "content": SYSTEM}] for _ in range(6)]
        first_turn_cached = []
        for turn in range(3):
            for i, messages in enumerate(conversations):
                messages.append({"role": "user", "content": f"Turn {turn} of agent {i}: fix bug {turn * 11 + i}."})
                r = chat(s, messages)
                if turn == 0:
                    first_turn_cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
                messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"] or ""})
        check(all(c >= 0.95 * shared for c in first_turn_cached[1:]),
              f"{name}: first turns after the first served {first_turn_cached} of the {shared}-token system prefix")
        r = chat(s, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "A new agent arrives."}])
        late = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(late >= 0.95 * shared, f"{name}: a new conversation after 18 turns of 6 others served {late} of {shared}")

        status, r = s.post("/v1/messages", {"model": "any", "max_tokens": 4, "system": SYSTEM,
                                            "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                                       "input_schema": t["function"]["parameters"]} for t in TOOLS],
                                            "messages": [{"role": "user", "content": "An agent over the Messages API."}]})
        check(status == 200, f"messages: {status} {r}")
        anthropic = r["usage"]["cache_read_input_tokens"]
        check(anthropic >= 0.95 * shared, f"{name}: the Messages API served {anthropic} of {shared}")
    print(f"ok: {name}: first turns {first_turn_cached}, a late newcomer {late}, Messages {anthropic} of {shared}")


def main():
    check_model(os.path.join(SHARED, "models", "tiny-qwen35"), "tiny-qwen35")
    check_model(os.path.join(SHARED, "models", "tiny-qwen4exp"), "tiny-qwen4exp")
    out = tempfile.mkdtemp(prefix="ellm-qwen35-cut-")
    try:
        made = subprocess.run([BIN, "make-model", "--preset", "qwen3.5-0.8b", "--layers", "4", "--out", out],
                              capture_output=True, text=True, env=dict(os.environ, ELLM_SHARED=SHARED))
        check(made.returncode == 0, f"make-model: {made.stderr[-2000:]}")
        check_model(out, "qwen3.5-0.8b x4 layers")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
