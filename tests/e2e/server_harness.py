"""Starts the real `ellm serve` on a free 127.0.0.1 port for an end-to-end test and stops it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

BIN = os.environ.get("ELLM_BIN", "build/ellm")
SHARED = os.environ.get("ELLM_SHARED", os.path.join(os.path.dirname(__file__), "../../../shared"))
SOURCE = os.environ.get("ELLM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
TINY = os.path.join(SHARED, "models", "tiny-qwen3")
TINY_MOE = os.path.join(SHARED, "models", "tiny-qwen3-moe")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model=TINY, *extra, api_key=None, sequence_length=512):
        self.api_key = api_key
        # The free port may be taken by another test between free_port() and the server's bind
        # (ellm then refuses to start: it never shares a port), so a refused port is drawn again.
        for attempt in range(5):
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            args = [BIN, "serve", "--model-path", model, "--host", "127.0.0.1", "--port", str(self.port),
                    "--sequence-length", str(sequence_length), "--batch-size", "2", "--max-body-size", "1M", *extra]
            if api_key:
                args += ["--api-key", api_key]
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline()  # printed once the model is loaded and bound
            if "serving" in line:
                return
            self.proc.kill()
            error = line + self.proc.stderr.read()
            if "cannot listen" not in error or attempt == 4:
                raise RuntimeError("server did not start: " + error)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=20):
        """SIGTERM; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """Returns (status, parsed JSON or text)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def stream(self, path, body):
        """POSTs with stream: true; returns the list of parsed `data:` chunks (without [DONE])
        and whether [DONE] arrived."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        req = urllib.request.Request(self.base + path, data=json.dumps(dict(body, stream=True)).encode(), headers=h)
        chunks, done = [], False
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers["Content-Type"]
            for raw in r:
                line = raw.decode().rstrip("\n")
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunks.append(json.loads(line[6:]))
        return chunks, done


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)


def same_at_clear_margins(got, reference, what, margin_min):
    """got's tokens (chat logprobs entries) equal the reference's up to the first step where the
    reference's own top-1 margin is below margin_min (a near-tie either may take)."""
    for i, (g, r) in enumerate(zip(got, reference)):
        if g["token"] == r["token"]:
            continue
        top = r["top_logprobs"]
        check(top[0]["logprob"] - top[1]["logprob"] <= margin_min,
              f"{what}: token {i} differs at a clear margin: {g['token']!r} vs {r['token']!r} ({top})")
        return
    check(len(got) == len(reference), f"{what}: {len(got)} tokens against {len(reference)}")
