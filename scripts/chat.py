#!/usr/bin/env python3
"""Streaming terminal chat with an OpenAI-compatible server (ellm serve), standard library only.

    python3 scripts/chat.py --base-url http://127.0.0.1:8000 [--model NAME] [--system TEXT]

Type a message and press Enter; `exit` or `quit` (or end of input) leaves. The history is kept
across turns and resent each time, as OpenAI clients do; after each reply a status line shows
the speed and how many prompt tokens the server's session cache reused. Works with stdin not a
terminal (one message per line), which is how the tests drive it.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def api(base_url, path, api_key, body=None):
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    data = json.dumps(body).encode() if body is not None else None
    return urllib.request.urlopen(urllib.request.Request(base_url + path, data=data, headers=headers), timeout=600)


def stream_reply(args, messages, out):
    """Streams one assistant reply to `out`; returns (content, usage, seconds, first_token_seconds)."""
    body = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        body["temperature"] = args.temperature
    start = time.monotonic()
    first = None
    content, usage, in_reasoning = [], None, False
    with api(args.base_url, "/v1/chat/completions", args.api_key, body) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", "error"))
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                reasoning = delta.get("reasoning_content") or ""
                text = delta.get("content") or ""
                if (reasoning or text) and first is None:
                    first = time.monotonic() - start
                if reasoning:
                    if not in_reasoning:
                        out.write("[thinking] ")
                        in_reasoning = True
                    out.write(reasoning)
                if text:
                    if in_reasoning:
                        out.write("\n[/thinking]\n")
                        in_reasoning = False
                    out.write(text)
                    content.append(text)
                out.flush()
    return "".join(content), usage, time.monotonic() - start, first


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server address (with or without /v1)")
    p.add_argument("--model", default=None, help="model name (default: the server's first model)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    args = p.parse_args()
    args.base_url = args.base_url.rstrip("/")
    if args.base_url.endswith("/v1"):
        args.base_url = args.base_url[:-3]

    try:
        if not args.model:
            with api(args.base_url, "/v1/models", args.api_key) as r:
                args.model = json.load(r)["data"][0]["id"]
    except (urllib.error.URLError, OSError) as e:
        print(f"error: cannot reach {args.base_url}: {e}", file=sys.stderr)
        return 1

    interactive = sys.stdin.isatty()
    messages = [{"role": "system", "content": args.system}] if args.system else []
    if interactive:
        print(f"chatting with {args.model} at {args.base_url} (exit or quit to leave)")
    while True:
        if interactive:
            print("\n> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() in ("exit", "quit"):
            break
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            content, usage, seconds, first = stream_reply(args, messages, sys.stdout)
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            print(f"\nerror: HTTP {e.code}: {detail}", file=sys.stderr)
            messages.pop()
            continue
        except (RuntimeError, urllib.error.URLError, OSError) as e:
            print(f"\nerror: {e}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": content})
        usage = usage or {}
        generated = usage.get("completion_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        decode = seconds - (first or 0)
        speed = generated / decode if decode > 0 and generated > 1 else 0.0
        print(f"\n[{generated} tokens, {speed:.1f} tokens/s, first token {1000 * (first or seconds):.0f} ms, "
              f"prompt {usage.get('prompt_tokens', 0)} tokens, {cached} cached]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
