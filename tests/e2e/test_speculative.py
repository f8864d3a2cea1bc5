"""Speculative decoding through the real server: --speculative ngram with a scripted "copy" of
the prompt proposes and keeps tokens (counted per proposer in /metrics) and the output is the
script; --speculative draft:PATH with the model as its own draft gives greedy output equal to
the same requests without speculation, every proposal kept; requests choose their proposer
within what the server has, and anything else is a 400 naming the field."""
import re
import subprocess

from server_harness import BIN, TINY, Server, check


def counter(s, name, proposer):
    _, text = s.get("/metrics")
    m = re.search(r"^ellm:%s\{[^}]*proposer=\"%s\"\} (\S+)$" % (name, proposer), text, re.M)
    check(m is not None, f"/metrics has {name} for {proposer}")
    return float(m.group(1))


def complete(s, prompt, **kw):
    body = dict(prompt=prompt, max_tokens=40, temperature=0, ignore_eos=True)
    body.update(kw)
    status, r = s.post("/v1/completions", body)
    check(status == 200, f"status {status}: {r}")
    return r


def main():
    file = [2000 + (i * 37) % 3000 for i in range(60)]
    script = file[:20] + [4242] + file[21:50]
    with Server(TINY, "--speculative", "ngram", "--num-speculative-tokens", "4",
                "--scripted-output", ",".join(map(str, script))) as s:
        r = complete(s, [100, 101] + file + [102], max_tokens=len(script) + 5)
        _, detok = s.post("/detokenize", {"tokens": script})
        check(r["choices"][0]["text"] == detok["prompt"], "the output is the script")
        check(r["usage"]["completion_tokens"] == len(script), f"usage stays OpenAI's: {r['usage']}")
        kept = counter(s, "spec_decode_num_accepted_tokens_total", "ngram")
        proposed = counter(s, "spec_decode_num_draft_tokens_total", "ngram")
        check(len(script) / 2 < kept <= proposed, f"proposals kept: {kept} of {proposed}")
        check(counter(s, "spec_decode_num_drafts_total", "ngram") > 0, "checks counted")

        for bad, field in [({"speculative": "mtp"}, "speculative"), ({"speculative": "eagle"}, "speculative"),
                           ({"num_speculative_tokens": 9}, "num_speculative_tokens"),
                           ({"num_speculative_tokens": -1}, "num_speculative_tokens")]:
            status, err = s.post("/v1/completions", dict(prompt=[1, 2, 3], max_tokens=2, **bad))
            check(status == 400 and err["error"]["param"] == field, f"{bad}: {status} {err}")

    with Server(TINY, "--speculative", "draft:" + TINY, "--num-speculative-tokens", "3") as s:
        prompt = [3000 + (i * 11) % 900 for i in range(30)]
        plain = complete(s, prompt, speculative="none")["choices"][0]["text"]
        drafted = complete(s, prompt)["choices"][0]["text"]
        looked_up = complete(s, prompt, speculative="ngram")["choices"][0]["text"]
        check(drafted == plain and looked_up == plain, f"greedy output unchanged: {plain!r} {drafted!r} {looked_up!r}")
        kept = counter(s, "spec_decode_num_accepted_tokens_total", "draft")
        proposed = counter(s, "spec_decode_num_draft_tokens_total", "draft")
        check(kept == proposed > 0, f"the model as its own draft: every proposal kept ({kept} of {proposed})")

    run = subprocess.run([BIN, "serve", "--model-path", TINY, "--host", "127.0.0.1", "--port", "0",
                          "--speculative", "mtp"], capture_output=True, text=True, timeout=120)
    check(run.returncode != 0 and "multi-token-prediction head" in run.stderr,
          f"mtp on a model without a head: {run.returncode} {run.stderr[-300:]}")
    print("ok")


if __name__ == "__main__":
    main()
