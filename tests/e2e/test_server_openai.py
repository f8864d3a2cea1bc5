"""The official `openai` npm client against the real server (tests/e2e/openai_client.mjs): the
basic routes, then a tool-call round trip with a scripted model output, so the real parsing path
runs deterministically on a random-weight model (streamed too: id and name, then the arguments in
fragments); then response_format and tool_choice "required",
enforced by constrained decoding on that random model."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import TINY, Server, check  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


def node(base, mode):
    run = subprocess.run(["node", os.path.join(HERE, "openai_client.mjs"), base, mode],
                         capture_output=True, text=True, timeout=120)
    check(run.returncode == 0 and "ok" in run.stdout, f"openai client {mode}: {run.stdout} {run.stderr}")


def main():
    check(os.path.isdir(os.path.join(HERE, "node_modules", "openai")), "run `npm install` in tests/e2e first")
    with Server(TINY) as s:
        node(s.base, "basic")
        node(s.base, "structured")
        status, ids = s.post("/tokenize", {"prompt": TOOL_CALL})
        check(status == 200, "tokenize")
        status, end = s.post("/tokenize", {"prompt": "<|im_end|>"})
        scripted = ids["tokens"] + end["tokens"]
    # 20 ms a token: the streamed call comes in several deltas however late the client reads
    # (the engine merges what a reader has not taken yet).
    with Server(TINY, "--scripted-output", ",".join(map(str, scripted)), "--scripted-token-ms", "20") as s:
        node(s.base, "tools")
    print("ok")


if __name__ == "__main__":
    main()
