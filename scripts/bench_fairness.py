#!/usr/bin/env python3
"""Do running streams keep getting tokens while a long prompt prefills, or a screenshot encodes?

A few streams generate; then one long prompt arrives. With --max-decode-stall-ms (default 500)
the long prefill runs in parts and the streams' decode steps run between them; with 0 it runs
in one pass and every stream waits for all of it. For both settings this prints the streams'
inter-token latency while the long prompt prefilled (largest gap, p50, p99) and the long
prompt's TTFT. Prints figures; asserts nothing.

With --image WxH the long request is instead a chat message with a screenshot of that size
(a PNG made here), on a model with a vision tower (default preset qwen3.5-0.8b): the tower runs
in stages (a block's attention or MLP each) with the streams' decode steps between them, then
the image's tokens prefill as above.

    python3 scripts/bench_fairness.py [--model-path DIR | --preset qwen3-0.6b --layers 8]
                                      [--prompt-tokens 32768 | --image 1280x720] [--streams 2]
                                      [--stalls 500,0]
Standard library only; starts and stops its own servers on 127.0.0.1.
"""
import argparse
import base64
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time
import zlib

from bench_common import Server, make_model, stream_chunks

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def generate(server, seed, arrivals, stop):
    """Streams tokens until stop is set; appends each token's arrival time (monotonic)."""
    body = {"prompt": [1000 + seed * 7 + i for i in range(16)], "max_tokens": 4000, "ignore_eos": True,
            "temperature": 0, "logprobs": 1}
    start = time.monotonic()
    for at, chunk in stream_chunks(server.base, "/v1/completions", body):
        if chunk.get("choices") and chunk["choices"][0].get("logprobs"):
            arrivals.append(start + at)
        if stop.is_set():
            break


def screenshot_png(width, height):
    """A PNG of width x height: bands of colour with a fine pattern, so the patches differ."""
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            row += bytes(((x * 7 + y) % 256, (y * 3 + (x >> 4)) % 256, ((x ^ y) * 5) % 256))
        rows.append(bytes(row))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 6))
            + chunk(b"IEND", b""))


def long_request(prompt_tokens, image):
    """The request that arrives while the streams generate: (path, body)."""
    if not image:
        return "/v1/completions", {"prompt": [2000 + (i * 37) % 50000 for i in range(prompt_tokens)],
                                   "max_tokens": 1, "ignore_eos": True}
    url = "data:image/png;base64," + base64.b64encode(screenshot_png(*image)).decode()
    content = [{"type": "text", "text": "What is on this screen?"}, {"type": "image_url", "image_url": {"url": url}}]
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], "max_tokens": 1,
                                    "ignore_eos": True}


def run(binary, model, stall_ms, prompt_tokens, n_streams, image):
    server = Server(binary, model, n_streams + 1, ["--max-decode-stall-ms", str(stall_ms)],
                    sequence_length=(prompt_tokens if not image else image[0] * image[1] // 1024) + 4096)
    try:
        stop = threading.Event()
        arrivals = [[] for _ in range(n_streams)]
        threads = [threading.Thread(target=generate, args=(server, i, arrivals[i], stop)) for i in range(n_streams)]
        for t in threads:
            t.start()
        while min(len(a) for a in arrivals) < 5:
            if not all(t.is_alive() for t in threads):
                raise SystemExit("a generating stream ended early")
            time.sleep(0.05)
        path, body = long_request(prompt_tokens, image)
        sent = time.monotonic()
        ttft = None
        for at, chunk in stream_chunks(server.base, path, body):
            ttft = at  # one token: the stream ends with it (a chat stream may open with its role first)
        if ttft is None:
            raise SystemExit("the long request returned nothing")
        done = sent + ttft
        time.sleep(1)
        stop.set()
        gaps = []
        for a in arrivals:
            during = [t for t in a if sent <= t <= done + 1]
            last_before = max([t for t in a if t < sent], default=sent)
            times = [last_before] + during
            gaps += [y - x for x, y in zip(times, times[1:])]
        for t in threads:
            t.join(timeout=30)
        return ttft, gaps
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ellm"))
    p.add_argument("--model-path", help="a model folder (default: make one with --preset)")
    p.add_argument("--preset", help="default qwen3-0.6b, or qwen3.5-0.8b with --image")
    p.add_argument("--image", help="WxH: a screenshot of this size instead of a long prompt")
    p.add_argument("--layers", type=int, default=0, help="the preset's depth if 0")
    p.add_argument("--prompt-tokens", type=int, default=32768)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--stalls", default="500,0", help="--max-decode-stall-ms values to compare")
    args = p.parse_args()
    image = tuple(int(v) for v in args.image.lower().split("x")) if args.image else None
    preset = args.preset or ("qwen3.5-0.8b" if image else "qwen3-0.6b")
    tmp = tempfile.mkdtemp(prefix="ellm-bench-fairness-")
    try:
        # A chat with an image needs a template that takes one: Qwen3.5's (shared/text/qwen35).
        shared = os.environ.get("ELLM_SHARED", os.path.join(ROOT, "..", "shared"))
        tokenizer = os.path.join(shared, "text", "qwen35") if image else None
        model = args.model_path or make_model(args.binary, preset, os.path.join(tmp, "model"), args.layers, tokenizer)
        what = f"a {image[0]}x{image[1]} screenshot encodes and prefills" if image else \
            f"a {args.prompt_tokens}-token prompt prefills"
        print(f"model {model}; {args.streams} streams generating while {what}")
        print(f"{'stall limit':>12} | {'long prompt TTFT':>16} | {'streams ITL during it: max':>27} {'p50':>8} {'p99':>8} {'tokens':>7}")
        for stall in [int(x) for x in args.stalls.split(",")]:
            ttft, gaps = run(args.binary, model, stall, args.prompt_tokens, args.streams, image)
            gaps.sort()
            p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else 0
            label = f"{stall} ms" if stall else "off"
            print(f"{label:>12} | {ttft:>14.2f} s | {max(gaps, default=0) * 1e3:>24.0f} ms {statistics.median(gaps) * 1e3 if gaps else 0:>5.0f} ms"
                  f" {p99 * 1e3:>5.0f} ms {len(gaps):>7}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
