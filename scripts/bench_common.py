"""Pieces the benchmark scripts share: a server on a free port, streamed chunks, a random model.
Standard library only."""
import json
import signal
import socket
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ellm serve` on 127.0.0.1 and a free port, until stop()."""

    def __init__(self, binary, model, slots, extra, sequence_length=16384):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        args = [binary, "serve", "--model-path", model, "--host", "127.0.0.1", "--port", str(self.port),
                "--batch-size", str(slots), "--sequence-length", str(sequence_length), *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if "serving" not in self.proc.stdout.readline():
            raise SystemExit("the server did not start: " + " ".join(args))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)

    def metrics(self):
        return urllib.request.urlopen(self.base + "/metrics").read().decode()


def stream_chunks(base, path, body, timeout=3600):
    """POSTs a streaming request; yields (seconds since the request was sent, chunk) per SSE
    data chunk."""
    req = urllib.request.Request(base + path, data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data: {"):
                yield time.monotonic() - start, json.loads(line[6:])


def make_model(binary, preset, out, layers=None, tokenizer_from=None):
    cmd = [binary, "make-model", "--preset", preset, "--out", out]
    if layers:
        cmd += ["--layers", str(layers)]
    if tokenizer_from:
        cmd += ["--tokenizer-from", tokenizer_from]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out
