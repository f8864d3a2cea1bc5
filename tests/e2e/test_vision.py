"""Images through the real server (issue 40), on tiny-qwen35-vl against shared/golden/tiny-qwen35-vl:
- every chat.json case tokenizes (/tokenize with its messages) to the reference prompt ids exactly,
  image pads widened; answers with prompt_tokens = len(prompt_ids); reproduces the reference's
  greedy tokens over its safe prefix (as text);
- the same images as Anthropic image blocks (also inside a tool_result) and Responses input_image
  parts (also inside a function_call_output) give the chat prompt's token count;
- a screenshot streams in all three APIs;
- a resent conversation reuses its cache without encoding its images again; a changed screenshot
  is encoded and the cache is used only up to it; a 5-turn computer-use loop (screenshot, tool
  call, new screenshot) encodes each new image once and serves >= 90% of each turn from the cache;
- three users with different screenshots at once get the answers each gets alone;
- bad images get a 400 naming the part: corrupt, unknown format, a URL, a file:// without the
  flag, too many image tokens (--max-image-tokens), and any image on a text-only model.
"""
import base64
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from server_harness import SHARED, Server, check  # noqa: E402

NAME = "tiny-qwen35-vl"
GOLDEN = os.path.join(SHARED, "golden", NAME)
MODEL = os.path.join(SHARED, "models", NAME)


def image_uri(file):
    data = open(os.path.join(GOLDEN, "images", file), "rb").read()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def metric(s, name):
    status, text = s.get("/metrics")
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def rows_made(s):
    """Images whose tower rows a prefill needed: from the tower, or from the image cache for a
    screenshot seen before."""
    return metric(s, "ellm:images_encoded_total") + metric(s, "ellm:image_cache_hits_total")


def golden_cases(s):
    golden = json.load(open(os.path.join(GOLDEN, "chat.json")))
    checked = 0
    for case in golden["cases"]:
        what = case["name"]
        request = dict(case["request"], session_cache=False)
        status, tok = s.post("/tokenize", {k: v for k, v in request.items() if k in ("messages", "chat_template_kwargs", "tools")})
        check(status == 200, f"{what}: tokenize {status} {tok}")
        check(tok["tokens"] == case["prompt_ids"], f"{what}: prompt ids differ from the reference")
        status, r = s.post("/v1/chat/completions", dict(request, max_tokens=len(case["completion_ids"])))
        check(status == 200, f"{what}: {status} {r}")
        check(r["usage"]["prompt_tokens"] == len(case["prompt_ids"]), f"{what}: prompt_tokens {r['usage']}")
        message = r["choices"][0]["message"]
        text = (message.get("reasoning_content") or "") + (message.get("content") or "")
        status, d = s.post("/detokenize", {"tokens": case["completion_ids"][:case["safe_prefix"]]})
        # The reply's leading whitespace is the parser's to drop (after </think>).
        expected = d["prompt"].rstrip("\ufffd").lstrip()
        check(text.lstrip().startswith(expected), f"{what}: {text!r} does not start with the reference's {expected!r}")
        checked += case["safe_prefix"]
    check(checked > 0, "no safe token checked")
    print(f"ok: {len(golden['cases'])} golden image cases, {checked} safe tokens reproduced")
    return golden


def other_apis(s, golden):
    a, c = image_uri("a_64x96.png"), image_uri("c_320x180.png")
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": a}},
                                         {"type": "text", "text": "What is this?"}]}]
    status, r = s.post("/v1/chat/completions", {"messages": chat, "max_tokens": 1})
    check(status == 200, f"chat: {status} {r}")
    chat_tokens = r["usage"]["prompt_tokens"]
    source = {"type": "base64", "media_type": "image/png", "data": a.split(",", 1)[1]}
    status, m = s.post("/v1/messages", {"max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]}]})
    check(status == 200, f"messages: {status} {m}")
    usage = m["usage"]
    got = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    check(got == chat_tokens, f"messages: {got} input tokens, chat {chat_tokens}")
    status, n = s.post("/v1/messages/count_tokens", {"messages": [
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]}]})
    check(status == 200 and n["input_tokens"] == chat_tokens, f"count_tokens: {status} {n}")
    status, resp = s.post("/v1/responses", {"max_output_tokens": 1, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": a}, {"type": "input_text", "text": "What is this?"}]}]})
    check(status == 200, f"responses: {status} {resp}")
    check(resp["usage"]["input_tokens"] == chat_tokens, f"responses: {resp['usage']} vs chat {chat_tokens}")

    # A screenshot a tool returns: inside a tool_result / function_call_output.
    tools = [{"name": "screenshot", "description": "Takes a screenshot", "input_schema": {"type": "object", "properties": {}}}]
    screenshot = {"type": "base64", "media_type": "image/png", "data": c.split(",", 1)[1]}
    status, m = s.post("/v1/messages", {"max_tokens": 1, "tools": tools, "messages": [
        {"role": "user", "content": "Look at the screen."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "done"}, {"type": "image", "source": screenshot}]}]}]})
    check(status == 200, f"messages tool_result image: {status} {m}")
    with_image = m["usage"]["input_tokens"] + m["usage"].get("cache_read_input_tokens", 0)
    status, resp = s.post("/v1/responses", {"max_output_tokens": 1, "tools": [
        {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}], "input": [
        {"role": "user", "content": "Look at the screen."},
        {"type": "function_call", "call_id": "t1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "t1",
         "output": [{"type": "input_text", "text": "done"}, {"type": "input_image", "image_url": c}]}]})
    check(status == 200, f"responses function_call_output image: {status} {resp}")
    # c is 28 tokens: both carry the image (the text around it differs by API, not by 27 tokens).
    check(with_image > 28 and resp["usage"]["input_tokens"] > 28, f"tool images: {with_image}, {resp['usage']}")
    print(f"ok: Messages and Responses images ({chat_tokens} prompt tokens as chat)")


def sessions(s):
    a, b, d = image_uri("a_64x96.png"), image_uri("b_100x70.png"), image_uri("d_80x48.png")

    def conversation(second):
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": a}}, {"type": "text", "text": "First."}]},
                {"role": "assistant", "content": "Seen."},
                {"role": "user", "content": [{"type": "text", "text": "And now?"}, {"type": "image_url", "image_url": {"url": second}}]}]

    made = rows_made(s)
    status, r1 = s.post("/v1/chat/completions", {"messages": conversation(b), "max_tokens": 2, "temperature": 0})
    check(status == 200, f"first: {r1}")
    check(rows_made(s) == made + 2, "both images' rows made the first time")
    status, r2 = s.post("/v1/chat/completions", {"messages": conversation(b), "max_tokens": 2, "temperature": 0})
    cached = r2["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    check(status == 200 and cached > 0, f"resent: cached {cached} {r2['usage']}")
    check(rows_made(s) == made + 2, "a resent conversation needs no image's rows again")
    check(r2["choices"][0]["message"] == r1["choices"][0]["message"], "resent: same greedy answer")
    # The second screenshot changed: the cache holds up to it at most, and only it is encoded.
    status, r3 = s.post("/v1/chat/completions", {"messages": conversation(d), "max_tokens": 2, "temperature": 0})
    cached3 = r3["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    check(status == 200, f"changed: {r3}")
    check(rows_made(s) == made + 3, "only the changed screenshot's rows are made")
    check(cached3 < cached and cached3 < r3["usage"]["prompt_tokens"] - 4,
          f"changed screenshot: cached {cached3} of {r3['usage']['prompt_tokens']} (resent: {cached})")
    check(metric(s, "ellm:images_total") >= 6, "images counted")
    # Screenshot b again, in a conversation that shares no KV with the first (a new start): its
    # tokens are prefilled anew, and its rows come from the image cache, not the tower.
    hits, encoded = metric(s, "ellm:image_cache_hits_total"), metric(s, "ellm:images_encoded_total")
    other = [{"role": "user", "content": [{"type": "text", "text": "A new task. Look:"}, {"type": "image_url", "image_url": {"url": b}}]}]
    status, r4 = s.post("/v1/chat/completions", {"messages": other, "max_tokens": 2, "temperature": 0})
    check(status == 200, f"new conversation: {r4}")
    check(metric(s, "ellm:images_encoded_total") == encoded, "a screenshot seen before is not encoded again")
    check(metric(s, "ellm:image_cache_hits_total") == hits + 1, "its rows came from the image cache")
    check(metric(s, "ellm:image_cache_bytes") > 0, "the image cache's bytes are reported")
    print(f"ok: sessions (resent: {cached} cached, no image encoded; changed screenshot: {cached3} cached; "
          f"a seen screenshot in a new conversation: from the image cache)")


def streams(s):
    """A screenshot in a streamed request of each API."""
    c = image_uri("c_320x180.png")
    chunks, done = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": c}}, {"type": "text", "text": "Describe."}]}], "max_tokens": 4,
        "stream_options": {"include_usage": True}})
    usage = [x["usage"] for x in chunks if x.get("usage")]
    check(done and usage and usage[-1]["prompt_tokens"] > 28, f"chat stream: {chunks[-2:]}")
    source = {"type": "base64", "media_type": "image/png", "data": c.split(",", 1)[1]}
    events, _ = s.stream("/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "Describe."}]}]})
    kinds = [e["type"] for e in events]
    check(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"messages stream: {kinds}")
    check(events[0]["message"]["usage"]["input_tokens"] > 28, f"messages stream usage: {events[0]}")
    events, _ = s.stream("/v1/responses", {"max_output_tokens": 4, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": c}, {"type": "input_text", "text": "Describe."}]}]})
    done = [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
    check(done and done[-1]["response"]["usage"]["input_tokens"] > 28, f"responses stream: {[e['type'] for e in events]}")
    print("ok: a screenshot streams in all three APIs")


def computer_use_loop(s):
    """Screenshot, tool call, new screenshot, for 5 turns: rows are made once per new image and
    >= 90% of each later turn's prompt comes from the cache."""
    system = "You operate a desktop computer through tools. " + " ".join(
        f"Rule {i}: check the screen before step {i}." for i in range(100))
    tools = [{"type": "function", "function": {"name": "click", "description": "Clicks at x, y and returns a screenshot.",
              "parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}}}]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Open the settings and press OK."}]
    shares = []
    for turn, file in enumerate(["c_320x180.png", "a_64x96.png", "b_100x70.png", "d_80x48.png", "e_40x36.png"]):
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "click", "arguments": json.dumps({"x": turn, "y": 2 * turn})}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": [{"type": "image_url", "image_url": {"url": image_uri(file)}}]}]
        made = rows_made(s)
        status, r = s.post("/v1/chat/completions", {"messages": messages, "tools": tools, "max_tokens": 2, "temperature": 0})
        check(status == 200, f"turn {turn}: {status} {r}")
        check(rows_made(s) == made + 1, f"turn {turn}: only the new screenshot's rows were made")
        usage = r["usage"]
        share = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0) / usage["prompt_tokens"]
        shares.append(round(share, 3))
        if turn > 0:
            check(share >= 0.9, f"turn {turn}: {share:.1%} of the prompt from the cache ({usage})")
    print(f"ok: computer-use loop, 5 turns, one encode each, cached shares {shares}")


def concurrent_users(s):
    """Three users with different screenshots at once (two slots: one waits) get the answers each
    gets alone: no image leaks into another request."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(file):
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_uri(file)}},
                                                          {"type": "text", "text": "What changed?"}]}],
                "max_tokens": 6, "temperature": 0, "session_cache": False}
        status, r = s.post("/v1/chat/completions", body)
        check(status == 200, f"{file}: {status} {r}")
        return r["choices"][0]["message"]
    files = ["c_320x180.png", "a_64x96.png", "b_100x70.png"]
    alone = [ask(f) for f in files]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(ask, files))
    check(together == alone, f"answers at once differ from alone: {together} vs {alone}")
    check(len({json.dumps(a) for a in alone}) > 1, "different screenshots should not all give one answer")
    print("ok: three users with different screenshots at once get their own answers")


def bad_images(s):
    def chat_with(url):
        return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "?"}]}], "max_tokens": 1}
    png = open(os.path.join(GOLDEN, "images", "a_64x96.png"), "rb").read()
    cases = {
        "corrupt": "data:image/png;base64," + base64.b64encode(png[:200]).decode(),
        "unknown format": "data:image/gif;base64," + base64.b64encode(b"GIF89a" + b"\0" * 40).decode(),
        "bad base64": "data:image/png;base64,@@@@",
        "url": "https://example.com/cat.png",
        "file without the flag": "file:///etc/passwd",
    }
    for what, url in cases.items():
        status, r = s.post("/v1/chat/completions", chat_with(url))
        check(status == 400 and "messages[0].content[0]" in r["error"]["message"], f"{what}: {status} {r}")
    status, r = s.post("/v1/chat/completions", chat_with(image_uri("c_320x180.png")))
    check(status == 400 and "--max-image-tokens" in r["error"]["message"], f"too many image tokens: {status} {r}")
    # (with a repetition penalty: it runs over the prompt, whose image pads are not tokens)
    status, r = s.post("/v1/chat/completions", dict(chat_with(image_uri("a_64x96.png")), repetition_penalty=1.3))
    check(status == 200, f"a good image after the bad ones: {status} {r}")
    print("ok: bad images refused with 400")


def main():
    with Server(MODEL, "--max-image-tokens", "20", sequence_length=1024) as s:
        bad_images(s)  # the 28-token screenshot exceeds the limit of 20
    with Server(MODEL, sequence_length=4096) as s:
        golden = golden_cases(s)
        other_apis(s, golden)
        streams(s)
        sessions(s)
        computer_use_loop(s)
        concurrent_users(s)
    # Qwen3.8-Flash-Next carries the same tower (its tiny model ships Qwen3's template; the
    # Qwen3.8 one renders images): its screenshots run the same loop.
    qwen38_template = os.path.join(SHARED, "text", "qwen35", "chat_template_qwen38.jinja")
    with Server(os.path.join(SHARED, "models", "tiny-qwen4exp"), "--chat-template", qwen38_template,
                sequence_length=4096) as s:
        streams(s)
        computer_use_loop(s)
    print("ok: Qwen3.8-Flash-Next (tiny-qwen4exp) takes screenshots")
    with Server(os.path.join(SHARED, "models", "tiny-qwen3"), sequence_length=512) as s:
        status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_uri("a_64x96.png")}}]}], "max_tokens": 1})
        check(status == 400 and "text only" in r["error"]["message"], f"text-only model: {status} {r}")
    print("ok: a text-only model refuses images")


if __name__ == "__main__":
    main()
