"""The Anthropic Messages API with the official `@anthropic-ai/sdk` client (anthropic_client.mjs,
pinned in package.json): messages.create and messages.stream (every event parses, in order, and
the deltas add up to the final message), count_tokens, forced tool calls on random weights; a
scripted reasoning + tool-call turn on the hybrid tiny-qwen35 with Qwen3.6's template, its round
trip served from the cache, stop sequences; bad input (a malformed block, an image, an unknown
tool type, a tool_result answering nothing, a 20 MB body), each a 4xx in Anthropic's error shape
while a good request runs unharmed; /metrics counting requests per API; message_start before the
first token, pings while waiting, and a client that hangs up mid-stream freeing its slot."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, SHARED, TINY, Server, check  # noqa: E402
from test_qwen_code import coder_call  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HYBRID = os.path.join(SHARED, "models", "tiny-qwen35")
QWEN36_TEMPLATE = os.path.join(SHARED, "text", "qwen35", "chat_template.jinja")
KEY = "sdk-key"


def installed():
    with open(os.path.join(HERE, "package.json")) as f:
        pinned = json.load(f)["dependencies"]["@anthropic-ai/sdk"]
    path = os.path.join(HERE, "node_modules", "@anthropic-ai", "sdk", "package.json")
    if not os.path.exists(path) or json.load(open(path))["version"] != pinned:
        run = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                             timeout=900)
        check(run.returncode == 0, f"npm install failed: {run.stderr[-2000:]}")


def node(base, mode):
    run = subprocess.run(["node", os.path.join(HERE, "anthropic_client.mjs"), base, KEY, mode],
                         capture_output=True, text=True, timeout=180)
    check(run.returncode == 0 and "ok" in run.stdout, f"anthropic client {mode}: {run.stdout} {run.stderr}")


def token_ids(model, text):
    run = subprocess.run([BIN, "tokenize", "--model-path", model], input=text, capture_output=True, text=True)
    check(run.returncode == 0, f"tokenize: {run.stderr}")
    return json.loads(run.stdout)


def huge_body(server):
    """A 20 MB body: 413 in Anthropic's shape (or the connection cut while it is still sent)."""
    body = json.dumps({"model": "m", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "a" * (20 << 20)}]}).encode()
    req = urllib.request.Request(server.base + "/v1/messages", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "x-api-key": KEY})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def timed_events(server, body):
    """(seconds since the request, event type) of each event of a stream."""
    req = urllib.request.Request(server.base + "/v1/messages", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json", "x-api-key": KEY})
    start, out = time.monotonic(), []
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                out.append((time.monotonic() - start, line[len("event: "):]))
    return out


def main():
    installed()
    with Server(TINY, api_key=KEY) as s:
        node(s.base, "basic")
        # The bad requests race a good stream (in the client) and a 20 MB body (here).
        result = {}
        thread = threading.Thread(target=lambda: result.update(huge=huge_body(s)))
        thread.start()
        node(s.base, "bad")
        thread.join()
        status, text = result["huge"]
        check(status == 413 and json.loads(text)["error"]["type"] == "request_too_large" and
              json.loads(text)["type"] == "error", f"20 MB body: {status} {text[:300]}")
        status, error = s.post("/v1/messages", None, raw=b"{not json", headers={"x-api-key": KEY})
        check(status == 400 and error["type"] == "error" and error["error"]["type"] == "invalid_request_error",
              f"invalid JSON: {status} {error}")
        # A Bearer token serves as well as x-api-key; a wrong key is a 401 in Anthropic's shape.
        status, count = s.post("/v1/messages/count_tokens", {"model": "m", "system": "Be brief.",
                                                              "messages": [{"role": "user", "content": "Hi"}]})
        check(status == 200 and count["input_tokens"] > 3, f"count_tokens with a Bearer token: {status} {count}")
        status, error = s.post("/v1/messages?beta=true", {"model": "m", "max_tokens": 5, "messages": []},
                               headers={"x-api-key": "wrong", "Authorization": "Bearer wrong"})
        check(status == 401 and error["error"]["type"] == "authentication_error", f"wrong key: {status} {error}")
        status, metrics = s.get("/metrics")
        counts = dict(re.findall(r'ellm:requests_total\{[^}]*api="(\w+)"\} (\d+)', metrics))
        check(int(counts.get("messages", 0)) >= 10 and int(counts.get("messages_count_tokens", 0)) >= 1 and
              counts.get("chat_completions") == "0", f"requests per API: {counts}")

    scripts = [token_ids(HYBRID, "I should look it up.\n</think>\n\n" + coder_call("get_weather", {"city": "Paris"}) + "<|im_end|>"),
               token_ids(HYBRID, "Checked.\n</think>\n\nSunny, 21 C. END of report<|im_end|>")]
    # 20 ms a token: the streamed input comes in several deltas however late the client reads.
    with Server(HYBRID, "--chat-template", QWEN36_TEMPLATE, "--scripted-token-ms", "20", "--scripted-output",
                ";".join(",".join(map(str, ids)) for ids in scripts), api_key=KEY, sequence_length=4096) as s:
        node(s.base, "tools")
        status, error = s.post("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "word " * 5000}]}, headers={"x-api-key": KEY})
        check(status == 400 and re.fullmatch(r"prompt is too long: \d+ tokens > 4095 maximum", error["error"]["message"]),
              f"a prompt beyond the context, in Anthropic's words: {status} {error}")

    # message_start goes out at once, and pings while the first token is awaited (1.5 s here).
    with Server(TINY, "--scripted-token-ms", "1500", "--scripted-output",
                ",".join(map(str, token_ids(TINY, "word " * 60))), api_key=KEY) as s:
        events = timed_events(s, {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]})
        kinds = [kind for _, kind in events]
        first_delta = next(t for t, kind in events if kind == "content_block_delta")
        check(kinds[0] == "message_start" and events[0][0] < 0.5 and "ping" in kinds[:kinds.index("content_block_start")]
              and first_delta > 1.4 and kinds[-2:] == ["message_delta", "message_stop"], f"stream timing: {events}")
        # A client that hangs up mid-stream frees its slot within an engine step, as in chat.
        body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Bye"}]}
        req = urllib.request.Request(s.base + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "x-api-key": KEY})
        def running_becomes(value):
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                metrics = s.get("/metrics")[1]
                if float(re.search(r"ellm:num_requests_running\{[^}]*\} (\S+)", metrics).group(1)) == value:
                    return True
                time.sleep(0.1)
            return False
        with urllib.request.urlopen(req, timeout=60) as r:
            check(r.readline().decode().startswith("event: message_start"), "message_start first")
            check(running_becomes(1), "the stream's request runs")
        check(running_becomes(0), "the request of a client that hung up still runs")
    print("ok")


if __name__ == "__main__":
    main()
