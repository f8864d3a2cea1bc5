"""n > 1 through the real server, chat and completions, streamed and not: n choices from one
prompt, each with its own seeded sampling stream (choice i is what a single request with seed
+ i gives), its own index and finish reason; the usage counts the prompt once; the prompt is
prefilled once and copied to the other choices; n beyond the slots is queued, n beyond 16 is
refused."""
import re

from server_harness import TINY, Server, check

SYSTEM = "You are a terse assistant who answers in one line. " * 12
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]


def chat(s, **kw):
    body = dict(messages=MESSAGES, max_tokens=6, temperature=0.9, seed=5, ignore_eos=True,
                chat_template_kwargs={"enable_thinking": False})
    body.update(kw)
    status, r = s.post("/v1/chat/completions", body)
    check(status == 200, f"status {status}: {r}")
    return r


def hot_hit_tokens(s):
    _, text = s.get("/metrics")
    m = re.search(r'^ellm:session_hit_tokens_total\{[^}]*tier="hot"\} (\S+)$', text, re.M)
    return float(m.group(1))


def main():
    with Server(TINY, "--batch-size", "3") as s:
        before = hot_hit_tokens(s)
        r = chat(s, n=3)
        check([c["index"] for c in r["choices"]] == [0, 1, 2], f"indices: {r['choices']}")
        check(all(c["finish_reason"] == "length" for c in r["choices"]), "each choice has its finish reason")
        single = chat(s)
        check(r["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"], f"prompt counted once: {r['usage']}")
        check(r["usage"]["completion_tokens"] == 18, f"completions summed: {r['usage']}")
        check(r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 18, "total")
        # The prompt was computed once: the two other choices copied its rows from the first's slot.
        copied = hot_hit_tokens(s) - before
        check(copied >= 2 * (r["usage"]["prompt_tokens"] - 64), f"prompt copied to the other choices: {copied}")
        # Each choice is reproducible, and choice i is the request with seed + i.
        texts = [c["message"]["content"] for c in r["choices"]]
        again = [c["message"]["content"] for c in chat(s, n=3)["choices"]]
        check(texts == again, f"same seed, same choices: {texts} vs {again}")
        for i in range(3):
            alone = chat(s, seed=5 + i)["choices"][0]["message"]["content"]
            check(alone == texts[i], f"choice {i} equals seed {5 + i} alone: {alone!r} vs {texts[i]!r}")

        # Streamed: chunks carry their choice's index, one finish per choice, one usage at the end.
        chunks, done = s.stream("/v1/chat/completions", dict(
            messages=MESSAGES, max_tokens=6, temperature=0.9, seed=5, ignore_eos=True, n=3,
            chat_template_kwargs={"enable_thinking": False}, stream_options={"include_usage": True}))
        check(done, "[DONE] arrives")
        streamed, finishes = ["", "", ""], [0, 0, 0]
        usage_chunks = [c for c in chunks if c.get("usage")]
        for c in chunks:
            for choice in c["choices"]:
                streamed[choice["index"]] += choice["delta"].get("content") or ""
                finishes[choice["index"]] += choice["finish_reason"] is not None
        check(streamed == texts, f"streamed choices equal the whole ones: {streamed} vs {texts}")
        check(finishes == [1, 1, 1], f"one finish per choice: {finishes}")
        check(len(usage_chunks) == 1 and usage_chunks[0]["usage"]["completion_tokens"] == 18,
              f"one usage chunk for all: {usage_chunks}")

        # More choices than slots are queued; completions too.
        r = chat(s, n=7, max_tokens=3)
        check(len(r["choices"]) == 7 and r["usage"]["completion_tokens"] == 21, f"n=7 on 3 slots: {r['usage']}")
        status, r = s.post("/v1/completions", {"prompt": SYSTEM, "max_tokens": 4, "n": 2, "temperature": 0.7,
                                               "seed": 1, "ignore_eos": True})
        check(status == 200 and [c["index"] for c in r["choices"]] == [0, 1], f"completions n=2: {r}")
        check(r["usage"]["completion_tokens"] == 8, f"completions usage: {r['usage']}")
        status, r = s.post("/v1/chat/completions", dict(messages=MESSAGES, n=17))
        check(status == 400 and r["error"]["param"] == "n", f"n=17 refused: {status} {r}")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
