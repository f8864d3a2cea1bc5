#!/usr/bin/env python3
"""Time to first token of turn k in a growing conversation, with the session cache on and off.

Against a running server (ellm serve ...): each turn adds ~N new tokens of user text and resends
the whole history, as OpenAI clients do. With the cache on, a turn prefills only its new tokens,
so its TTFT stays roughly flat; with it off (request field "session_cache": false) every turn
prefills the whole history and TTFT grows with it. Standard library only.

    python3 scripts/bench_ttft.py --base-url http://127.0.0.1:8000 --turns 8 --new-tokens 500
"""
import argparse
import json
import random
import urllib.request

from bench_common import stream_chunks


def ttft(base, model, messages, use_cache, max_tokens):
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}, "session_cache": use_cache, "ignore_eos": True}
    first, text, usage, at = None, [], {}, 0
    for at, chunk in stream_chunks(base, "/v1/chat/completions", body, timeout=600):
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices", []):
            piece = c["delta"].get("content") or ""
            if piece and first is None:
                first = at
            text.append(piece)
    return first if first is not None else at, "".join(text), usage


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=500, help="approximate new user tokens per turn")
    p.add_argument("--max-tokens", type=int, default=16, help="reply length per turn")
    args = p.parse_args()
    base = args.base_url.rstrip("/").removesuffix("/v1")
    model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
    words = "the of and to in is was for on are with as by at from this that be or an".split()
    rng = random.Random(0)
    turns = [" ".join(rng.choice(words) for _ in range(args.new_tokens)) for _ in range(args.turns)]

    print(f"model {model}: {args.turns} turns of ~{args.new_tokens} new tokens, {args.max_tokens} generated per turn")
    print(f"{'turn':>4} {'prompt':>7} | {'cache on: TTFT':>15} {'cached':>7} | {'cache off: TTFT':>15} {'cached':>7}")
    history_on, history_off = [], []
    for k, text in enumerate(turns, 1):
        history_on.append({"role": "user", "content": text})
        history_off.append({"role": "user", "content": text})
        t_on, reply_on, u_on = ttft(base, model, history_on, True, args.max_tokens)
        t_off, reply_off, u_off = ttft(base, model, history_off, False, args.max_tokens)
        history_on.append({"role": "assistant", "content": reply_on})
        history_off.append({"role": "assistant", "content": reply_off})
        cached_on = (u_on.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        cached_off = (u_off.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"{k:>4} {u_on.get('prompt_tokens', 0):>7} | {1000 * t_on:>12.1f} ms {cached_on:>7} | "
              f"{1000 * t_off:>12.1f} ms {cached_off:>7}", flush=True)


if __name__ == "__main__":
    main()
