"""The session store through the real server, as users meet it: several conversations sharing
a system prompt take turns on fewer slots than conversations; every turn after the first reports
its history in cached_tokens; /metrics shows the tiers; /v1/sessions lists and drops sessions
behind the API key; SIGTERM writes the sessions to --session-dir, and after a restart the next
turn of every conversation comes from disk; a file from another model is skipped."""
import os
import re
import shutil
import tempfile
import threading

from server_harness import TINY, TINY_MOE, Server, check

KEY = "sessions-key"
SYSTEM = ("You are a coding agent. Tools: read_file(path), write_file(path, text), run(cmd), "
          "search(query). Always explain the plan first, then act. " * 6)


def chat(server, messages, max_tokens=8):
    status, body = server.post("/v1/chat/completions", {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}})
    check(status == 200, f"chat status {status}: {body}")
    return body["choices"][0]["message"]["content"], body["usage"]


def metric(text, name, tier):
    m = re.search(r'^' + re.escape(name) + r'\{[^}]*tier="' + tier + r'"\} (\S+)$', text, re.M)
    check(m is not None, f"{name} for tier {tier} in /metrics")
    return float(m.group(1))


def run_turns(server, conversations, turns, first_turn=0):
    """Round-robin turns; returns per turn the (prompt_tokens, cached_tokens) of every conversation."""
    results = []
    for turn in range(first_turn, first_turn + turns):
        usage_of_turn = []
        for i, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"Turn {turn} of user {i}: fix bug {turn * 7 + i}."})
            reply, usage = chat(server, messages)
            messages.append({"role": "assistant", "content": reply})
            usage_of_turn.append(usage)
        results.append(usage_of_turn)
    return results


def main():
    tmp = tempfile.mkdtemp(prefix="ellm-e2e-sessions-")
    session_dir = os.path.join(tmp, "sessions")
    flags = ("--session-dir", session_dir, "--session-memory", "64k", "--shutdown-grace", "5")
    try:
        conversations = [[{"role": "system", "content": SYSTEM}] for _ in range(5)]
        with Server(TINY, *flags, api_key=KEY, sequence_length=2048) as server:
            results = run_turns(server, conversations, 3)
            for turn, usages in enumerate(results):
                for i, usage in enumerate(usages):
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
                    if turn == 0 and i > 0:
                        check(cached >= 200, f"conversation {i} reuses the shared system prompt: {usage}")
                    if turn > 0:
                        check(cached >= usage["prompt_tokens"] - 40, f"turn {turn} conversation {i}: {usage}")
            status, text = server.get("/metrics")
            check(metric(text, "ellm:session_hits_total", "hot") > 0, "hot hits")
            # 5 conversations on 2 slots with 64 KiB of RAM: sessions went through disk.
            check(metric(text, "ellm:session_hits_total", "disk") > 0, "disk hits:\n" + text)
            check(metric(text, "ellm:session_stored_bytes_total", "disk") > 0, "bytes written to disk")
            # The admin route is behind the API key.
            status, body = server.request("GET", "/v1/sessions", headers={"Authorization": "Bearer wrong"})
            check(status == 401, f"/v1/sessions without the key: {status}")
            status, body = server.get("/v1/sessions")
            check(status == 200 and len(body["data"]) >= 5, f"/v1/sessions lists them: {body}")
            check({s["tier"] for s in body["data"]} >= {"hot", "disk"}, f"tiers listed: {body}")
            # Several users at once: output is unchanged by the cache (greedy, same as a fresh
            # conversation computed with the cache off for it).
            errors = []

            def agent(i):
                try:
                    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"parallel {i}"}]
                    first, _ = chat(server, messages)
                    again, usage = chat(server, messages)
                    if first != again or usage["prompt_tokens_details"]["cached_tokens"] < 100:
                        errors.append((i, first, again, usage))
                except SystemExit:
                    errors.append((i, "failed"))
            threads = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            check(not errors, f"parallel agents: {errors}")
            check(server.stop() == 0, "clean exit on SIGTERM")
        files = [f for f in os.listdir(session_dir) if f.endswith(".kv")]
        check(len(files) >= 5, f"SIGTERM wrote the sessions: {files}")

        # A file from another model in the same directory is skipped with a log line.
        with Server(TINY_MOE, *flags, api_key=KEY, sequence_length=2048) as other:
            _, usage = chat(other, conversations[0] + [{"role": "user", "content": "hi"}])
            check(usage["prompt_tokens_details"]["cached_tokens"] == 0, f"no foreign KV: {usage}")
            other.stop()
            log = other.proc.stderr.read()
            check("another model" in log, "the foreign files are named in the log")

        # Restart: the first turn of every conversation is served from disk.
        with Server(TINY, *flags, api_key=KEY, sequence_length=2048) as server:
            results = run_turns(server, conversations, 1, first_turn=3)
            for i, usage in enumerate(results[0]):
                check(usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 40,
                      f"after the restart, conversation {i}: {usage}")
            status, text = server.get("/metrics")
            check(metric(text, "ellm:session_hits_total", "disk") >= 5, "restored from disk after the restart")
            # Dropping them all.
            status, body = server.request("DELETE", "/v1/sessions")
            check(status == 200 and body["dropped"] >= 5, f"DELETE /v1/sessions: {body}")
            _, usage = chat(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "new"}])
            check(usage["prompt_tokens_details"]["cached_tokens"] == 0, f"nothing left to reuse: {usage}")
        # Two replicas on one directory: a conversation moved from one to the other reads its KV
        # from the store. With no RAM tier, a session leaving its slot goes straight to disk.
        shared = ("--session-dir", os.path.join(tmp, "shared"), "--session-memory", "0", "--batch-size", "1")
        with Server(TINY, *shared, sequence_length=2048) as a, Server(TINY, *shared, sequence_length=2048) as b:
            moved = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "start on replica a"}]
            reply, _ = chat(a, moved)
            moved.append({"role": "assistant", "content": reply})
            chat(a, [{"role": "user", "content": "another user takes replica a's only slot " * 20}])
            moved.append({"role": "user", "content": "go on, on replica b"})
            _, usage = chat(b, moved)
            check(usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 40,
                  f"replica b restored replica a's session: {usage}")
            check(metric(b.get("/metrics")[1], "ellm:session_hits_total", "disk") >= 1, "from disk")
        print("1 passed, 0 failed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
