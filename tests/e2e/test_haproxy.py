"""Scale-out end to end (issue 23): HAProxy, from a config generated from deploy/haproxy.cfg with
free loopback ports, in front of three tiny-qwen3 replicas sharing one --session-dir.
- affinity: every turn of a conversation keyed by X-Session-ID, and separately by the OpenAI
  `user` field, lands on one replica (X-Ellm-Replica), and turn k >= 2 reuses the history
  (cached_tokens);
- drain: SIGTERM to a replica during a load of 50 requests: none fails, and HAProxy marks it down
  on its /health 503 before it exits; its conversations then continue on the others with their
  history restored from the shared session store (cached_tokens);
- failover: SIGKILL to another replica during a load: no request fails (those that had not
  reached it are retried elsewhere) and its conversations continue on the last replica;
- throughput: short chats per second through HAProxy with two one-thread replicas against one
  (printed, not asserted).
HAProxy is required: CI installs it (scripts/install-deps.sh); without it this test fails."""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, SOURCE, TINY, check, free_port  # noqa: E402

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 4


class Replica:
    def __init__(self, name, session_dir, log_dir):
        self.name, self.port = name, free_port()
        self.log = open(os.path.join(log_dir, name + ".log"), "w")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--model-path", TINY, "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1",
             "--sequence-length", "1024", "--batch-size", "2", "--max-queue", "64", "--session-dir", session_dir,
             "--max-connections-per-client", "0", "--replica-id", name, "--shutdown-grace", "5"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            raise RuntimeError(f"replica {name} did not start: {line}")
        self.exited_at = None
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        self.proc.wait()
        self.exited_at = time.monotonic()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def haproxy_config(replicas, port, stats_port):
    """deploy/haproxy.cfg with this test's ports and servers, run in the foreground: the
    deploy-only lines (chroot, user, daemon, admin socket) dropped, logs to stderr, and a faster
    health check so the test stays short."""
    text = open(os.path.join(SOURCE, "deploy", "haproxy.cfg")).read()
    lines = [l for l in text.split("\n") if "# deploy-only" not in l]
    text = "\n".join(lines).replace("global\n", "global\n    log stderr format raw local0\n", 1)
    servers = "".join(f"    server {r.name} 127.0.0.1:{r.port}\n" for r in replicas)
    text, n = re.subn(r"    # BEGIN SERVERS\n.*?    # END SERVERS\n", servers, text, flags=re.S)
    check(n == 1, "deploy/haproxy.cfg has one server block")
    text, n = re.subn(r"(frontend ellm\n    bind )\S+", rf"\g<1>127.0.0.1:{port}", text)
    check(n == 1, "deploy/haproxy.cfg has the ellm frontend's bind line")
    text, n = re.subn(r"(frontend stats\n    bind )\S+", rf"\g<1>127.0.0.1:{stats_port}", text)
    check(n == 1, "deploy/haproxy.cfg has the stats frontend's bind line")
    text, n = re.subn(r"check inter \S+", "check inter 250ms", text)
    check(n == 1, "deploy/haproxy.cfg has the default-server check line")
    return text


class HAProxy:
    def __init__(self, replicas, tmp, name):
        self.port, self.stats_port = free_port(), free_port()
        self.cfg = os.path.join(tmp, name + ".cfg")
        with open(self.cfg, "w") as f:
            f.write(haproxy_config(replicas, self.port, self.stats_port))
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.cfg], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while set(self.status().values()) != {"UP"} or len(self.status()) != len(replicas):
            check(self.proc.poll() is None, "haproxy exited:\n" + open(self.log_path).read())
            check(time.monotonic() < deadline, f"haproxy servers up: {self.status()}")
            time.sleep(0.1)

    def status(self, field="status"):
        """{server name (and BACKEND): field} from the stats CSV; {} while HAProxy is not answering."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.stats_port, timeout=5)
            c.request("GET", "/stats;csv")
            rows = c.getresponse().read().decode().split("\n")
            c.close()
        except OSError:
            return {}
        header = rows[0].lstrip("# ").split(",")
        out = {}
        for row in rows[1:]:
            cols = dict(zip(header, row.split(",")))
            if cols.get("pxname") == "ellm_replicas" and cols.get("svname") is not None:
                out[cols["svname"]] = cols[field]
        if field == "status":
            out.pop("BACKEND", None)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def chat(port, messages, key=None, user=None, max_tokens=8):
    """One chat request through HAProxy: (status, body, X-Ellm-Replica)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-Session-ID"] = key
    if user:
        body["user"] = user
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        r = c.getresponse()
        text = r.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return r.status, parsed, r.getheader("X-Ellm-Replica")
    finally:
        c.close()


class Conversation:
    def __init__(self, key=None, user=None):
        self.key, self.user = key, user
        self.messages = [{"role": "system", "content": SYSTEM}]
        self.replicas, self.usages = [], []

    def turn(self, port, n):
        self.messages.append({"role": "user", "content": f"Turn {n} for {self.key or self.user}: name a prime above {n * 11}."})
        status, body, replica = chat(port, self.messages, self.key, self.user)
        check(status == 200, f"{self.key or self.user} turn {n}: {status} {body}")
        self.messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        self.replicas.append(replica)
        self.usages.append(body["usage"])
        return replica, body["usage"]


def disk_hits(replica):
    """ellm:session_hits_total{tier="disk"} of one replica, read directly; checks the replica label."""
    c = http.client.HTTPConnection("127.0.0.1", replica.port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    samples = [l for l in text.split("\n") if l and not l.startswith("#")]
    check(samples and all(f'replica="{replica.name}"' in l for l in samples), f"every sample of {replica.name} has its label")
    m = re.search(r'^ellm:session_hits_total\{[^}]*tier="disk"\} (\S+)$', text, re.M)
    check(m is not None, "disk hits in /metrics")
    return float(m.group(1))


def cached(usage):
    return usage["prompt_tokens_details"]["cached_tokens"]


def load(port, n, concurrency, results, on_progress=None, max_tokens=4):
    """n short chats without a session key (round-robin) from `concurrency` threads; appends
    (status, replica) per request to results."""
    counter = iter(range(n))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                status, body, replica = chat(port, [{"role": "user", "content": f"Quick question {i}?"}], max_tokens=max_tokens)
            except OSError as e:
                status, replica = str(e), None
            with lock:
                results.append((status, replica))
                if on_progress:
                    on_progress(len(results))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    return threads


def measure_throughput(replicas, tmp):
    rates = {}
    for name, subset in (("one", replicas[:1]), ("two", replicas[:2])):
        h = HAProxy(subset, tmp, "haproxy-" + name)
        try:
            results = []
            start = time.monotonic()
            for t in load(h.port, 40, 4, results, max_tokens=64):
                t.join()
            elapsed = time.monotonic() - start
            check(all(s == 200 for s, _ in results), f"throughput requests: {[s for s, _ in results if s != 200]}")
            rates[name] = len(results) / elapsed
        finally:
            h.stop()
    print(f"throughput: {rates['one']:.1f} req/s with 1 replica, {rates['two']:.1f} req/s with 2 "
          f"(ratio {rates['two'] / rates['one']:.2f}; one-thread replicas on a {os.cpu_count()}-core machine)")


def test_affinity(h, conversations, label):
    for n in range(3):
        for c in conversations:
            c.turn(h.port, n)
    for c in conversations:
        check(len(set(c.replicas)) == 1 and c.replicas[0], f"{label} {c.key or c.user}: one replica {c.replicas}")
        for k in range(1, 3):
            # The previous turn's prompt is reused; its reply is re-rendered by the template.
            check(cached(c.usages[k]) >= c.usages[k - 1]["prompt_tokens"] - 8, f"{label} {c.key or c.user} turn {k + 1} reuses turn {k}: {c.usages}")
    spread = sorted({c.replicas[0] for c in conversations})
    check(len(spread) >= 2, f"{label}: conversations spread over replicas: {spread}")
    print(f"affinity by {label}: {len(conversations)} conversations x 3 turns, each on one replica "
          f"(spread over {spread}); turns 2-3 cached {[cached(c.usages[2]) for c in conversations]} tokens")


def main():
    if shutil.which("haproxy") is None and not os.path.exists(HAPROXY):
        check(False, "haproxy is not installed (scripts/install-deps.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-haproxy-")
    session_dir = os.path.join(tmp, "sessions")
    os.mkdir(session_dir)
    replicas, proxies = [], []
    started = time.monotonic()
    try:
        replicas = [Replica(f"r{i}", session_dir, tmp) for i in (1, 2, 3)]
        measure_throughput(replicas, tmp)

        h = HAProxy(replicas, tmp, "haproxy")
        proxies.append(h)
        by_header = [Conversation(key=f"sess-{i}") for i in range(6)]
        by_user = [Conversation(user=f"user-{i}") for i in range(6)]
        test_affinity(h, by_header, "X-Session-ID")
        test_affinity(h, by_user, "user")

        # Drain: SIGTERM the replica holding the most X-Session-ID conversations, mid-load.
        names = [c.replicas[0] for c in by_header]
        victim = next(r for r in replicas if r.name == max(set(names), key=names.count))
        results, down_at = [], []
        sent_term = threading.Event()

        def progress(done):
            if done == 10 and not sent_term.is_set():
                sent_term.set()
                victim.proc.send_signal(signal.SIGTERM)

        def watch_status():
            while victim.exited_at is None and not down_at:
                if h.status().get(victim.name, "UP") != "UP":
                    down_at.append(time.monotonic())
                time.sleep(0.02)

        watcher = threading.Thread(target=watch_status)
        watcher.start()
        for t in load(h.port, 50, 4, results, progress):
            t.join()
        victim.proc.wait(timeout=20)
        watcher.join()
        bad = [r for r in results if r[0] != 200]
        check(len(results) == 50 and not bad, f"drain: all 50 requests answered 200: {bad}")
        check(victim.proc.returncode == 0, f"drained replica exit code {victim.proc.returncode}")
        check(down_at and down_at[0] < victim.exited_at, "HAProxy marked the draining replica down before it exited")
        log = open(h.log_path).read()
        down_line = next((l for l in log.split("\n") if f"{victim.name} is DOWN" in l), "")
        check("503" in down_line, f"HAProxy saw /health 503 from the draining replica: {down_line!r}")
        served = sorted({r[1] for r in results})
        print(f"drain: SIGTERM to {victim.name} after 10 of 50 requests: 50/50 answered 200 by {served}; "
              f"HAProxy marked it down {1000 * (victim.exited_at - down_at[0]):.0f} ms before it exited "
              f"({down_line.split(', reason: ')[-1][:60]})")

        # Its conversations continue elsewhere, from the shared session store.
        moved = [c for c in by_header if c.replicas[0] == victim.name]
        stayed = [c for c in by_header if c.replicas[0] != victim.name]
        live = [r for r in replicas if r is not victim]
        hits_before = sum(disk_hits(r) for r in live)
        for c in by_header:
            c.turn(h.port, 3)
        for c in moved:
            check(c.replicas[-1] != victim.name, f"{c.key} moved off {victim.name}: {c.replicas}")
            check(cached(c.usages[3]) >= c.usages[2]["prompt_tokens"] - 64, f"{c.key} resumed from the session store: {c.usages[3]} after {c.usages[2]}")
        for c in stayed:
            check(c.replicas[-1] == c.replicas[0], f"{c.key} stays on its replica: {c.replicas}")
        restored = sum(disk_hits(r) for r in live) - hits_before
        check(restored >= len(moved), f"the moved conversations were restored from disk: {restored} disk hits")
        print(f"SIGTERM failover: {len(moved)} conversations of {victim.name} continued on "
              f"{sorted({c.replicas[-1] for c in moved})} with {[cached(c.usages[3]) for c in moved]} cached tokens "
              f"({restored:.0f} disk restores); {len(stayed)} others stayed put")

        # Failover: SIGKILL the live replica holding the most `user` conversations, mid-load.
        retries_before = int(h.status("wretr")["BACKEND"] or 0) + int(h.status("wredis")["BACKEND"] or 0)
        for c in by_user:
            c.turn(h.port, 3)
        counts = {r.name: sum(c.replicas[-1] == r.name for c in by_user) for r in live}
        killed = max(live, key=lambda r: counts[r.name])
        survivor = next(r for r in live if r is not killed)
        results = []
        sent_kill = threading.Event()

        def kill_progress(done):
            if done == 5 and not sent_kill.is_set():
                sent_kill.set()
                killed.proc.send_signal(signal.SIGKILL)

        for t in load(h.port, 30, 4, results, kill_progress):
            t.join()
        bad = [r for r in results if r[0] != 200]
        check(len(results) == 30 and not bad, f"SIGKILL: all 30 requests answered 200: {bad}")
        check(killed.proc.wait(timeout=5) == -signal.SIGKILL, "the replica was killed")
        retried = int(h.status("wretr")["BACKEND"] or 0) + int(h.status("wredis")["BACKEND"] or 0) - retries_before
        orphans = [c for c in by_user if c.replicas[-1] == killed.name]
        for c in by_user:
            replica, usage = c.turn(h.port, 4)
            check(replica == survivor.name, f"{c.user} continues on {survivor.name}: {c.replicas}")
        print(f"SIGKILL failover: {killed.name} killed after 5 of 30 requests: 30/30 answered 200 "
              f"({retried} retries/redispatches in HAProxy); its "
              f"{len(orphans)} conversations continued on {survivor.name}")
        took = time.monotonic() - started
        check(took < 120, f"the test took {took:.0f} s")
        print(f"1 passed, 0 failed ({took:.0f} s)")
    finally:
        for p in proxies:
            p.stop()
        for r in replicas:
            r.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
