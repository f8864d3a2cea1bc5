#!/usr/bin/env python3
"""The session store under many agents: N conversations share one system prompt with tool
definitions and take round-robin turns on a server with fewer slots than conversations, each
resending its whole history as OpenAI clients do. Prints figures; asserts nothing.

For 1 conversation alone and N = 16 and 64 on 4 slots (by default), it reports:
  - reuse: prompt tokens served from the store / reusable prompt tokens (the previous turn's
    prompt, or the shared system prompt on a conversation's first turn), and prompt tokens
    computed against the ideal (only what is new in each turn);
  - a new conversation's first turn: the share of the shared system prompt it reused;
  - turn-k TTFT p50/p95 against a single conversation run alone and against the same workload
    with --no-session-cache;
  - per conversation, the bytes its stored sessions hold (KV and, for a hybrid model, snapshots
    of the recurrent state);
  - restore throughput from RAM and disk (from /metrics), against a memcpy and a sequential
    file read of the same size measured here;
  - a restart with --session-dir: the share of first turns served from disk;
  - with --restore-context N: the inter-token latency of a stream while another request's
    N-token session is restored from disk beside it.

Hybrid models (Qwen3.5+) resume only at snapshots of their state. Their templates drop earlier
turns' reasoning unless preserve_thinking is set, which changes the prefix every turn: with
--chat-template (a Qwen3.6 template) the turns run with thinking on and --preserve-thinking
true or false; without one, with thinking off.

    python3 scripts/bench_sessions.py [--model-path DIR | --preset tiny [--layers N]] [--conversations 16,64]
Standard library only; starts and stops its own servers on 127.0.0.1.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import time
import threading
import urllib.request

from bench_common import Server, make_model, stream_chunks

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WORDS = ("the of and to in is was for on are with as by at from this that be or an file path "
         "function return value error test build run fix change line code class module").split()


def tier_metric(text, name, tier):
    m = re.search(r"^" + re.escape(name) + r'\{[^}]*tier="' + tier + r'"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def turn(server, messages, max_tokens, kwargs):
    """One streamed chat turn; returns (ttft seconds, the reply as a message, usage)."""
    # logprobs: every chunk that carries a token says so, whatever text (if any) it completes.
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "stream_options": {"include_usage": True}, "chat_template_kwargs": kwargs}
    first, text, reasoning, usage, at = None, [], [], {}, 0
    for at, chunk in stream_chunks(server.base, "/v1/chat/completions", body, timeout=3600):
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices", []):
            if first is None and (c.get("logprobs") or {}).get("content"):
                first = at
            text.append(c["delta"].get("content") or "")
            reasoning.append(c["delta"].get("reasoning_content") or "")
    reply = {"role": "assistant", "content": "".join(text)}
    if "".join(reasoning):
        reply["reasoning_content"] = "".join(reasoning)  # what the template renders back
    return first if first is not None else at, reply, usage


def system_prompt(rng, tokens):
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": " ".join(rng.choice(WORDS) for _ in range(30)),
                                               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
             for i in range(8)]
    text = "You are a coding agent with these tools:\n" + json.dumps(tools) + "\n"
    return text + " ".join(rng.choice(WORDS) for _ in range(max(0, tokens - len(text) // 3)))


REPLY_TOKENS = (20, 100)  # --reply-tokens


def workload(server, n, turns, system, seed, kwargs, conversations=None, resumed=False):
    """Round-robin turns of n conversations (new ones, or those given, which go on). Returns
    per-request records; the conversations grow in place."""
    rng = random.Random(seed)
    if conversations is None:
        conversations = [[{"role": "system", "content": system}] for _ in range(n)]
    last_prompt = [0] * n
    records = []
    system_tokens = None
    for k in range(turns):
        for i, messages in enumerate(conversations):
            messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 300)))})
            ttft, reply, usage = turn(server, messages, rng.randint(*REPLY_TOKENS), kwargs)
            messages.append(reply)
            prompt, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
            if system_tokens is None:  # the first request: the system prompt's share of it
                system_tokens = prompt - 320
            reusable = last_prompt[i] if k > 0 else (system_tokens if records else 0)
            if resumed and k == 0:  # everything but the new message and the re-rendered reply
                reusable = prompt - 400
            records.append({"turn": k, "ttft": ttft, "prompt": prompt, "cached": cached, "reusable": reusable,
                            "first": k == 0 and not resumed and bool(records)})
            last_prompt[i] = prompt
    return records


def summarize(label, records):
    reusable = sum(r["reusable"] for r in records)
    served = sum(min(r["cached"], r["reusable"]) for r in records)
    computed = sum(r["prompt"] - r["cached"] for r in records)
    ideal = sum(r["prompt"] - r["reusable"] for r in records)
    later = [r["ttft"] for r in records if r["turn"] > 0]
    p50 = statistics.median(later) if later else 0
    p95 = sorted(later)[int(0.95 * (len(later) - 1))] if later else 0
    print(f"{label:<34} reuse {100 * served / max(reusable, 1):6.2f}%  computed {computed:>8} tokens "
          f"(ideal {ideal:>8}, x{computed / max(ideal, 1):.2f})  turn>1 TTFT p50 {p50 * 1e3:7.1f} ms p95 {p95 * 1e3:7.1f} ms")
    firsts = [r for r in records if r["first"]]
    if firsts:
        shared = sum(min(r["cached"], r["reusable"]) for r in firsts) / max(sum(r["reusable"] for r in firsts), 1)
        print(f"{'':<34} new conversations' first turns: {100 * shared:.1f}% of the shared system prompt reused")
    return p50


def stored_bytes(server, n):
    """Per conversation: the bytes its stored sessions hold, and the snapshots among them."""
    sessions = json.loads(urllib.request.urlopen(server.base + "/v1/sessions").read())["data"]
    text = server.metrics()
    taken = tier_metric(text, "ellm:session_snapshots_taken_total", "hot")
    state = tier_metric(text, "ellm:session_snapshot_bytes_taken_total", "hot") / taken if taken else 0
    snapshots = sum(s.get("snapshots", 0) for s in sessions)
    total = sum(s["bytes"] for s in sessions)
    return total / n, snapshots * state / n, snapshots / n


def memcpy_gbps(size):
    """memcpy between two buffers already in RAM (a slice assignment of memoryviews is one memcpy)."""
    src = bytearray(os.urandom(1 << 20)) * (size >> 20)
    dst = bytearray(len(src))
    best = 0
    for _ in range(5):
        t = time.perf_counter()
        memoryview(dst)[:] = memoryview(src)
        best = max(best, size / (time.perf_counter() - t) / 1e9)
    return best


def sequential_read_gbps(directory, size):
    path = os.path.join(directory, "read-probe")
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
        f.flush()
        os.fsync(f.fileno())
    # Session files are read right after being written, so from the page cache; so is this.
    buf = bytearray(size)
    best = 0
    for _ in range(5):
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            view, done = memoryview(buf), 0
            while done < size:
                n = f.readinto(view[done:])
                if not n:
                    break
                done += n
        best = max(best, size / (time.perf_counter() - t) / 1e9)
    os.remove(path)
    return best


def restore_itl(binary, model, context, memory, directory, flags):
    """The inter-token latency of a stream while another request's `context`-token session is
    restored from disk beside it (on the restorer thread; the stream's decode goes on)."""
    rng = random.Random(3)
    server = Server(binary, model, 2, ["--session-dir", directory, "--session-memory", memory, "--shutdown-grace", "1", *flags],
                    sequence_length=context + 4096)
    long_chat = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(int(context * 0.8)))}]
    _, reply, usage = turn(server, long_chat, 8, {"enable_thinking": False})
    long_chat.append(reply)
    times, done = [], threading.Event()

    def stream(messages, max_tokens, out):
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "logprobs": True, "chat_template_kwargs": {"enable_thinking": False}}
        for at, chunk in stream_chunks(server.base, "/v1/chat/completions", body):
            if any((c.get("logprobs") or {}).get("content") for c in chunk.get("choices", [])):
                out.append(time.monotonic())
        done.set()

    # A stream in one slot and a short request in the other push the long session to disk.
    streamer = threading.Thread(target=stream, args=([{"role": "user", "content": "count to a thousand"}], 100000, times))
    streamer.start()
    turn(server, [{"role": "user", "content": "hello"}], 4, {"enable_thinking": False})
    while len(times) < 30:
        time.sleep(0.05)
    before = server.metrics()
    long_chat.append({"role": "user", "content": "go on"})
    sent = time.monotonic()
    ttft, _, usage = turn(server, long_chat, 4, {"enable_thinking": False})
    restored_at = sent + ttft
    after = server.metrics()
    time.sleep(1)
    server.stop()
    streamer.join()
    disk = tier_metric(after, "ellm:session_hits_total", "disk") - tier_metric(before, "ellm:session_hits_total", "disk")
    seconds = tier_metric(after, "ellm:session_restore_seconds_total", "disk") - tier_metric(before, "ellm:session_restore_seconds_total", "disk")
    restored = tier_metric(after, "ellm:session_restored_bytes_total", "disk") - tier_metric(before, "ellm:session_restored_bytes_total", "disk")
    # The stream's gaps: before; those ending while the restore ran (from the request's arrival
    # to the end of the read); and the one holding the restored request's first pass, which the
    # stream's decode step shares.
    gaps = [(b - a, b) for a, b in zip(times, times[1:])]
    steady = statistics.median(g for g, at in gaps if at < sent)
    reading = [g for g, at in gaps if sent < at <= sent + seconds]
    first_pass = [g for g, at in gaps if sent + seconds < at <= restored_at + 0.05]
    print(f"restore beside a stream: {usage['prompt_tokens_details']['cached_tokens']} of {usage['prompt_tokens']} prompt tokens "
          f"from disk ({int(disk)} restore, {restored / 1e6:.0f} MB in {seconds * 1e3:.0f} ms = {restored / max(seconds, 1e-9) / 1e9:.2f} GB/s), "
          f"its TTFT {ttft * 1e3:.0f} ms; the stream's ITL p50 {steady * 1e3:.0f} ms before, "
          f"{', '.join(f'{g * 1e3:.0f}' for g in reading) or 'no token'} ms while the read ran, "
          f"{max(first_pass, default=0) * 1e3:.0f} ms for the step beside the restored request's first pass")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ellm"))
    p.add_argument("--model-path", help="model folder (default: make one with --preset)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--conversations", default="16,64")
    p.add_argument("--no-cache-conversations", default=None,
                   help="the counts (1: the single conversation) also run with --no-session-cache (default: those of --conversations)")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--session-memory", default="64M", help="RAM tier; small, so the disk tier is used too")
    p.add_argument("--chat-template", help="e.g. ../shared/text/qwen35/chat_template.jinja: thinking on, with --preserve-thinking")
    p.add_argument("--preserve-thinking", choices=("true", "false"), default="false")
    p.add_argument("--state-snapshot-interval", type=int, help="passed to the server (hybrid models)")
    p.add_argument("--restore-context", type=int, default=0, help="tokens of the session restored beside a stream (0: skip)")
    p.add_argument("--restore-memory", default="16M", help="RAM tier of that server: smaller than the session")
    p.add_argument("--reply-tokens", default="20,100", help="the range of max_tokens of the replies")
    args = p.parse_args()
    global REPLY_TOKENS
    REPLY_TOKENS = tuple(int(x) for x in args.reply_tokens.split(","))

    tmp = tempfile.mkdtemp(prefix="ellm-bench-sessions-")
    try:
        model = args.model_path
        if not model:
            model = make_model(args.binary, args.preset, os.path.join(tmp, "model"), args.layers)
        system = system_prompt(random.Random(1), args.system_tokens)
        extra = ["--chat-template", args.chat_template] if args.chat_template else []
        if args.state_snapshot_interval is not None:
            extra += ["--state-snapshot-interval", str(args.state_snapshot_interval)]
        kwargs = {"preserve_thinking": args.preserve_thinking == "true"} if args.chat_template else {"enable_thinking": False}
        print(f"model {model}, {args.slots} slots, {args.turns} turns, system prompt ~{args.system_tokens} tokens, "
              f"user 50-300 tokens, replies {REPLY_TOKENS[0]}-{REPLY_TOKENS[1]} tokens, --session-memory {args.session_memory}, "
              f"template kwargs {kwargs}")

        if args.restore_context:
            restore_itl(args.binary, model, args.restore_context, args.restore_memory, os.path.join(tmp, "restore"), extra)
            if not args.conversations:
                return

        no_cache = args.conversations if args.no_cache_conversations is None else args.no_cache_conversations
        server = Server(args.binary, model, args.slots, extra)
        single = summarize("1 conversation", workload(server, 1, args.turns, system, 7, kwargs))
        server.stop()
        if "1" in no_cache.split(","):
            server = Server(args.binary, model, args.slots, ["--no-session-cache", *extra])
            cold = summarize("1 conversation, no session cache", workload(server, 1, args.turns, system, 7, kwargs))
            server.stop()
            print(f"{'':<34} turn>1 TTFT p50 with the store / without: {single / max(cold, 1e-9):.3f}")
        for n in [int(x) for x in args.conversations.split(",") if x]:
            session_dir = os.path.join(tmp, f"sessions-{n}")
            flags = ["--session-dir", session_dir, "--session-memory", args.session_memory, "--shutdown-grace", "60", *extra]
            server = Server(args.binary, model, args.slots, flags)
            conversations = [[{"role": "system", "content": system}] for _ in range(n)]
            p50 = summarize(f"{n} conversations", workload(server, n, args.turns, system, n, kwargs, conversations))
            print(f"{'':<34} turn>1 TTFT p50 / single conversation: {p50 / max(single, 1e-9):.2f}x")
            total, snapshot_bytes, snapshots = stored_bytes(server, n)
            print(f"{'':<34} stored per conversation: {total / 1e6:.2f} MB, of which {snapshots:.1f} snapshots "
                  f"= {snapshot_bytes / 1e6:.2f} MB")
            text = server.metrics()
            for tier in ("ram", "disk"):
                restored = tier_metric(text, "ellm:session_restored_bytes_total", tier)
                seconds = tier_metric(text, "ellm:session_restore_seconds_total", tier)
                hits = tier_metric(text, "ellm:session_hits_total", tier)
                if hits:
                    # Stored sessions are long out of the caches when restored: probe at DRAM size.
                    size = max(256 << 20, int(restored / hits) >> 20 << 20)
                    limit = memcpy_gbps(size) if tier == "ram" else sequential_read_gbps(tmp, size)
                    rate = restored / max(seconds, 1e-9) / 1e9
                    print(f"{'':<34} restore from {tier}: {int(hits)} restores, {restored / 1e6:.1f} MB, {rate:.2f} GB/s "
                          f"= {100 * rate / limit:.0f}% of {'memcpy' if tier == 'ram' else 'sequential read'} {limit:.2f} GB/s")
            server.stop()

            # After a restart, the next turn of every conversation should come from disk.
            server = Server(args.binary, model, args.slots, flags)
            restart = workload(server, n, 1, system, n + 1, kwargs, conversations, resumed=True)
            text = server.metrics()
            server.stop()
            served = sum(1 for r in restart if r["cached"] >= r["prompt"] - 400)
            print(f"{'':<34} after a restart: {served}/{len(restart)} next turns served from disk "
                  f"({int(tier_metric(text, 'ellm:session_hits_total', 'disk'))} disk restores)")

            if str(n) in no_cache.split(","):
                server = Server(args.binary, model, args.slots, ["--no-session-cache", *extra])
                cold = summarize(f"{n} conversations, no session cache", workload(server, n, args.turns, system, n, kwargs))
                server.stop()
                print(f"{'':<34} turn>1 TTFT p50 with the store / without: {p50 / max(cold, 1e-9):.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
