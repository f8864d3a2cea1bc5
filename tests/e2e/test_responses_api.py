"""POST /v1/responses (the OpenAI Responses API) on the hybrid tiny-qwen35 with the Qwen3.6
template, through the official `openai` npm client (tests/e2e/responses_client.mjs): create and
stream with reasoning, a function-call round trip and a custom (freeform) tool round trip with
scripted model turns, the follow-ups served from the session cache; text.format json_schema,
logprobs and a forced call on random weights. Then bad input, each a 4xx in OpenAI's error shape while a good
streamed request runs beside it unharmed; a prompt over the context (a 400, or response.failed
when streamed); a client that leaves mid-stream (its slot freed); and /metrics counting the
requests per API."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, Server, check  # noqa: E402
from test_hostile import metrics, wait_for  # noqa: E402
from test_qwen_code import coder_call, token_ids  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(SHARED, "models", "tiny-qwen35")
TEMPLATE = ("--chat-template", os.path.join(SHARED, "text", "qwen35", "chat_template.jinja"))
PATCH = "*** Begin Patch\n*** Update File: notes.txt\n@@\n-helo\n+hello\n*** End Patch"


def node(base, *args):
    run = subprocess.run(["node", os.path.join(HERE, "responses_client.mjs"), base, *args],
                         capture_output=True, text=True, timeout=180)
    check(run.returncode == 0 and "ok" in run.stdout, f"responses client {args[0]}: {run.stdout} {run.stderr}")


def events(text):
    """The (event name, data) pairs of an SSE body."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def raw_post(server, body, raw=None):
    return server.request("POST", "/v1/responses", body, raw=raw, timeout=120)


def check_error(status, body, what, param=None):
    check(400 <= status < 500 and isinstance(body, dict) and isinstance(body.get("error"), dict) and
          isinstance(body["error"].get("message"), str) and body["error"].get("type"), f"{what}: {status} {body}")
    if param:
        check(body["error"].get("param") == param, f"{what}: param {body['error'].get('param')}, not {param}")


def bad_inputs(server):
    """Each bad request is refused with a clear 4xx while a good stream runs beside it."""
    good = {}

    def stream_good():
        req = urllib.request.Request(server.base + "/v1/responses", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"input": "Count to ten.", "stream": True, "max_output_tokens": 64,
                                                      "reasoning": {"effort": "none"}}).encode())
        with urllib.request.urlopen(req, timeout=120) as r:
            good["events"] = events(r.read().decode())
    thread = threading.Thread(target=stream_good)
    thread.start()
    user = {"role": "user", "content": "hi"}
    cases = [
        ("a malformed item", {"input": [user, {"type": "message", "role": "user"}]}, "input", "content"),
        ("an item that is not an object", {"input": [user, 7]}, "input", "must be an object"),
        ("an unknown item type", {"input": [user, {"type": "teleport"}]}, "input", "teleport"),
        ("an unknown tool type", {"input": [user], "tools": [{"type": "hologram"}]}, "tools", "hologram"),
        ("a function tool without a name", {"input": [user], "tools": [{"type": "function"}]}, "tools", "name"),
        ("an output with no call", {"input": [user, {"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
         "input", "call_x"),
        ("a broken image", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
         "messages", "content[0]"),
        ("previous_response_id", {"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "stores no"),
        ("a bad role", {"input": [{"role": "wizard", "content": "hi"}]}, "input", "wizard"),
        ("a bad max_output_tokens", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
        ("a bad effort", {"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort", "effort"),
        ("no input", {"instructions": "x"}, "input", "input"),
    ]
    for what, body, param, needle in cases:
        status, reply = raw_post(server, body)
        check_error(status, reply, what, param)
        check(needle in reply["error"]["message"], f"{what}: the message names it: {reply['error']['message']}")
    status, reply = raw_post(server, None, raw=b'{"input": [')
    check_error(status, reply, "broken JSON")
    big = json.dumps({"input": "x" * (20 << 20)}).encode()
    status, reply = raw_post(server, None, raw=big)
    check(status == 413, f"a 20 MB body: {status}")
    check_error(status, reply, "a 20 MB body")
    thread.join(timeout=120)
    names = [name for name, _ in good.get("events", [])]
    check(names[:2] == ["response.created", "response.in_progress"] and names[-1] in ("response.completed", "response.incomplete"),
          f"the good stream beside the bad requests: {names}")
    final = good["events"][-1][1]["response"]
    check(final["usage"]["output_tokens"] == 64 or final["status"] == "completed", f"the good stream's end: {final}")
    return len(cases) + 2 + 1


def context_exceeded(server):
    long_input = "word " * 3000
    status, reply = raw_post(server, {"input": long_input})
    check(status == 400 and reply["error"]["code"] == "context_length_exceeded", f"over the context: {status} {reply}")
    status, reply = raw_post(server, {"input": long_input, "stream": True})
    names = [name for name, _ in events(reply)] if isinstance(reply, str) else []
    check(status == 200 and names == ["response.created", "response.in_progress", "response.failed"],
          f"over the context, streamed: {status} {names}")
    failed = events(reply)[-1][1]["response"]
    check(failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded", f"response.failed: {failed}")
    return 2


def disconnect(server):
    """A client that leaves mid-stream frees its slot within moments, as in chat completions."""
    generated = metrics(server)["ellm:generation_tokens_total"]
    body = json.dumps({"input": "Tell a story.", "stream": True, "max_output_tokens": 1500, "ignore_eos": True,
                       "reasoning": {"effort": "none"}}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sock.settimeout(30)
    received = b""
    while b"event: response.created" not in received:
        more = sock.recv(65536)
        check(more, f"the stream opens with response.created: {received!r}")
        received += more
    wait_for("tokens to flow", lambda: metrics(server)["ellm:generation_tokens_total"] > generated + 50, 30)
    sock.close()
    wait_for("the slot to free", lambda: metrics(server)["ellm:num_requests_running"] == 0, 5)
    check(metrics(server)["ellm:generation_tokens_total"] < generated + 1500, "the request was cancelled, not finished")
    return 1


def requests_total(server, api):
    status, text = server.get("/metrics")
    match = re.search(r'^ellm:requests_total\{[^}]*api="' + api + r'"[^}]*\} (\d+)$', text, re.M)
    check(status == 200 and match, f"/metrics has ellm:requests_total for {api}")
    return int(match.group(1))


def main():
    if not os.path.isdir(os.path.join(HERE, "node_modules", "openai")):
        run = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True,
                             timeout=600)
        check(run.returncode == 0, f"npm install failed: {run.stderr[-2000:]}")
    end = "<|im_end|>"
    scripts = ["Let me greet them.\n</think>\n\nHello there." + end] * 2 + [
        "The user wants the weather.\n</think>\n\n" + coder_call("get_weather", {"city": "Paris"}) + end,
        "It is sunny.\n</think>\n\nIt is sunny in Paris." + end,
        "A patch fixes it.\n</think>\n\n" + coder_call("apply_patch", {"input": PATCH}) + end,
        "Done.\n</think>\n\nPatched." + end,
    ]
    flag = ";".join(",".join(map(str, token_ids(s, MODEL))) for s in scripts)
    with Server(MODEL, *TEMPLATE, "--scripted-output", flag, sequence_length=4096) as server:
        node(server.base, "flow", PATCH)
        check(requests_total(server, "responses") == 6, "six Responses requests counted")
    with Server(MODEL, *TEMPLATE, sequence_length=2048) as server:
        node(server.base, "structured")
        counted = 4 + bad_inputs(server) + context_exceeded(server) + disconnect(server)
        check(requests_total(server, "responses") == counted, f"{counted} Responses requests counted")
        check(requests_total(server, "chat_completions") == 0, "no chat completions counted")
    print("ok")


if __name__ == "__main__":
    main()
