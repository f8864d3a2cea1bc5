"""scripts/chat.py through stdin against the real server: three turns, history resent (the
session cache reports reuse from turn 2 on), a clean exit on `quit`."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SOURCE, TINY, Server, check  # noqa: E402


def main():
    with Server(TINY) as s:
        script = os.path.join(SOURCE, "scripts", "chat.py")
        run = subprocess.run([sys.executable, script, "--base-url", s.base + "/v1", "--max-tokens", "5",
                              "--temperature", "0", "--system", "Be brief."],
                             input="Hello!\nWhat is the sea?\nAnd the sky?\nquit\nnot sent\n",
                             capture_output=True, text=True, timeout=120)
        check(run.returncode == 0, f"chat.py exit {run.returncode}: {run.stderr}")
        stats = re.findall(r"\[(\d+) tokens, [\d.]+ tokens/s, first token \d+ ms, prompt (\d+) tokens, (\d+) cached\]", run.stdout)
        check(len(stats) == 3, f"three turns answered: {run.stdout!r}")
        prompts = [int(p) for _, p, _ in stats]
        cached = [int(c) for _, _, c in stats]
        check(all(int(g) == 5 for g, _, _ in stats), f"5 tokens each: {stats}")
        check(prompts[0] < prompts[1] < prompts[2], f"history grows: {prompts}")
        check(cached[1] >= prompts[0] and cached[2] >= prompts[1], f"session cache reuse: {stats}")
        status, _ = s.get("/health")
        check(status == 200, "server still healthy")
    print("ok")


if __name__ == "__main__":
    main()
