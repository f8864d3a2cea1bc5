"""shared/golden/*/chat.json through the real server, the Qwen3 and the hybrid Qwen3.5 models:
every case renders and tokenizes to the reference prompt (usage.prompt_tokens = len(prompt_ids)),
streams the same text it answers whole, and, where its greedy path has a clear margin, comes
back token for token (as text)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, Server, check  # noqa: E402


def main():
    checked = 0
    for name in ("tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen35", "tiny-qwen35-moe", "tiny-qwen4exp",
                 "tiny-qwen3-yarn", "tiny-qwen35-yarn"):
        golden = json.load(open(os.path.join(SHARED, "golden", name, "chat.json")))
        with Server(os.path.join(SHARED, "models", name), sequence_length=2048) as s:
            for case in golden["cases"]:
                what = f"{name}/{case['name']}"
                status, r = s.post("/v1/chat/completions", dict(case["request"], session_cache=False))
                check(status == 200, f"{what}: {status} {r}")
                check(r["usage"]["prompt_tokens"] == len(case["prompt_ids"]),
                      f"{what}: prompt_tokens {r['usage']['prompt_tokens']} != {len(case['prompt_ids'])}")
                message = r["choices"][0]["message"]
                text = (message.get("content") or "")
                chunks, done = s.stream("/v1/chat/completions", dict(case["request"], session_cache=False))
                streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
                check(done and streamed == text, f"{what}: streamed {streamed!r}, whole {text!r}")
                if case["min_margin"] < golden["safe_margin"]:
                    continue
                check(text == case["completion_text"] and not message.get("tool_calls"),
                      f"{what}: {text!r} != {case['completion_text']!r}")
                check(r["usage"]["completion_tokens"] == len(case["completion_ids"]), f"{what}: completion length")
                checked += 1
    check(checked > 0, "no golden case checked")
    print(f"ok: {checked} golden cases")


if __name__ == "__main__":
    main()
