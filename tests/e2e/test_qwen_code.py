"""A real coding agent against ellm serve: Qwen Code (the `qwen` CLI of @qwen-code/qwen-code,
pinned in package.json), unmodified, non-interactive and in yolo mode, with its own system
prompt and tools (14.4k tokens in this version, hence a 32k sequence length). The model's output is scripted in turn: first a tool call in the
model's own format (Qwen3 JSON: read_file; Qwen3-Coder XML: list_directory), then an answer.
A recording proxy between the agent and ellm shows that the agent ran the tool and sent its
result back (the nonce of a file only the tool can read), that ellm answered 200 with the
first turn's prompt cached, and the agent exits 0 with the scripted answer."""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, SHARED, TINY, Server, check  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "@qwen-code/qwen-code"
CODER_TEMPLATE = os.path.join(SHARED, "text", "qwen3-coder", "chat_template.jinja")
KEY = "agent-key"
ANSWER = "The notes hold the nonce."
# No memory-extraction subagent after the answer (one more request of its own); no usage
# statistics sent to the vendor.
SETTINGS = {"memory": {"enableManagedAutoMemory": False}, "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False}}


def installed_cli():
    """The pinned package's cli.js, installed with npm if missing; fails with npm's reason."""
    with open(os.path.join(HERE, "package.json")) as f:
        pinned = json.load(f)["dependencies"][PACKAGE]
    installed = os.path.join(HERE, "node_modules", PACKAGE, "package.json")

    def version():
        if not os.path.exists(installed):
            return None
        with open(installed) as f:
            return json.load(f)["version"]
    if version() != pinned:
        run = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                             timeout=600)
        check(run.returncode == 0, f"npm install of {PACKAGE} {pinned} failed: {run.stderr[-2000:]}")
    check(version() == pinned, f"{PACKAGE} {pinned} is not installed in tests/e2e/node_modules (found {version()})")
    with open(installed) as f:
        needed = int(re.match(r">=\s*(\d+)", json.load(f)["engines"]["node"]).group(1))
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    check(int(node.lstrip("v").split(".")[0]) >= needed, f"{PACKAGE} {pinned} needs Node {needed} or later, not {node}")
    return os.path.join(HERE, "node_modules", PACKAGE, "cli.js")


class RecordingProxy(ThreadingHTTPServer):
    """Forwards each request to ellm and keeps (path, request body, status, response text)."""

    def __init__(self, upstream):
        super().__init__(("127.0.0.1", 0), ForwardHandler)
        self.upstream = upstream
        self.exchanges = []
        self.base = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class ForwardHandler(BaseHTTPRequestHandler):
    def forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization", "x-api-key")}
        request = urllib.request.Request(self.server.upstream + self.path, data=body or None, method=self.command,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                status, content_type, data = r.status, r.headers["Content-Type"], r.read()
        except urllib.error.HTTPError as e:
            status, content_type, data = e.code, e.headers["Content-Type"], e.read()
        self.server.exchanges.append((self.path, body, status, data.decode()))
        # A stream is handed on whole once it ended: the agent parses the same bytes, only later.
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = forward

    def log_message(self, *args):
        pass


def token_ids(text):
    run = subprocess.run([BIN, "tokenize", "--model-path", TINY], input=text, capture_output=True, text=True)
    check(run.returncode == 0, f"tokenize: {run.stderr}")
    return json.loads(run.stdout)


def streamed(text):
    """The call (id, name, arguments) built from a stream's tool-call deltas, its finish_reason
    and its usage."""
    call, finish, usage = {"id": None, "name": "", "arguments": ""}, None, None
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[len("data: "):])
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            for tc in choice["delta"].get("tool_calls") or []:
                call["id"] = tc.get("id") or call["id"]
                call["name"] += tc.get("function", {}).get("name") or ""
                call["arguments"] += tc.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return call, finish, usage


def text_of(content):
    """A message's content as text, whether a string or a list of text parts."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return content or ""


def qwen3_call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def coder_call(name, arguments):
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def read_notes(work, nonce):
    """read_file of a file that holds the nonce."""
    path = os.path.join(work, "notes.txt")
    with open(path, "w") as f:
        f.write(nonce + "\n")
    return "read_file", {"file_path": path}


def list_work(work, nonce):
    """list_directory of a folder that holds a file named after the nonce."""
    open(os.path.join(work, nonce + ".txt"), "w").close()
    return "list_directory", {"path": work}


def run_agent(cli, tmp, fmt, template_args, call_text, plant):
    """The agent's session on a server whose model calls the tool `plant` sets up, then answers.
    The nonce reaches the follow-up only through the tool's result."""
    work, home = os.path.join(tmp, fmt, "work"), os.path.join(tmp, fmt, "home")
    os.makedirs(work)
    os.makedirs(os.path.join(home, ".qwen"))
    with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
        json.dump(SETTINGS, f)
    nonce = "nonce-" + secrets.token_hex(8)
    tool, arguments = plant(work, nonce)
    scripts = [token_ids(call_text(tool, arguments) + "<|im_end|>"), token_ids(ANSWER + "<|im_end|>")]
    script_flag = ";".join(",".join(map(str, ids)) for ids in scripts)

    with Server(TINY, *template_args, "--scripted-output", script_flag, api_key=KEY, sequence_length=32768) as server:
        proxy = RecordingProxy(server.base)
        start = time.monotonic()
        agent = subprocess.run(
            ["node", cli, "--auth-type", "openai", "--openai-base-url", proxy.base + "/v1",
             "--openai-api-key", KEY, "--model", "tiny-qwen3", "--yolo", "--output-format", "json",
             "--max-session-turns", "3",  # an agent that calls the tool again and again stops at the third
             "-p", "What do my notes say?"],
            # One process: otherwise the CLI starts itself again with a larger heap, seconds more.
            cwd=work, env=dict(os.environ, HOME=home, QWEN_CODE_NO_RELAUNCH="true"), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=300)
        seconds = time.monotonic() - start
        proxy.shutdown()
        proxy.server_close()
    what = f"{fmt}: qwen exited {agent.returncode}\nstdout: {agent.stdout[-3000:]}\nstderr: {agent.stderr[-3000:]}"

    chats = [e for e in proxy.exchanges if e[0] == "/v1/chat/completions"]
    check(len(chats) == 2, f"{what}\n{len(chats)} chat requests, not the tool call's and the answer's")
    check([status for _, _, status, _ in chats] == [200, 200], f"{what}\nstatuses {[c[2] for c in chats]}: {chats[-1][3]}")
    (_, _, _, first_reply), (_, second_body, _, second_reply) = chats
    call, finish, first_usage = streamed(first_reply)
    check(finish == "tool_calls" and call["name"] == tool and json.loads(call["arguments"]) == arguments,
          f"{fmt}: the first reply is the call to {tool}: {call}, finish_reason {finish}")

    messages = json.loads(second_body)["messages"]
    calls = [tc for m in messages if m["role"] == "assistant" for tc in m.get("tool_calls") or []]
    check(len(calls) == 1 and calls[0]["id"] == call["id"] and json.loads(calls[0]["function"]["arguments"]) == arguments,
          f"{fmt}: the follow-up carries the call back: {calls}")
    results = [m for m in messages if m["role"] == "tool"]
    check(len(results) == 1 and results[0]["tool_call_id"] == call["id"] and nonce in text_of(results[0]["content"]),
          f"{fmt}: the follow-up carries the tool's result with {nonce}: {results}")

    _, second_finish, second_usage = streamed(second_reply)
    cached = second_usage["prompt_tokens_details"]["cached_tokens"]
    check(second_finish == "stop" and cached >= 0.95 * first_usage["prompt_tokens"],
          f"{fmt}: the follow-up reuses the first prompt: {cached} cached of {first_usage['prompt_tokens']}, "
          f"finish_reason {second_finish}")

    check(agent.returncode == 0, what)
    try:
        result = json.loads(agent.stdout)[-1]
    except ValueError:
        check(False, f"{what}\nthe output is not the JSON of --output-format json")
    check(result.get("type") == "result" and result.get("result") == ANSWER, f"{what}\nthe agent's result: {result}")
    print(f"{fmt}: {tool} ran; the follow-up had {cached} tokens cached, the first prompt {first_usage['prompt_tokens']}; "
          f"the agent took {seconds:.1f} s")


def main():
    cli = installed_cli()
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-qwen-code-")
    try:
        run_agent(cli, tmp, "qwen3", (), qwen3_call, read_notes)
        run_agent(cli, tmp, "qwen3_coder", ("--chat-template", CODER_TEMPLATE), coder_call, list_work)
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
