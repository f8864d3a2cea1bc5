"""End-to-end: a million-token sequence length with more slots than RAM can hold at full length.

- Without --kv-memory the KV budget is what RAM leaves after the weights, the session store and
  the image cache (load line, /metrics). The server starts with 1,048,576 positions x N slots of KV
  reserved as address space only (twice this machine's RAM), stays small in RSS, and serves.
- With a budget smaller than one prompt's KV, that request gets a clear 400 naming the budget
  (never an OOM kill), and the server goes on serving the others.
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import TINY, Server  # noqa: E402

MILLION = 1048576


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def metric(s, name):
    status, text = s.get("/metrics")
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def physical_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def chat(s, text, max_tokens=3):
    return s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": text}],
                                           "max_tokens": max_tokens, "temperature": 0})


def automatic_budget():
    physical = physical_bytes()
    with Server(TINY) as probe:
        per_token = metric(probe, "ellm:kv_cache_bytes_per_token") or 0
    check(per_token > 0, "KV bytes per token reported")
    slots = max(8, int(2 * physical / (per_token * MILLION)) + 1)  # twice the RAM at full length
    started = time.time()
    # --chunk-size bounds the activation plan; the KV is what a million positions reserve.
    with Server(TINY, "--batch-size", str(slots), "--chunk-size", "1024", sequence_length=MILLION) as s:
        seconds = time.time() - started
        budget = metric(s, "ellm:kv_cache_budget_bytes") or 0
        reserved = per_token * MILLION * slots
        check(reserved > physical, f"the test needs a reserve beyond RAM: {reserved / 2**30:.1f} GiB of "
                                   f"{physical / 2**30:.1f} GiB (per token {per_token:.0f} B)")
        check(0 < budget < physical, f"the automatic KV budget is within RAM: {budget / 2**30:.2f} GiB")
        rss = rss_bytes(s.proc.pid)
        check(rss < 2**30, f"RSS stays small with {reserved / 2**30:.0f} GiB reserved: {rss / 2**20:.0f} MiB")
        status, r = chat(s, "Hello there, long context.")
        check(status == 200 and r["choices"][0]["finish_reason"] in ("stop", "length"), f"a request: {status} {r}")
        s.stop()
        log = s.proc.stderr.read()
        line = next((l for l in log.splitlines() if l.startswith("loaded ")), "")
        check("(RAM left)" in line and "KV budget" in line, f"the load line names the automatic budget: {line}")
        print(f"ok: 1M positions x {slots} slots ({reserved / 2**30:.0f} GiB of KV reserved, RAM {physical / 2**30:.0f} GiB): "
              f"started in {seconds:.1f} s, RSS {rss / 2**20:.0f} MiB, automatic KV budget {budget / 2**30:.1f} GiB")


def refused_beyond_budget():
    with Server(TINY, "--kv-memory", "1M", "--chunk-size", "1024", sequence_length=MILLION) as s:
        per_token = metric(s, "ellm:kv_cache_bytes_per_token")
        fits = int((1 << 20) / per_token)
        long_text = " ".join(f"word{i}" for i in range(2 * fits))
        status, r = chat(s, long_text)
        message = r.get("error", {}).get("message", "") if isinstance(r, dict) else str(r)
        check(status == 400 and "KV memory budget" in message, f"a prompt beyond the budget: {status} {r}")
        status, r = chat(s, "A short one.")
        check(status == 200, f"the next request is served: {status} {r}")
        check(s.proc.poll() is None, "the server is still up")
        print(f"ok: a prompt needing more than --kv-memory 1M ({fits} positions) gets a 400: {message}")


def main():
    automatic_budget()
    refused_beyond_budget()
    print("all passed")


if __name__ == "__main__":
    main()
