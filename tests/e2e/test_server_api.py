"""End-to-end: the real server on the tiny models, driven by curl and urllib. Covers the routes,
streaming, usage, the session cache, every bad-input case (each followed by a good request),
/metrics and a clean SIGTERM."""
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, TINY, TINY_MOE, Server, check  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6, "temperature": 0}


def curl(server, path, body=None):
    args = ["curl", "-sS", "-N", server.base + path]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout


def test_routes_with_curl(s, model_name):
    models = json.loads(curl(s, "/v1/models"))
    check(models["object"] == "list" and models["data"][0]["id"] == model_name, f"models: {models}")

    whole = json.loads(curl(s, "/v1/chat/completions", dict(CHAT, model=model_name)))
    msg = whole["choices"][0]["message"]
    check(whole["object"] == "chat.completion" and msg["role"] == "assistant", f"chat: {whole}")
    usage = whole["usage"]
    check(usage["completion_tokens"] == 6 and usage["prompt_tokens"] > 0, f"usage: {usage}")
    check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "total_tokens")
    check("cached_tokens" in usage["prompt_tokens_details"], "cached_tokens field")
    check(whole["choices"][0]["finish_reason"] == "length", "finish_reason length")

    # Streaming gives the same greedy text, role first, finish_reason last, usage, then [DONE].
    sse = curl(s, "/v1/chat/completions", dict(CHAT, stream=True, stream_options={"include_usage": True}))
    lines = [l[6:] for l in sse.split("\n") if l.startswith("data: ")]
    check(lines[-1] == "[DONE]", "stream ends with [DONE]")
    chunks = [json.loads(l) for l in lines[:-1]]
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first delta carries the role")
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check(text == msg["content"], f"stream text {text!r} != {msg['content']!r}")
    check(chunks[-2]["choices"][0]["finish_reason"] == "length", "finish chunk")
    check(chunks[-1]["usage"]["completion_tokens"] == 6, "usage chunk")

    comp = json.loads(curl(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}))
    check(comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] == 4, f"completions: {comp}")
    ids = json.loads(curl(s, "/tokenize", {"prompt": "Once upon a time"}))
    check(ids["count"] == len(ids["tokens"]) == comp["usage"]["prompt_tokens"], f"tokenize: {ids}")
    comp_ids = json.loads(curl(s, "/v1/completions", {"prompt": ids["tokens"], "max_tokens": 4, "temperature": 0}))
    check(comp_ids["choices"][0]["text"] == comp["choices"][0]["text"], "token-array prompt = text prompt")
    back = json.loads(curl(s, "/detokenize", {"tokens": ids["tokens"]}))
    check(back["prompt"] == "Once upon a time", f"detokenize: {back}")
    sse = curl(s, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "stream": True})
    chunks = [json.loads(l[6:]) for l in sse.split("\n") if l.startswith("data: {")]
    check("".join(c["choices"][0]["text"] for c in chunks) == comp["choices"][0]["text"], "completion stream text")


def test_session_cache(s):
    """Three turns resending the history: each reuses at least the previous prompt, and the
    tokens equal a cold run (session_cache: false) of the same prompt."""
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    previous_prompt = 0
    for turn in range(3):
        body = {"messages": messages, "max_tokens": 5, "temperature": 0}
        status, r = s.post("/v1/chat/completions", body)
        check(status == 200, f"turn {turn}: {r}")
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        if turn > 0:
            check(cached >= previous_prompt, f"turn {turn}: cached {cached} < previous prompt {previous_prompt}")
        status, cold = s.post("/v1/chat/completions", dict(body, session_cache=False))
        check(cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "cold run reuses nothing")
        check(cold["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"],
              f"turn {turn}: cached run differs from cold run")
        # The next turn must extend this one; the cold run above must not have evicted it.
        previous_prompt = r["usage"]["prompt_tokens"]
        messages = messages + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                               {"role": "user", "content": f"And turn {turn + 2}?"}]


def expect_error(s, status, method, path, body=None, raw=None, headers=None, param=None, contains=None):
    got, r = s.request(method, path, body, raw=raw, headers=headers)
    check(got == status, f"{path} {str(body or raw)[:80]}: status {got} != {status}: {r}")
    check(isinstance(r, dict) and "error" in r, f"error body: {r}")
    e = r["error"]
    check(all(k in e for k in ("message", "type", "param", "code")), f"error fields: {e}")
    if param:
        check(e["param"] == param, f"param {e['param']} != {param}")
    if contains:
        check(contains in e["message"], f"{contains!r} not in {e['message']!r}")
    # One bad request never harms the next good one.
    ok, r = s.post("/v1/chat/completions", dict(CHAT, max_tokens=1))
    check(ok == 200, f"good request after a bad one: {r}")


def test_bad_input(s):
    chat = "/v1/chat/completions"
    expect_error(s, 400, "POST", chat, raw=b'{"messages": [', contains="not valid JSON")
    expect_error(s, 400, "POST", chat, raw=b'{"messages": "\xff\xfe"}')  # invalid UTF-8
    expect_error(s, 400, "POST", chat, raw=b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}", contains="nested")
    expect_error(s, 400, "POST", chat, {"max_tokens": 3}, param="messages")
    expect_error(s, 400, "POST", chat, dict(CHAT, messages="hi"), param="messages")
    expect_error(s, 400, "POST", chat, dict(CHAT, temperature="hot"), param="temperature")
    expect_error(s, 400, "POST", chat, dict(CHAT, temperature=-1), param="temperature")
    expect_error(s, 400, "POST", chat, raw=b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}')
    expect_error(s, 400, "POST", chat, dict(CHAT, max_tokens=0), param="max_tokens")
    expect_error(s, 400, "POST", chat, dict(CHAT, max_tokens=-5), param="max_tokens")
    expect_error(s, 400, "POST", chat, dict(CHAT, n=17), param="n")
    expect_error(s, 400, "POST", chat, dict(CHAT, n=0), param="n")
    expect_error(s, 404, "POST", chat, dict(CHAT, model="no-such-model"), param="model")
    # max_tokens beyond what the context leaves (Qwen Code resends a cut reply with 64000): the
    # completion is shortened to fit and ends with "length" when the context fills.
    for stream in (False, True):
        body = {"prompt": [1] * 500, "max_tokens": 64000, "ignore_eos": True, "temperature": 0}
        if stream:
            events, done = s.stream("/v1/completions", dict(body, stream_options={"include_usage": True}))
            finish = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
            usage = [c["usage"] for c in events if c.get("usage")][-1]
            check(done and [f for f in finish if f] == ["length"], f"streamed clamp ends with length: {finish[-3:]}")
        else:
            ok, r = s.post("/v1/completions", body)
            check(ok == 200 and r["choices"][0]["finish_reason"] == "length", f"max_tokens clamped: {ok} {r}")
            usage = r["usage"]
        check(usage["prompt_tokens"] == 500 and usage["completion_tokens"] == 12, f"the context filled: {usage}")
    expect_error(s, 400, "POST", "/v1/completions", {"prompt": [1] * 512}, contains="512")  # exactly the limit
    ok, r = s.post("/v1/completions", {"prompt": [1] * 511, "temperature": 0})  # one below: 1 token
    check(ok == 200 and r["usage"]["completion_tokens"] == 1, f"prompt one below the limit: {r}")
    expect_error(s, 400, "POST", "/v1/completions", {"prompt": [999999999]})
    expect_error(s, 413, "POST", chat, raw=b'{"x": "' + b"a" * (2 << 20) + b'"}')
    expect_error(s, 404, "GET", "/v1/nothing")
    # Unknown fields are ignored; an escaped NUL is just a character.
    ok, r = s.post(chat, dict(CHAT, messages=[{"role": "user", "content": "a\u0000b"}], whatever={"x": 1}))
    check(ok == 200, f"unknown fields / NUL: {r}")


def test_metrics(s):
    status, text = s.get("/metrics")
    check(status == 200, "metrics status")
    for name in ["ellm:num_requests_running", "ellm:num_requests_waiting", "ellm:prompt_tokens_total",
                 "ellm:generation_tokens_total", "ellm:session_cache_hit_tokens_total",
                 "ellm:time_to_first_token_seconds_bucket", "ellm:inter_token_latency_seconds_count",
                 "ellm:e2e_request_latency_seconds_sum", "ellm:kv_cache_resident_bytes",
                 'ellm:http_responses_total{route="/v1/chat/completions",status="200"']:
        check(name in text, f"{name} missing from /metrics")
    values = {l.split("{")[0]: float(l.rsplit(" ", 1)[1]) for l in text.split("\n") if l.startswith("ellm:") and "_bucket" not in l}
    check(values["ellm:generation_tokens_total"] > 0, "generation tokens counted")
    check(values["ellm:session_cache_hit_tokens_total"] > 0, "cache hits counted")
    check(values["ellm:num_requests_running"] == 0, "idle server runs nothing")


def test_strict_max_tokens(model):
    """--strict-max-tokens: max_tokens beyond the context is a 400 naming it, as vLLM and OpenAI do."""
    with Server(model, "--strict-max-tokens") as s:
        expect_error(s, 400, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=600), param="max_tokens",
                     contains="512")
        ok, r = s.post("/v1/completions", {"prompt": [1] * 500, "max_tokens": 12, "ignore_eos": True})
        check(ok == 200 and r["usage"]["completion_tokens"] == 12, f"a request that fits: {r}")


def test_auth(model):
    with Server(model, api_key="sekrit") as s:
        expect_status = s.request("POST", "/v1/chat/completions", CHAT, headers={"Authorization": "Bearer wrong"})
        check(expect_status[0] == 401 and "error" in expect_status[1], f"wrong key: {expect_status}")
        status, _ = s.request("GET", "/v1/models", headers={"Authorization": ""})
        check(status == 401, "missing key")
        status, r = s.post("/v1/chat/completions", dict(CHAT, max_tokens=1))
        check(status == 200, f"right key: {r}")
        check(s.get("/health")[0] == 200, "health needs no key")


def test_queue_full_and_disconnect(model):
    """One slot, no queue: a second request while the first streams gets 429; a client that
    disconnects mid-stream frees its slot, so the next request runs."""
    with Server(model, "--batch-size", "1", "--max-queue", "0") as s:
        body = json.dumps({"messages": CHAT["messages"], "max_tokens": 400, "ignore_eos": True, "stream": True})
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        first = sock.recv(4096)
        check(b"200" in first.split(b"\r\n")[0], f"streaming request started: {first[:80]}")
        status, r = s.post("/v1/chat/completions", dict(CHAT, max_tokens=1))
        check(status == 429 and r["error"]["type"] == "rate_limit_error", f"queue full: {status} {r}")
        sock.close()  # disconnect mid-stream
        # The server notices on its next failed write, a token or two later; under a sanitizer
        # a token can take a while, so retry for up to 30 s rather than a fixed count.
        deadline = time.monotonic() + 30
        while True:
            status, r = s.post("/v1/chat/completions", dict(CHAT, max_tokens=1))
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        check(status == 200, f"slot freed after disconnect: {status} {r}")
        check(s.stop() == 0, "SIGTERM exit code")


def test_port_in_use(model):
    """A second server on the port the first listens on fails at once, naming the address; the
    first keeps every connection (no SO_REUSEPORT splitting them between the two)."""
    with Server(model) as first:
        second = subprocess.run([BIN, "serve", "--model-path", model, "--host", "127.0.0.1",
                                 "--port", str(first.port)], capture_output=True, text=True, timeout=60)
        check(second.returncode != 0, f"second server exit code {second.returncode}: {second.stdout}")
        err = second.stderr.strip().splitlines()
        check(len(err) == 1 and f"127.0.0.1:{first.port}" in err[0] and "in use" in err[0],
              f"one line naming the address: {second.stderr!r}")
        check("serving" not in second.stdout, f"the second server never says it serves: {second.stdout!r}")
        for _ in range(20):  # with two listeners the kernel would hand some of these to the second
            check(first.get("/health")[0] == 200, "the first server answers every connection")
    with socket.socket() as holder:  # a port held by another program is refused just the same
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = subprocess.run([BIN, "serve", "--model-path", model, "--host", "127.0.0.1", "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and f"127.0.0.1:{port}" in r.stderr, f"port held by another socket: {r.stderr!r}")


def main():
    test_port_in_use(TINY)
    for model in (TINY, TINY_MOE):
        name = os.path.basename(model)
        with Server(model) as s:
            test_routes_with_curl(s, name)
            test_session_cache(s)
            test_bad_input(s)
            test_metrics(s)
            code = s.stop()
            check(code == 0, f"SIGTERM exit code {code}")
    test_strict_max_tokens(TINY)
    test_auth(TINY)
    test_queue_full_and_disconnect(TINY)
    print("ok")


if __name__ == "__main__":
    main()
