#!/usr/bin/env python3
"""Load test and soak for `ellm serve` (or any OpenAI-compatible server), standard library only.

    python3 scripts/load_test.py --base-url http://127.0.0.1:8000 --server-pid PID \\
        --requests 1000 --concurrency 24 --duration 600 --disconnect-rate 0.1

Many concurrent clients (more than the server has slots) send mixed chat and completion
requests, streamed and whole, with prompts of mixed lengths; some hang up mid-stream. The run
is bounded by --requests and --duration and talks to 127.0.0.1 only. It checks that:
  - every accepted request gets a complete response (a final chunk with finish_reason, then
    `data: [DONE]`, or a whole JSON body) or a clean JSON error; rejections are 429 with a body;
  - /health answers throughout (polled every 100 ms);
  - /metrics shows 0 running and 0 waiting requests within a few seconds after the run;
  - with --server-pid: the process stays alive, and its anonymous resident memory after all
    requests is within --max-rss-growth-mb of what it was after the warm-up. Not counted, but
    shown: the KV cache (it commits pages as positions are first written) and file-backed pages
    (the mapped weights: each new token id touches its embedding row).
Prints a summary and exits 1 on any violation (2 when the server cannot be reached at all).
"""
import argparse
import http.client
import json
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse

WORDS = ("the of and to in is was for on that with as by at from his her they this which are "
         "river mountain cloud garden window letter engine summer winter music paper silver "
         "quickly slowly quietly bright dark ancient modern small large golden broken open "
         "walk write build remember forget carry follow listen answer travel wonder explain "
         "city forest ocean station library market bridge island harbor valley castle tower").split()


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# ---- the server process ----

def resident_bytes(pid):
    """{'VmRSS': .., 'RssAnon': .., 'RssFile': ..} in bytes, from /proc/PID/status."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def process_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


# ---- HTTP ----

class Target:
    def __init__(self, base_url, api_key, timeout):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("load_test: --base-url must be http:// on 127.0.0.1 (loopback only)")
        self.host, self.port = url.hostname, url.port or 80
        self.api_key, self.timeout = api_key, timeout

    def connect(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def headers(self):
        h = {"Content-Type": "application/json", "Connection": "close"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def get(self, path, timeout=None):
        """Returns (status, body text)."""
        conn = self.connect(timeout)
        try:
            conn.request("GET", path, headers=self.headers())
            r = conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            conn.close()


def metrics(target):
    """Scalar samples of /metrics by name (labels dropped)."""
    status, text = target.get("/metrics", timeout=5)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    values = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) not in values:
            values[m.group(1)] = float(m.group(3))
        tier = re.search(r'tier="(\w+)"', m.group(2) or "") if m else None
        if tier:  # per-tier samples also as name:tier
            values[m.group(1) + ":" + tier.group(1)] = float(m.group(3))
    return values


# ---- one request ----

class Plan:
    """What one request does, drawn from its own seeded generator so a run is reproducible."""

    def __init__(self, index, args, preamble):
        rng = random.Random(f"{args.seed}-{index}")
        self.rng = rng
        self.chat = rng.random() < 0.5
        self.stream = rng.random() < 0.75
        words = [rng.choice(WORDS) for _ in range(rng.randint(args.min_prompt_words, args.max_prompt_words))]
        if rng.random() < 0.3:  # a shared opening, so the session cache gets hits under load
            words = preamble + words[len(preamble):]
        text = " ".join(words)
        self.max_tokens = rng.randint(1, args.max_tokens)
        self.body = {"model": args.model, "max_tokens": self.max_tokens, "temperature": rng.choice([0, 0.7, 1.0])}
        if self.chat:
            self.body["messages"] = [{"role": "user", "content": text}]
        else:
            self.body["prompt"] = text
        if self.stream:
            self.body["stream"] = True
            if rng.random() < 0.5:
                self.body["stream_options"] = {"include_usage": True}
        self.disconnect = rng.random() < args.disconnect_rate
        self.disconnect_after = rng.randint(1, 3)  # data chunks read before hanging up
        self.reset = rng.random() < 0.5  # hang up with RST (SO_LINGER 0) instead of FIN

    @property
    def path(self):
        return "/v1/chat/completions" if self.chat else "/v1/completions"


class Outcome:
    # kind: ok | disconnect | rejected (429) | error (clean JSON error) | violation
    def __init__(self, kind, plan, status=0, seconds=0.0, first_chunk=None, detail=""):
        self.kind, self.plan, self.status = kind, plan, status
        self.seconds, self.first_chunk, self.detail = seconds, first_chunk, detail


def is_error_body(data):
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and isinstance(data["error"].get("message"), str)


def check_whole(plan, data):
    """'' when `data` is a complete non-streamed response, else what is wrong."""
    want = "chat.completion" if plan.chat else "text_completion"
    if not isinstance(data, dict) or data.get("object") != want:
        return f"object is not {want}"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    if choices[0].get("finish_reason") not in ("stop", "length", "tool_calls"):
        return f"finish_reason {choices[0].get('finish_reason')!r}"
    usage = data.get("usage") or {}
    if not isinstance(usage.get("completion_tokens"), int) or usage["completion_tokens"] > plan.max_tokens:
        return f"usage.completion_tokens {usage.get('completion_tokens')!r} with max_tokens {plan.max_tokens}"
    return ""


def hang_up(sock, response, reset):
    """Closes the connection as a vanished client would: RST (SO_LINGER 0) or FIN."""
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        sock.shutdown(socket.SHUT_RDWR)
    if response is not None:
        response.close()  # drops the response's reference, so close() below really closes
    sock.close()


def read_stream(plan, response, sock, start):
    """Reads SSE until [DONE] and end of stream; returns an Outcome."""
    want = "chat.completion.chunk" if plan.chat else "text_completion"
    chunks, finished, done, first = 0, False, False, None
    while True:
        raw = response.readline()
        if not raw:
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line or line.startswith(":"):
            continue  # event separator or keep-alive comment
        if not line.startswith("data: "):
            return Outcome("violation", plan, 200, detail=f"non-SSE line {line[:80]!r}")
        if done:
            return Outcome("violation", plan, 200, detail="data after [DONE]")
        if line == "data: [DONE]":
            done = True
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            return Outcome("violation", plan, 200, detail=f"chunk is not JSON: {line[:80]!r}")
        if first is None:
            first = time.monotonic() - start
        if is_error_body(chunk):
            return Outcome("error", plan, 200, detail="in-stream error: " + chunk["error"]["message"][:120])
        if chunk.get("object") != want:
            return Outcome("violation", plan, 200, detail=f"chunk object {chunk.get('object')!r}")
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                finished = True
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens", 0) > plan.max_tokens:
            return Outcome("violation", plan, 200, detail=f"{usage['completion_tokens']} tokens > max_tokens {plan.max_tokens}")
        chunks += 1
        if plan.disconnect and chunks >= plan.disconnect_after and not finished:
            hang_up(sock, response, plan.reset)
            return Outcome("disconnect", plan, 200, time.monotonic() - start, first)
    if not done:
        return Outcome("violation", plan, 200, detail=f"stream ended without [DONE] after {chunks} chunks")
    if not finished:
        return Outcome("violation", plan, 200, detail="[DONE] without a finish_reason")
    return Outcome("ok", plan, 200, time.monotonic() - start, first)


def run_request(target, plan):
    start = time.monotonic()
    conn = target.connect()
    response = None
    try:
        conn.request("POST", plan.path, body=json.dumps(plan.body).encode(), headers=target.headers())
        sock = conn.sock  # kept: http.client lets go of it once a `Connection: close` response arrives
        if plan.disconnect and not plan.stream:
            time.sleep(plan.rng.uniform(0, 0.2))  # a client that gives up before the answer
            hang_up(sock, None, plan.reset)
            return Outcome("disconnect", plan, 0, time.monotonic() - start)
        response = conn.getresponse()
        ctype = response.getheader("Content-Type", "")
        if response.status == 200 and plan.stream:
            if not ctype.startswith("text/event-stream"):
                return Outcome("violation", plan, 200, detail=f"stream Content-Type {ctype!r}")
            return read_stream(plan, response, sock, start)
        text = response.read().decode("utf-8", "replace")
        seconds = time.monotonic() - start
        try:
            data = json.loads(text)
        except ValueError:
            return Outcome("violation", plan, response.status, detail=f"body is not JSON: {text[:80]!r}")
        if response.status == 200:
            problem = check_whole(plan, data)
            if problem:
                return Outcome("violation", plan, 200, detail=problem)
            return Outcome("ok", plan, 200, seconds, seconds)
        if not is_error_body(data):
            return Outcome("violation", plan, response.status, detail=f"error without an error body: {text[:80]!r}")
        kind = "rejected" if response.status == 429 else "error"
        return Outcome(kind, plan, response.status, seconds, detail=data["error"]["message"][:120])
    except (OSError, http.client.HTTPException) as e:
        return Outcome("violation", plan, 0, detail=f"{type(e).__name__}: {e}")
    finally:
        if response is not None:
            response.close()
        conn.close()


# ---- the run ----

class HealthPoller(threading.Thread):
    """GET /health every 100 ms on a fresh connection; records latency and failures."""

    def __init__(self, target, pid, timeout):
        super().__init__(daemon=True)
        self.target, self.pid, self.timeout = target, pid, timeout
        self.latencies, self.failures = [], []
        self.stop, self.server_gone = threading.Event(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                status, _ = self.target.get("/health", timeout=self.timeout)
                if status != 200:
                    self.failures.append(f"/health answered {status}")
            except (OSError, http.client.HTTPException) as e:
                self.failures.append(f"/health: {type(e).__name__}: {e}")
            self.latencies.append(time.monotonic() - start)
            if self.pid and not process_alive(self.pid):
                self.server_gone.set()
                return
            self.stop.wait(max(0.0, 0.1 - (time.monotonic() - start)))


def run_phase(target, args, indices, deadline, preamble, outcomes, server_gone):
    """Sends the requests `indices` from --concurrency threads until done, past the deadline or
    the server process is gone."""
    pending = list(reversed(indices))
    lock = threading.Lock()

    def worker():
        while time.monotonic() < deadline and not server_gone.is_set():
            with lock:
                if not pending:
                    return
                index = pending.pop()
            plan = Plan(index, args, preamble)
            outcome = run_request(target, plan)
            with lock:
                outcomes.append(outcome)
            if outcome.kind == "rejected":
                time.sleep(plan.rng.uniform(0.1, 0.6))  # back off as a polite client would

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wait_idle(target, timeout):
    """Seconds until /metrics shows 0 running and 0 waiting, or None (with the last values)."""
    start = time.monotonic()
    values = {}
    while True:
        try:
            values = metrics(target)
            if values.get("ellm:num_requests_running") == 0 and values.get("ellm:num_requests_waiting") == 0:
                return time.monotonic() - start, values
        except (OSError, http.client.HTTPException, RuntimeError):
            pass
        if time.monotonic() - start > timeout:
            return None, values
        time.sleep(0.1)


def memory_point(target, pid):
    """Resident bytes of an idle server, with the KV cache's and the session store's RAM tier
    (both bounded by their budgets) from /metrics as 'KV'."""
    point = resident_bytes(pid)
    values = metrics(target)
    point["KV"] = values.get("ellm:kv_cache_resident_bytes", 0) + values.get("ellm:session_bytes:ram", 0)
    return point


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default="")
    p.add_argument("--requests", type=int, default=1000, help="total requests, warm-up included")
    p.add_argument("--warmup", type=int, default=10, help="requests before the first memory reading")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=600, help="seconds after which no new request starts")
    p.add_argument("--disconnect-rate", type=float, default=0.1, help="share of requests that hang up early")
    p.add_argument("--min-prompt-words", type=int, default=1)
    p.add_argument("--max-prompt-words", type=int, default=150)
    p.add_argument("--max-tokens", type=int, default=24, help="each request asks for 1..this many tokens")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--server-pid", type=int, default=0, help="check this process stays alive and measure its RSS")
    p.add_argument("--max-rss-growth-mb", type=float, default=8,
                   help="allowed growth of anonymous RSS after the warm-up, KV cache excluded (negative: no check)")
    p.add_argument("--max-errors", type=int, default=-1, help="fail beyond this many clean non-429 errors (-1: any number)")
    p.add_argument("--request-timeout", type=float, default=60, help="socket timeout of one request")
    p.add_argument("--health-timeout", type=float, default=2)
    p.add_argument("--idle-timeout", type=float, default=5, help="seconds the server gets to report idle after the run")
    args = p.parse_args(argv)
    if not 1 <= args.min_prompt_words <= args.max_prompt_words:
        p.error("need 1 <= --min-prompt-words <= --max-prompt-words")
    if args.requests < 1 or args.concurrency < 1 or args.max_tokens < 1 or not 0 <= args.disconnect_rate <= 1:
        p.error("--requests, --concurrency and --max-tokens must be positive, --disconnect-rate in [0, 1]")
    args.warmup = max(0, min(args.warmup, args.requests))
    return args


def main(argv):
    args = parse_args(argv)
    target = Target(args.base_url, args.api_key, args.request_timeout)
    try:
        status, text = target.get("/v1/models", timeout=10)
        models = json.loads(text)["data"]
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        print(f"load_test: cannot list models at {args.base_url}: {e}", file=sys.stderr)
        return 2
    args.model = args.model or models[0]["id"]
    max_model_len = models[0].get("max_model_len", 0)
    if max_model_len and 2 * args.max_prompt_words + args.max_tokens + 32 > max_model_len:
        print(f"load_test: note: {args.max_prompt_words} words + {args.max_tokens} tokens may not fit "
              f"max_model_len {max_model_len}; such requests count as errors")

    rng = random.Random(args.seed)
    preamble = [rng.choice(WORDS) for _ in range(min(40, args.max_prompt_words))]
    violations = []
    poller = HealthPoller(target, args.server_pid, args.health_timeout)
    poller.start()
    started = time.monotonic()
    deadline = started + args.duration
    outcomes = []

    run_phase(target, args, range(args.warmup), deadline, preamble, outcomes, poller.server_gone)
    mem_warm = None
    if args.server_pid and args.warmup and not poller.server_gone.is_set():
        if wait_idle(target, args.idle_timeout)[0] is None:
            violations.append("server not idle after the warm-up")
        mem_warm = memory_point(target, args.server_pid)
    run_phase(target, args, range(args.warmup, args.requests), deadline, preamble, outcomes, poller.server_gone)
    elapsed = time.monotonic() - started

    idle_after, idle_values = None, {}
    if not poller.server_gone.is_set():
        idle_after, idle_values = wait_idle(target, args.idle_timeout)
        if idle_after is None:
            violations.append(f"not idle {args.idle_timeout:g} s after the run: running {idle_values.get('ellm:num_requests_running')}, "
                              f"waiting {idle_values.get('ellm:num_requests_waiting')}")
    mem_end = None
    if args.server_pid and process_alive(args.server_pid):
        mem_end = memory_point(target, args.server_pid)
    poller.stop.set()
    poller.join()
    if args.server_pid and not process_alive(args.server_pid):
        violations.insert(0, f"server process {args.server_pid} died during the run")

    by_kind = {k: [o for o in outcomes if o.kind == k] for k in ("ok", "disconnect", "rejected", "error", "violation")}
    for o in by_kind["violation"]:
        violations.append(f"{'stream' if o.plan.stream else 'whole'} {o.plan.path} (status {o.status}): {o.detail}")
    if 0 <= args.max_errors < len(by_kind["error"]):
        violations += [f"error {o.status} on {o.plan.path}: {o.detail}" for o in by_kind["error"]]
    if poller.failures:
        violations.append(f"/health failed {len(poller.failures)} times, first: {poller.failures[0]}")
    if len(outcomes) < args.requests and not poller.server_gone.is_set():
        print(f"load_test: note: the --duration of {args.duration:g} s ended the run after {len(outcomes)} requests")
    growth = None
    if mem_warm is not None and mem_end is not None:
        delta = {k: mem_end[k] - mem_warm[k] for k in mem_warm}
        growth = delta["RssAnon"] - delta["KV"]
        if 0 <= args.max_rss_growth_mb * 2**20 < growth:
            violations.append(f"anonymous RSS grew {growth / 2**20:.1f} MB (KV cache and session RAM excluded) after the warm-up, "
                              f"limit {args.max_rss_growth_mb:g} MB")

    ok = by_kind["ok"]
    streams = sum(o.plan.stream for o in outcomes)
    chats = sum(o.plan.chat for o in outcomes)
    latencies = [o.seconds for o in ok]
    firsts = [o.first_chunk for o in ok if o.plan.stream and o.first_chunk is not None]
    statuses = {}
    for o in by_kind["error"]:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    mb = 2**20
    print(f"load test: {len(outcomes)} requests ({args.warmup} warm-up) at concurrency {args.concurrency} "
          f"in {elapsed:.1f} s against {args.base_url} (model {args.model})")
    print(f"  outcomes: ok {len(ok)}, errors {len(by_kind['error'])} {statuses or ''}, "
          f"rejected 429 {len(by_kind['rejected'])}, disconnects {len(by_kind['disconnect'])}, "
          f"violations {len(by_kind['violation'])}")
    print(f"  mix: chat {chats} / completions {len(outcomes) - chats}, stream {streams} / whole {len(outcomes) - streams}")
    print(f"  latency of ok requests: p50 {percentile(latencies, 50):.3f} s, p99 {percentile(latencies, 99):.3f} s; "
          f"first chunk p50 {percentile(firsts, 50):.3f} s, p99 {percentile(firsts, 99):.3f} s")
    print(f"  /health: {len(poller.latencies)} polls, {len(poller.failures)} failures, "
          f"p50 {percentile(poller.latencies, 50) * 1e3:.1f} ms, p99 {percentile(poller.latencies, 99) * 1e3:.1f} ms, "
          f"max {max(poller.latencies, default=0) * 1e3:.1f} ms")
    if idle_after is not None:
        print(f"  idle after the run: 0 running, 0 waiting after {idle_after:.2f} s")
    if growth is not None:
        print(f"  server RSS: {mem_warm['VmRSS'] / mb:.1f} MB after {args.warmup} requests, {mem_end['VmRSS'] / mb:.1f} MB "
              f"after {len(outcomes)} ({delta['VmRSS'] / mb:+.2f} MB: anonymous {delta['RssAnon'] / mb:+.2f} MB of which "
              f"KV cache and session RAM {delta['KV'] / mb:+.2f} MB, file-backed {delta['RssFile'] / mb:+.2f} MB)")
    for v in violations[:20]:
        print("  VIOLATION:", v)
    if len(violations) > 20:
        print(f"  ... and {len(violations) - 20} more violations")
    print("  result:", "FAIL" if violations else "PASS")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
