"""End-to-end, short form of the load test: the real server on the tiny model with 2 slots and a
queue of 4, driven by scripts/load_test.py with 12 concurrent clients (so many requests get 429)
and random mid-stream disconnects. The script must pass (complete responses or clean errors,
/health throughout, idle afterwards, no memory growth) and the server must then exit 0 on SIGTERM."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import BIN, SOURCE, TINY, Server, check  # noqa: E402

SCRIPT = os.path.join(SOURCE, "scripts", "load_test.py")


def sanitized(binary):
    """True for an ASan or TSan build, whose allocator (quarantine, shadow) makes RSS meaningless."""
    with open(binary, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


def main():
    # Sanitizer builds: no memory check, and room for their slowness (and one dropped SYN).
    memory_limit, health_timeout = ("-1", "10") if sanitized(BIN) else ("8", "3")
    with Server(TINY, "--max-queue", "4", sequence_length=512) as server:
        args = [sys.executable, SCRIPT, "--base-url", server.base, "--server-pid", str(server.proc.pid),
                "--requests", "200", "--concurrency", "12", "--disconnect-rate", "0.15", "--duration", "90",
                "--max-prompt-words", "120", "--max-tokens", "16", "--max-errors", "0", "--seed", "11",
                "--max-rss-growth-mb", memory_limit, "--health-timeout", health_timeout]
        run = subprocess.run(args, capture_output=True, text=True, timeout=150)
        print(run.stdout, end="")
        print(run.stderr, end="", file=sys.stderr)
        check(run.returncode == 0, f"load_test.py exited {run.returncode}")
        check("result: PASS" in run.stdout, "load_test.py did not report PASS")
        check(server.proc.poll() is None, "server died during the load test")
        code = server.stop(timeout=30)
        check(code == 0, f"server exited {code} on SIGTERM after the load test")
    print("load test e2e: ok")


if __name__ == "__main__":
    main()
