"""End-to-end (issue 25, parts 3 and 4):
- a client that did not ask for streaming hangs up during a long generation: its request is
  cancelled and its slot freed within a second, and the next request is served at once;
- SIGTERM with a stream and a non-streaming request in flight: /health answers 503 at once, the
  listening socket closes soon after (new connections are refused), both requests end within
  --shutdown-grace (finish_reason "abort"), and the server exits 0."""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import TINY, Server, check  # noqa: E402
from test_hostile import finish_reasons, metrics, open_stream, read_stream, wait_for  # noqa: E402

PROMPT = [{"role": "user", "content": "Hello there"}]
LONG = {"messages": PROMPT, "max_tokens": 8000, "ignore_eos": True, "temperature": 1}


def send_request(port, body):
    """A non-streaming chat request on a raw socket, left unread."""
    sock = socket.socket()
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sock


def read_response(sock):
    """(status, parsed JSON body) of a non-streaming response."""
    response = http.client.HTTPResponse(sock, method="POST")
    response.begin()
    return response.status, json.loads(response.read())


def test_non_streaming_disconnect(s):
    generated = metrics(s)["ellm:generation_tokens_total"]
    sock = send_request(s.port, LONG)
    wait_for("the long request to run", lambda: metrics(s)["ellm:num_requests_running"] == 1, 30)
    wait_for("tokens to flow", lambda: metrics(s)["ellm:generation_tokens_total"] > generated + 50, 30)
    sock.close()
    closed = time.monotonic()
    wait_for("the slot to free", lambda: metrics(s)["ellm:num_requests_running"] == 0, 5)
    freed = time.monotonic() - closed
    m = metrics(s)
    check(m["ellm:generation_tokens_total"] < generated + 8000, "the request ran to its end instead of being cancelled")
    check(freed < 1.0, f"the slot was freed {freed:.2f}s after the client hung up")
    start = time.monotonic()
    status, r = s.post("/v1/chat/completions", {"messages": PROMPT, "max_tokens": 8, "ignore_eos": True})
    took = time.monotonic() - start
    check(status == 200 and r["usage"]["completion_tokens"] == 8, f"the next request: {status} {r}")
    check(took < 2.0, f"the next request took {took:.2f}s")
    print(f"non-streaming disconnect: slot freed {1000 * freed:.0f} ms after the hang-up, next request in {1000 * took:.0f} ms")


def refused(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_sigterm(grace):
    # One slot, so both requests must be in flight (one running, one queued) at SIGTERM.
    with Server(TINY, "--batch-size", "1", "--max-queue", "4", "--shutdown-grace", str(grace), sequence_length=8192) as s:
        results = {}

        def streaming():
            sock = open_stream(s.port, LONG)
            sock.settimeout(grace + 30)
            status, chunks, done, _ = read_stream(sock)
            results["stream"] = (status, finish_reasons(chunks), done, time.monotonic())

        def whole():
            sock = send_request(s.port, LONG)
            sock.settimeout(grace + 30)
            status, body = read_response(sock)
            results["whole"] = (status, body["choices"][0]["finish_reason"], True, time.monotonic())

        threads = [threading.Thread(target=streaming), threading.Thread(target=whole)]
        for t in threads:
            t.start()
        wait_for("one request running, one waiting",
                 lambda: (metrics(s)["ellm:num_requests_running"], metrics(s)["ellm:num_requests_waiting"]) == (1, 1), 30)
        sigterm = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)

        health = None
        while time.monotonic() < sigterm + 1:
            status, body = s.get("/health", timeout=2)
            if status == 503:
                health = time.monotonic() - sigterm
                check(body["error"]["type"] == "service_unavailable", f"/health while draining: {body}")
                break
            time.sleep(0.01)
        check(health is not None, "/health did not answer 503 within 1s of SIGTERM")
        try:
            status, body = s.post("/v1/chat/completions", {"messages": PROMPT, "max_tokens": 2}, timeout=5)
            check(status == 503, f"a new request while draining: {status} {body}")
        except urllib.error.URLError:
            check(refused(s.port), "a new request while draining failed, but not as refused")

        refused_after = None
        while time.monotonic() < sigterm + grace:
            if refused(s.port):
                refused_after = time.monotonic() - sigterm
                break
            time.sleep(0.05)
        check(refused_after is not None and refused_after < 2.0, f"new connections still accepted {grace}s after SIGTERM")

        for t in threads:
            t.join(grace + 30)
        check(set(results) == {"stream", "whole"}, f"results: {results}")
        for name, (status, reasons, done, ended) in results.items():
            check(status == 200 and done, f"{name}: status {status}, done {done}")
            # The running one may reach its length first; then the queued one runs and is aborted.
            check(reasons in (["abort"], "abort", ["length"], "length"), f"{name}: finish reason {reasons}")
            check(ended - sigterm < grace + 1.5, f"{name} ended {ended - sigterm:.1f}s after SIGTERM (grace {grace}s)")
        code = s.proc.wait(timeout=grace + 10)
        exited = time.monotonic() - sigterm
        check(code == 0, f"exit code {code}")
        print(f"SIGTERM: /health 503 after {1000 * health:.0f} ms, connections refused after {1000 * refused_after:.0f} ms, "
              f"requests ended by {max(r[3] for r in results.values()) - sigterm:.1f}s (grace {grace}s), exit 0 after {exited:.1f}s")


def main():
    start = time.monotonic()
    with Server(TINY, "--batch-size", "1", sequence_length=8192) as s:
        test_non_streaming_disconnect(s)
        check(s.stop() == 0, "SIGTERM exit code")
    test_sigterm(grace=3)
    print(f"drain and disconnect: {time.monotonic() - start:.1f}s")
    print("ok")


if __name__ == "__main__":
    main()
